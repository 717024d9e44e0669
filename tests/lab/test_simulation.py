"""The scale-out simulation (bench/scaleout) on its fake clock: queueing results it must reproduce, and that it drives
the real scheduler (rendezvous homes, in-flight limits). Simulated time only; no wall-clock asserts."""
from __future__ import annotations

import random

import pytest

from bench.scaleout.costs import Costs, Deck, spread_of, stalls_of
from bench.scaleout.resources import Resource, SharedCores
from bench.scaleout.simulation import Cluster, Simulation, sweep
from delta_ray.scheduler import home_worker, worker_name

# Everything free except what a test sets: results then follow from arithmetic.
FREE = Costs(handoff_ms=0.0, orch_session_ms=0.0, orch_chunk_ms=0.0, channel_client_ms=0.0, ray_call_ms=0.0,
             put_ms_per_mchar=0.0, plan_ms_per_mchar=0.0, assemble_ms_per_mchar=0.0, channel_rtt_ms=0.0,
             ray_rtt_ms=0.0, worker_call_ms=0.0, turn_ms_100k=1.0, turn_ms_1m=1.0, encode_ms_per_mchar=0.0)


def closed_turns(cluster: Cluster, costs: Costs, callers: int, until_ms: float, warmup_ms: float = 100.0):
    """``callers`` closed-loop callers, each on its own 100K session: the finished simulation and its result."""
    sim = Simulation(cluster, costs)
    sim.add_sessions(callers, (100_000, 100_000))
    sim.closed_turns(callers)
    return sim, sim.run(until_ms, warmup_ms)


def test_resource_is_fifo_and_counts_busy_time():
    sim = Simulation(Cluster(), FREE)
    r = Resource(sim, "r", 1)
    order = []
    for i in range(3):
        sim.hold([r], 2.0, lambda i=i: order.append((i, sim.now)))
    sim.run(100.0)
    assert order == [(0, 2.0), (1, 4.0), (2, 6.0)]
    assert r.utilization(0.0, 12.0) == pytest.approx(0.5)


def test_cores_are_time_shared_among_what_is_runnable():
    # One core: a 5 ms job from 0 and a 0.1 ms one from 1 ms share it half and half while both run,
    # so the short one ends at 1.2 ms (first come first served: 5.1) and stretches the long one to
    # 5.1. Two cores, three 2 ms jobs: each runs at 2/3 of a core, all end at 3 ms, both cores busy.
    sim = Simulation(Cluster(), FREE)
    one = SharedCores(sim, "one", 1)
    ends = {}
    one.run(5.0, lambda: ends.setdefault("long", sim.now))
    sim.after(1.0, lambda: one.run(0.1, lambda: ends.setdefault("short", sim.now)))
    sim.run(100.0)
    assert ends == {"short": pytest.approx(1.2), "long": pytest.approx(5.1)}
    assert one.busy_ms() == pytest.approx(5.1)
    sim = Simulation(Cluster(), FREE)
    two, done = SharedCores(sim, "two", 2), []
    for _ in range(3):
        two.run(2.0, lambda: done.append(sim.now))
    sim.run(100.0)
    assert done == [pytest.approx(3.0)] * 3 and two.utilization(0.0, 3.0) == pytest.approx(1.0)
    with pytest.raises(TypeError):
        two.acquire(lambda: None)
    with pytest.raises(ValueError):  # a step's thread runs on one node
        sim.hold([two, SharedCores(sim, "other node", 2)], 1.0, lambda: None)


def test_a_turn_shares_its_core_with_a_chunk_encode_rather_than_wait_for_it():
    # One core: a 10 ms chunk encode from 0 and a 1 ms turn arriving at 1 ms. The OS shares the core,
    # so the turn takes 2 ms (first come first served held it 10) and the text 11.
    costs = Costs(**{**FREE.__dict__, "encode_ms_per_mchar": 10.0})
    sim = Simulation(Cluster(nodes=1, cores_per_node=1, workers=1, task_slots=1), costs)
    sim.add_sessions(1, (100_000, 100_000))
    sim.text(1_000_000)
    sim.after(1.0, lambda: sim.turn(sim.sessions[0]))
    res = sim.run(100.0)
    assert res.latencies["turn"] == [pytest.approx(2.0)] and res.latencies["text"] == [pytest.approx(11.0)]


def test_one_worker_closed_loop_runs_at_its_service_rate():
    # 1 worker, 1 ms a turn, nothing else costs: 4 callers complete 1,000 turns/s, each waiting 4 ms.
    _, res = closed_turns(Cluster(nodes=1, cores_per_node=4, workers=1, task_slots=1), FREE, 4, 1_100.0)
    assert res.throughput("turn") == pytest.approx(1000, rel=0.01)
    assert res.percentile("turn", 99) == pytest.approx(4.0)
    assert res.utilization["session worker (busiest)"] == pytest.approx(1.0, abs=0.01)
    assert res.bottleneck()[0] == "session worker (busiest)"


def test_a_workers_slot_is_refilled_before_its_caller_is_handed_the_answer():
    # As CallRunner._on_done: the answer is merged, the worker's slot freed and its next call sent,
    # and only then does the caller's thread take the answer (its half of the hand-off). 1 ms a turn,
    # 0.6 ms of hand-off a call (0.6 ms of the loop per turn): the worker stays the bottleneck at
    # 1,000 turns/s; with the hand-back before the slot is freed it would idle 0.3 ms a turn (769/s).
    costs = Costs(**{**FREE.__dict__, "handoff_ms": 0.6})
    _, res = closed_turns(Cluster(nodes=1, cores_per_node=4, workers=1, task_slots=1), costs, 4, 1_100.0)
    assert res.throughput("turn") == pytest.approx(1000, rel=0.02)
    assert res.bottleneck()[0] == "session worker (busiest)"


def test_each_closed_loop_caller_keeps_its_own_session():
    # 4 callers on 4 sessions: every session advances every turn of its caller (a late-bound loop
    # variable once made every caller's second turn continue the last caller's session instead).
    sim, _ = closed_turns(Cluster(nodes=1, cores_per_node=8, workers=8, task_slots=1), FREE, 4, 100.0, 0.0)
    grown = sorted((s.context - 100_000) // 1300 for s in sim.sessions)
    assert grown[0] >= 20 and grown[-1] - grown[0] <= 60  # 1 ms turns, <= 4 sessions per worker


def test_the_driver_loop_is_one_server_whatever_the_cores():
    # 0.5 ms of orchestrator per call, free workers: at most 2,000 calls/s on 1 or 64 cores.
    costs = Costs(**{**FREE.__dict__, "orch_session_ms": 0.5, "turn_ms_100k": 0.0, "turn_ms_1m": 0.0})
    for cores in (2, 64):
        _, res = closed_turns(Cluster(nodes=1, cores_per_node=cores), costs, 64, 2_100.0)
        assert res.throughput("turn") == pytest.approx(2000, rel=0.01)
        assert res.bottleneck()[0] == "driver loop (GIL)"


def test_growth_with_workers_is_charged_per_call():
    costs = Costs(**{**FREE.__dict__, "orch_session_ms": 0.1, "orch_session_ms_per_worker": 0.01,
                     "turn_ms_100k": 0.0, "turn_ms_1m": 0.0})
    rates = []
    for workers in (10, 40):  # 0.2 ms and 0.5 ms a call
        rates.append(closed_turns(Cluster(nodes=1, cores_per_node=64, workers=workers), costs, 64, 2_100.0)[1]
                     .throughput("turn"))
    assert rates[0] == pytest.approx(5000, rel=0.01) and rates[1] == pytest.approx(2000, rel=0.01)


def test_turns_run_on_their_rendezvous_home():
    sim = Simulation(Cluster(nodes=2, cores_per_node=4), FREE)
    sim.add_sessions(32)
    ran = {}
    disp = sim.dispatchers[0]
    submit = disp.submit

    def spy(kind, n, **kw):
        task = submit(kind, n, **kw)
        launch = task.payload

        def wrapped_launch(wid, t):
            ran[t.session_key] = wid
            launch(wid, t)
        object.__setattr__(task, "payload", wrapped_launch)
        return task
    disp.submit = spy
    for s in sim.sessions:
        sim.turn(s)
    sim.run(1_000.0)
    assert len(ran) == 32
    assert all(wid == home_worker(key, sim.worker_ids) for key, wid in ran.items())


def test_a_session_runs_one_turn_at_a_time():
    sim = Simulation(Cluster(nodes=1, cores_per_node=8), FREE)
    sim.add_sessions(1, (100_000, 100_000))
    s = sim.sessions[0]
    for _ in range(5):
        sim.turn(s)
    res = sim.run(100.0)
    assert sorted(res.latencies["turn"]) == pytest.approx([1.0, 2.0, 3.0, 4.0, 5.0])
    assert s.context == 100_000 + 5 * 1300


def test_chunks_of_a_text_run_in_parallel_up_to_the_task_slots():
    # 1M characters at 16 ms per 1M: 16 chunks of 62,500 on 16 slots take 1 ms, 4 chunks on 4 slots 4 ms.
    costs = Costs(**{**FREE.__dict__, "encode_ms_per_mchar": 16.0})
    for slots, want in ((16, 1.0), (4, 4.0)):
        sim = Simulation(Cluster(nodes=1, cores_per_node=16, task_slots=slots, max_chunks=16), costs)
        sim.text(1_000_000)
        res = sim.run(100.0)
        assert sim.chunk_count(1_000_000) == min(16, slots)  # the planner's k: one chunk per slot here
        assert res.completed == {"text": 1} and res.latencies["text"][0] == pytest.approx(want)


def test_a_chunks_wait_and_round_trip_are_recorded_as_the_pool_records_them():
    # One slot, two 1M texts at once, 10 ms an encode: the first chunk runs at once, the second waits
    # for the slot 10 ms and then runs 10 (CallRunner's wait and service, as Ray's metrics get them).
    costs = Costs(**{**FREE.__dict__, "encode_ms_per_mchar": 10.0})
    sim = Simulation(Cluster(nodes=1, cores_per_node=2, workers=1, task_slots=1), costs)
    sim.text(1_000_000)
    sim.text(1_000_000)
    sim.run(100.0)
    assert sim.chunk_times == [(pytest.approx(0.0), pytest.approx(10.0)), (pytest.approx(10.0), pytest.approx(10.0))]


def test_crossing_nodes_uses_the_network():
    costs = Costs(**{**FREE.__dict__, "encode_ms_per_mchar": 0.0, "net_mb_per_ms": 1.0})
    one = Simulation(Cluster(nodes=1, cores_per_node=4, task_slots=4), costs)
    one.text(1_000_000)
    two = Simulation(Cluster(nodes=2, cores_per_node=2, task_slots=4), costs)
    two.text(1_000_000)
    a, b = one.run(100.0), two.run(100.0)
    assert a.latencies["text"][0] == pytest.approx(0.0)
    assert b.latencies["text"][0] > 0 and b.utilization["NIC (busiest)"] > 0


def test_open_loop_sweep_saturates_at_capacity():
    res = sweep(Cluster(nodes=1, cores_per_node=2, workers=1), FREE,
                lambda sim, rate, until: (sim.add_sessions(16), sim.chat(rate, until)),
                [200.0, 4000.0], duration_ms=2_000.0, warmup_ms=200.0)
    (_, low), (_, high) = res
    assert low.throughput() == pytest.approx(200, rel=0.15)
    assert high.throughput() == pytest.approx(1000, rel=0.02)  # one worker, 1 ms a turn
    assert high.bottleneck()[0] == "session worker (busiest)"


def test_background_work_of_a_calling_process_takes_its_share_of_the_loop():
    # 0.5 ms a call and half of every second spent on other work: 1,000 calls/s instead of 2,000.
    costs = Costs(**{**FREE.__dict__, "orch_session_ms": 0.5, "turn_ms_100k": 0.0, "turn_ms_1m": 0.0,
                     "driver_background_ms_per_s": 500.0})
    sim = Simulation(Cluster(nodes=1, cores_per_node=4), costs)
    sim.add_sessions(16, (100_000, 100_000))
    sim.closed_turns(16)
    res = sim.run(1_100.0, 100.0)
    assert res.throughput("turn") == pytest.approx(1000, rel=0.03)


def test_other_jobs_on_a_node_take_their_share_of_its_cores():
    # Stateless texts bound by 2 cores (16 ms of encode per 1M: 2 cores serve 125 texts/s); other
    # jobs taking one core's worth per second leave half of that.
    costs = Costs(**{**FREE.__dict__, "encode_ms_per_mchar": 16.0})
    rates = []
    for other in (0.0, 1000.0):
        sim = Simulation(Cluster(nodes=1, cores_per_node=2, task_slots=2, max_chunks=2),
                         Costs(**{**costs.__dict__, "node_background_ms_per_s": other}))
        sim.closed_texts(2, 1_000_000)
        rates.append(sim.run(2_200.0, 200.0).throughput("text"))
    assert rates[0] == pytest.approx(125, rel=0.03)
    assert rates[1] == pytest.approx(62.5, rel=0.1)


def test_a_measured_spread_gives_the_simulated_p99_its_tail():
    # One worker, one caller, 1 ms a turn: without spread every turn takes 1 ms; with a spread of
    # 99 calls of 1 and one of 5 (a slow call in a hundred) the P99 reaches the slow calls, and the
    # mean stays the cost (the factors are over the samples' mean, 1.04).
    flat = Simulation(Cluster(nodes=1, cores_per_node=2, workers=1, task_slots=1), FREE)
    spread = spread_of([1.0] * 99 + [5.0], points=100)
    assert spread.count(5.0 / 1.04) == 1 and spread.count(1.0 / 1.04) == 99
    assert sum(spread) / len(spread) == pytest.approx(1.0)
    tail = Simulation(Cluster(nodes=1, cores_per_node=2, workers=1, task_slots=1),
                      Costs(**{**FREE.__dict__, "spread": spread}))
    results = []
    for sim in (flat, tail):
        sim.add_sessions(1, (100_000, 100_000))
        sim.closed_turns(1)
        results.append(sim.run(20_100.0, 100.0))
    assert results[0].percentile("turn", 99) == pytest.approx(1.0)
    assert results[1].percentile("turn", 50) == pytest.approx(1.0 / 1.04)
    assert results[1].percentile("turn", 99.5) == pytest.approx(5.0 / 1.04)
    # the mean service time is the cost, 1 ms: the tail moves the P99, not the throughput
    assert results[1].throughput("turn") == pytest.approx(1000, rel=0.03)


def test_the_turns_spread_shapes_the_turn_only():
    # A spread measured on worker turns (one call in a hundred 50x the rest: a rare large rope copy)
    # is the turn's own tail: a stateless text's steps (plan, launches, encodes, assembly) take their
    # means, so its latencies are the flat model's; drawn on the encodes too, its P99 would be ~50x.
    costs = Costs(**{**FREE.__dict__, "encode_ms_per_mchar": 4.0, "ray_call_ms": 0.1, "chunk_ms": 0.2})
    spread = spread_of([1.0] * 99 + [50.0], points=100)
    p99 = []
    for c in (costs, Costs(**{**costs.__dict__, "spread": spread})):
        sim = Simulation(Cluster(nodes=1, cores_per_node=2, task_slots=2, max_chunks=2), c)
        sim.closed_texts(1, 1_000_000)
        p99.append(sim.run(2_100.0, 100.0).percentile("text", 99))
    assert p99[1] == pytest.approx(p99[0])
    # one driver: the second chunk starts after both launches (0.2) and runs 2 ms; its result (0.2)
    # waits 0.1 for the first chunk's, which started at 2.1
    assert p99[0] == pytest.approx(0.2 + 2.0 + 0.1 + 0.2, rel=0.01)


def test_a_turns_cost_is_flat_outside_the_measured_contexts():
    # Measured at 100K and 1M (here 1M the cheaper, as noise can make it): interpolated between,
    # never extrapolated (linearly, 5M characters would cost less than nothing).
    costs = Costs(turn_ms_100k=0.05, turn_ms_1m=0.03)
    assert costs.turn_ms(550_000) == pytest.approx(0.04)
    assert costs.turn_ms(5_000_000) == pytest.approx(0.03)
    assert costs.turn_ms(10_000) == pytest.approx(0.05)


def test_a_lone_calls_excess_is_its_stall_over_the_mean():
    # Steps are means, so a lone call's samples add only their excess over the mean (2 ms here), in
    # the calls' order (each pairs with its own round trip); unpaired samples are refused.
    loop, trip = stalls_of([5.0, 1.0, 1.0, 1.0], [0.0, 0.0, 0.0, 0.0])
    assert loop == (3.0, 0.0, 0.0, 0.0) and trip == (0.0, 0.0, 0.0, 0.0)
    assert stalls_of([], []) == ((), ())
    with pytest.raises(ValueError):
        stalls_of([1.0, 2.0], [0.5])


def test_a_deck_draws_each_measured_value_once_per_pass():
    # A sample with one rare large stall among 400: every 400 draws hold it exactly once (draws at
    # random hold it a number of times left to chance, and the simulated P99 with it).
    values = (0.0,) * 399 + (50.0,)
    deck = Deck(values, random.Random(7))
    for _ in range(25):
        drawn = [deck.draw() for _ in range(400)]
        assert sorted(drawn) == sorted(values)
    assert not Deck((), random.Random(0))


def test_a_simulated_tail_holds_its_rare_stalls_whatever_the_seed():
    # One caller, 1 ms turns, one stall of 20 ms in every 200 turns: each seed's 10 s run holds the
    # same number of stalls, so the share of turns over 10 ms is the measured one (0.5%) in every run
    # (with draws at random it was 0.39-0.61% over these five seeds).
    stall = (0.0,) * 199 + (20.0,)
    slow = []
    for seed in range(5):
        sim = Simulation(Cluster(nodes=1, cores_per_node=2, workers=1, task_slots=1),
                         Costs(**{**FREE.__dict__, "loop_stall": stall}), seed=seed)
        sim.add_sessions(1, (100_000, 100_000))
        sim.closed_turns(1)
        res = sim.run(10_000.0, 0.0)
        slow.append(sum(x > 10 for x in res.latencies["turn"]) / res.completed["turn"])
    assert max(slow) - min(slow) < 0.0003
    assert sum(slow) / len(slow) == pytest.approx(1 / 200, rel=0.1)


def test_a_text_stall_holds_its_chunks_slot_not_a_core():
    # One task slot, two callers, 1M texts of one chunk encoding in 2 ms: 500 texts/s. A 10 ms stall
    # per text (a lone text's excess: Ray slow to answer) keeps the slot 12 ms a text, so the two
    # callers share 83 texts/s, and the cores are busy only for the encodes (2 of every 12 ms).
    costs = Costs(**{**FREE.__dict__, "encode_ms_per_mchar": 2.0})
    cl = Cluster(nodes=1, cores_per_node=2, task_slots=1)
    rates = []
    for c in (costs, Costs(**{**costs.__dict__, "text_stall": (10.0,)})):
        sim = Simulation(cl, c)
        sim.closed_texts(2, 1_000_000)
        res = sim.run(3_100.0, 100.0)
        rates.append(res.throughput("text"))
    assert rates[0] == pytest.approx(500, rel=0.02)
    assert rates[1] == pytest.approx(1000 / 12, rel=0.02)
    assert res.utilization["node cores (busiest node)"] == pytest.approx(2 / 12 / 2, rel=0.05)


def test_a_texts_loop_stall_holds_its_callers_loop_not_its_chunks_slot():
    # Two task slots, two callers, 1M texts in two chunks of 1 ms: 1,000 texts/s. A lone text's
    # 10 ms excess outside its chunks (the calling process's own burst) holds the caller's loop:
    # one at a time, 100 texts/s; the same excess inside a chunk holds its slot: 12 slot-ms a
    # text on 2 slots, 167 texts/s. The loop's stall is not CPU.
    costs = Costs(**{**FREE.__dict__, "encode_ms_per_mchar": 2.0})
    cl = Cluster(nodes=1, cores_per_node=4, task_slots=2)
    rates = []
    for extra in ({}, {"text_loop_stall": (10.0,)}, {"text_stall": (10.0,)}):
        sim = Simulation(cl, Costs(**{**costs.__dict__, **extra}))
        sim.closed_texts(2, 1_000_000)
        res = sim.run(3_100.0, 100.0)
        rates.append(res.throughput("text"))
        if extra.get("text_loop_stall"):
            assert res.bottleneck()[0] == "driver loop (GIL)"
            assert sim.gil[0].busy_ms() - sim.stalled_ms == pytest.approx(0.0, abs=1e-6)
    assert rates[0] == pytest.approx(1000, rel=0.02)
    assert rates[1] == pytest.approx(100, rel=0.02)
    assert rates[2] == pytest.approx(1000 / 6, rel=0.02)


def test_a_loop_stall_holds_the_callers_loop_not_a_core():
    # 4 workers, 4 callers, 1 ms turns: 3,000 turns/s (two of the 4 sessions share a rendezvous home). A 3 ms stall of
    # the caller's loop per turn (its GIL held by a preempted thread) makes the loop the bottleneck: one stall at a
    # time, 333 turns/s, and the other callers queue behind it. It is not CPU: no core is held and the driver's work
    # (its loop's busy time less the stalls) stays 0.
    cl = Cluster(nodes=1, cores_per_node=4, workers=4, task_slots=4)
    _, free = closed_turns(cl, FREE, 4, 1_100.0)
    assert free.throughput("turn") == pytest.approx(3000, rel=0.02)
    sim, res = closed_turns(cl, Costs(**{**FREE.__dict__, "loop_stall": (3.0,)}), 4, 3_100.0)
    assert res.throughput("turn") == pytest.approx(1000 / 3, rel=0.02)
    assert res.bottleneck()[0] == "driver loop (GIL)"
    assert res.percentile("turn", 50) > 3 * 3.0  # queued behind the other callers' stalls
    assert sim.gil[0].busy_ms() - sim.stalled_ms == pytest.approx(0.0, abs=3.0)
    assert res.utilization["node cores (busiest node)"] < 0.1  # the turns' 1 ms on 4 cores, 333 a second


def test_a_trip_stall_holds_its_worker_not_the_loop_nor_a_core():
    # 2 workers on 4 cores, 4 callers split 2-2 over them ("v0".."v3"), 1 ms turns: 2,000 turns/s.
    # A 3 ms stall in each call's round trip (the worker slow to answer) holds that worker 4 ms a
    # turn: 250 turns/s each, 500 in all, where the same stall on the caller's loop serializes all
    # four callers (333/s). Neither is CPU: the cores see only the encodes, the loop nothing.
    cl = Cluster(nodes=1, cores_per_node=4, workers=2, task_slots=2)

    def run(costs):
        sim = Simulation(cl, costs)
        sim.add_sessions(4, (100_000, 100_000), keys=[f"v{i}" for i in range(4)])
        sim.closed_turns(4)
        return sim, sim.run(3_100.0, 100.0)
    _, free = run(FREE)
    assert free.throughput("turn") == pytest.approx(2000, rel=0.02)
    sim, res = run(Costs(**{**FREE.__dict__, "trip_stall": (3.0,)}))
    assert res.throughput("turn") == pytest.approx(500, rel=0.02)
    assert res.bottleneck()[0] == "session worker (busiest)"
    assert sim.gil[0].busy_ms() == pytest.approx(0.0, abs=1e-6)
    encodes = res.completed["turn"] * 1.0
    assert sum(r.busy_ms() for r in sim.worker_lock.values()) == pytest.approx(4 * encodes, rel=0.02)
    assert sim.worker_cpu_ms == pytest.approx(encodes, rel=0.02)
    assert sim.cpu[0].busy_ms() == pytest.approx(encodes, rel=0.02)
    _, on_loop = run(Costs(**{**FREE.__dict__, "loop_stall": (3.0,)}))
    assert on_loop.throughput("turn") == pytest.approx(1000 / 3, rel=0.02)


def test_a_turns_loop_and_trip_stalls_come_from_one_lone_call():
    # Lone calls of 1, 1, 1 and 9 ms whose round trips took 0.5, 0.5, 0.5 and 6.5: the slow call's
    # excess splits 4.5 ms at its worker and 1.5 in the loop, drawn together (one slow call, not two).
    loop, trip = stalls_of([1.0, 1.0, 1.0, 9.0], [0.5, 0.5, 0.5, 6.5])
    assert loop == (0.0, 0.0, 0.0, 1.5) and trip == (0.0, 0.0, 0.0, 4.5)
    with pytest.raises(ValueError, match="paired"):
        stalls_of([1.0], [])
    sim = Simulation(Cluster(), Costs(**{**FREE.__dict__, "loop_stall": loop, "trip_stall": trip}))
    drawn = [sim._stalls() for _ in range(400)]
    assert sorted(set(drawn)) == [(0.0, 0.0, 0.0), (1.5, 4.5, 0.0)]
    assert drawn.count((1.5, 4.5, 0.0)) == 100


def test_a_chunks_daemon_work_takes_cores_beside_it_not_its_path():
    # Two cores, one task slot, 1M texts of one chunk encoding in 2 ms. A lone text takes 2 ms with
    # or without 2 ms of Ray's daemons per chunk (the spare core runs them). With four task slots
    # and four callers (texts left whole) the cores are the bottleneck: 4 ms of work per text on 2
    # cores halves the throughput the encodes alone allow (1,000 texts/s to 500).
    costs = Costs(**{**FREE.__dict__, "encode_ms_per_mchar": 2.0})
    daemons = Costs(**{**costs.__dict__, "chunk_daemon_ms": 2.0})
    lone = []
    for c in (costs, daemons):
        sim = Simulation(Cluster(nodes=1, cores_per_node=2, task_slots=1), c)
        sim.closed_texts(1, 1_000_000)
        lone.append(sim.run(1_100.0, 100.0).percentile("text", 50))
    assert lone == [pytest.approx(2.0), pytest.approx(2.0)]
    rates = []
    for c in (costs, daemons):
        sim = Simulation(Cluster(nodes=1, cores_per_node=2, task_slots=4, cut_threshold=2_000_000), c)
        sim.closed_texts(4, 1_000_000)
        rates.append(sim.run(3_100.0, 100.0).throughput("text"))
    assert rates[0] == pytest.approx(1000, rel=0.02)
    assert rates[1] == pytest.approx(500, rel=0.02)
    # and a session turn, no chunk task, takes no daemon's work
    turns = [closed_turns(Cluster(nodes=1, cores_per_node=1, workers=1), c, 2, 1_100.0)[1].throughput("turn")
             for c in (costs, daemons)]
    assert turns[0] == pytest.approx(1000, rel=0.02) and turns[1] == turns[0]


def test_simulated_sessions_keyed_like_a_pools_callers_share_its_homes():
    # The validation's four callers ("v0".."v3") split 2-2 over a real pool's two workers; with
    # workers named otherwise than the pool names them the simulation split the same keys 3-1,
    # queueing three callers on one worker where the pool queued two.
    sim = Simulation(Cluster(nodes=1, cores_per_node=2, workers=2, task_slots=2), FREE)
    keys = [f"v{i}" for i in range(4)]
    sim.add_sessions(4, (100_000, 100_000), keys=keys)
    sim.closed_turns(4)
    sim.run(1_100.0, 100.0)
    live = [worker_name(i) for i in range(2)]
    assert sim.worker_ids == live
    assert sorted(home_worker(k, live) for k in keys) == ["w000", "w000", "w001", "w001"]
    # each worker ran its two sessions' turns: equal shares
    busy = [sim.worker_lock[w].busy_ms() for w in live]
    assert busy[0] == pytest.approx(busy[1], rel=0.02)


def test_a_ray_calls_share_on_rays_threads_holds_a_core_not_the_loop():
    # Two callers of 1M texts in two chunks on two slots, 8 cores; each chunk costs the driver 8 ms:
    # its launch call 1 ms on the loop, then 7 to take its answer. All on the loop: 16 ms of loop a
    # text, 62.5 texts/s. With the answer's 7 ms on Ray's threads, the loop holds 2 ms a text and
    # the threads' 14 run beside it on other cores: the driver's CPU per text is the same 16 ms, and
    # the slots, each held 8 ms a chunk, bound the rate (125 texts/s), not the loop (25% busy).
    base = Costs(**{**FREE.__dict__, "ray_call_ms": 1.0, "chunk_ms": 7.0})
    cl = Cluster(nodes=1, cores_per_node=8, task_slots=2)
    for share, rate, loop in ((0.0, (61, 62.5), (0.98, 1.0)), (1.0, (120, 125), (0.23, 0.26))):
        sim = Simulation(cl, Costs(**{**base.__dict__, "chunk_threads_share": share}))
        sim.closed_texts(2, 1_000_000)
        res = sim.run(2_100.0, 100.0)
        n = res.completed["text"]
        assert rate[0] <= res.throughput("text") <= rate[1]
        assert loop[0] <= res.utilization["driver loop (GIL)"] <= loop[1]
        assert sim.gil[0].busy_ms() / n == pytest.approx(2 * (1 + 7 * (1 - share)), rel=0.02)
        assert sim.driver_threads_ms / n == pytest.approx(2 * 7 * share, rel=0.02)
    # A turn's actor call to a worker on another node: the same split of its 2 ms.
    cl = Cluster(nodes=2, cores_per_node=2, workers=2)
    node = Simulation(cl, FREE).worker_node
    key = next(k for k in (f"k{i}" for i in range(64)) if node[home_worker(k, list(node))] == 1)
    for share in (0.0, 0.5):
        sim = Simulation(cl, Costs(**{**FREE.__dict__, "ray_call_ms": 2.0, "ray_call_threads_share": share}))
        sim.add_sessions(1, (100_000, 100_000), keys=[key])
        sim.closed_turns(1)
        res = sim.run(1_100.0, 100.0)
        n = res.completed["turn"]
        assert sim.gil[0].busy_ms() / n == pytest.approx(2.0 * (1 - share), rel=0.02)
        assert sim.driver_threads_ms / n == pytest.approx(2.0 * share, rel=0.02)


def test_a_wake_up_is_paid_by_a_step_that_finds_its_thread_asleep_not_by_every_call():
    # The loop spends 1 ms a turn (0.5 taking it, 0.5 handing it back), a worker 0.2 ms; waking the
    # idle loop costs 0.5 ms, an idle worker 0.3. A lone turn finds both asleep: the loop woken by
    # the caller's request and by the worker's answer: 2 ms of loop and 0.5 of worker a turn, one at a
    # time, 400 turns/s. Four callers on 2 workers
    # keep the loop busy: no wake-up, 1 ms a turn, 1,000 turns/s (charged per call: 2 ms, 500/s).
    costs = Costs(**{**FREE.__dict__, "handoff_ms": 1.0, "turn_ms_100k": 0.2, "turn_ms_1m": 0.2,
                     "loop_wake_ms": 0.5, "worker_wake_ms": 0.3})
    cl = Cluster(nodes=1, cores_per_node=8, workers=2)
    for callers, loop, wakes, rate in ((1, 2.0, 2.0, (398, 401)), (4, 1.0, 0.0, (990, 1001))):
        sim, res = closed_turns(cl, costs, callers, 2_100.0)
        n = res.completed["turn"]
        assert rate[0] <= res.throughput("turn") <= rate[1]
        assert sim.gil[0].busy_ms() / n == pytest.approx(loop, rel=0.02)
        assert sim.wakes["loop"] / n == pytest.approx(wakes, abs=0.01)
        assert sim.wakes["worker"] / n == pytest.approx(1.0, abs=0.01)  # each worker idle when its turn comes
        assert sim.worker_cpu_ms / n == pytest.approx(0.5, rel=0.02)


def test_a_texts_other_chunks_stall_each_by_their_own_measured_excess():
    # One caller, 1M texts in two chunks of 1 ms on two slots: 2 ms of chunk round trips a text, and
    # its latency 1 ms (side by side). A lone text whose longest chunk ran 10 ms over and whose other
    # ran 6 ms over stalls its chunks by 10 and 6: its latency 11 ms, its chunks' round trips 11 and
    # 7. With the longest chunk's excess alone the other chunk would return at 1 ms (one slow chunk
    # of two: the pool's chunks' P99 at 2 workers ran 10-38% short).
    costs = Costs(**{**FREE.__dict__, "encode_ms_per_mchar": 2.0, "text_stall": (10.0,), "text_stall_rest": (6.0,)})
    sim = Simulation(Cluster(nodes=1, cores_per_node=2, task_slots=2), costs)
    sim.closed_texts(1, 1_000_000)
    res = sim.run(1_200.0, 100.0)
    assert res.percentile("text", 50) == pytest.approx(11.0, rel=0.01)
    assert sorted({round(trip, 6) for _, trip in sim.chunk_times}) == [7.0, 11.0]
