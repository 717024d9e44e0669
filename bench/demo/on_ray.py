"""The sections on Ray: the pool, and HTTP (Serve beside delta-ray's local server, :mod:`.over_http`).

Ray is started quietly: ``log_to_driver=False`` (workers' output stays in the session's log
files, whose folder the demo names), Ray's driver-side loggers go to the demo's log file, and no
Ray Data pipeline runs (the corpus section uses ``delta-ray tokenize``'s local path), so none of
its progress bars or actor-restart warnings appear. Every result is compared with the reference.
"""
from __future__ import annotations

import os

from delta_ray._core.loading import LoadedTokenizer
from delta_ray.apps.sample_text import chat_transcript, corpus

from .baselines import Engines, chat_calls
from .over_http import CHAT_SIZES, http_section
from .report import Steps, Table, best, median, ms, out, progress, quiet_ray_loggers, ratio, size_label, timed, verdict


class RayDidNotStart(RuntimeError):
    """Ray or the pool's workers did not start in time (an overloaded machine): the sections on
    Ray did not run, which the demo reports as incomplete, not as a failed check."""


def start_ray(tries: int = 3) -> tuple[bool, str]:
    """Join ``RAY_ADDRESS`` or start a local Ray with its logs in files; (started here, logs dir).

    A Ray started here runs Serve with direct ingress (replicas listen for HTTP themselves), so the
    HTTP section measures the Serve app both through its proxy and straight to its replica; the
    flag is read when Serve's modules are imported, so it is set before."""
    import ray
    if not ray.is_initialized() and not os.environ.get("RAY_ADDRESS"):
        os.environ.setdefault("RAY_SERVE_ENABLE_DIRECT_INGRESS", "1")
    from ray import serve  # noqa: F401 - its import installs console handlers too: quiet them now
    quiet_ray_loggers()  # after `import ray`, which installs its stderr handler
    started = False
    if not ray.is_initialized():
        if os.environ.get("RAY_ADDRESS"):
            ray.init(address=os.environ["RAY_ADDRESS"], log_to_driver=False)
        else:
            from delta_ray.actors.local_ray import local_init_kwargs
            with progress("starting a local Ray"):
                for attempt in range(1, tries + 1):
                    try:
                        ray.init(**local_init_kwargs())
                        break
                    except Exception as exc:  # noqa: BLE001 - Ray gives its raylet 30 s to register
                        if "timed out during startup" not in str(exc):
                            raise
                        ray.shutdown()
                        if attempt == tries:
                            raise RayDidNotStart(f"Ray's node missed its 30 s start-up deadline {tries} times "
                                                 "(is the machine overloaded? see `uptime`)") from None
                        out("  Ray's node missed its 30 s start-up deadline (a busy machine?): starting it again")
            started = True
    quiet_ray_loggers()
    try:
        logs = ray._private.worker._global_node.get_logs_dir_path()
    except Exception:  # noqa: BLE001 - a private API: the folder is only named for the reader
        logs = "/tmp/ray/session_latest/logs"
    return started, logs


def ray_sections(eng: Engines, loaded: LoadedTokenizer, sizes, log_path: str) -> bool:
    """Start Ray (or join one), run the pool and Serve sections, shut down what was started."""
    os.environ.setdefault("RAY_ENABLE_AUTO_CONNECT", "0")
    import ray
    started, logs = start_ray()  # RayDidNotStart: the caller reports the sections as not run
    out(f"  Ray: {int(ray.cluster_resources().get('CPU', 0))} CPUs; its logs: {logs}")
    ok = True
    try:
        from delta_ray._core.errors import PoolStartupError
        try:
            ok &= pool_section(eng, loaded, sizes.pool_turns)
        except PoolStartupError as exc:
            raise RayDidNotStart(f"the pool's workers did not start: {exc}") from None
        ok &= http_section(eng, loaded, sizes.serve_turns, log_path, own_ray=started)
    finally:
        if started:
            ray.shutdown()
    return ok


def _chat(n: int, turns: int) -> tuple[str, list[str]]:
    # The same transcripts as the in-process chat section (same seed): the reference runs once.
    return chat_transcript(n, turns + 1, seed=n)


def pool_section(eng: Engines, loaded: LoadedTokenizer, turns: int) -> bool:
    """Sessions and a long text through ``TokenizerPool`` (workers on Ray, sessions on their home
    worker), against fastokens re-encoding in the caller."""
    from delta_ray.actors.pool import TokenizerPool
    with progress("starting the pool (one worker per CPU, each loads the tokenizer)", 15):
        pool = TokenizerPool(loaded)
    t = Table(f"Pool on Ray: {pool.num_workers} workers (median of {turns} turns or calls, warm; "
              "fastokens runs in the caller)",
              ["use", "reference", "fastokens", "fastokens+seg.cache", "delta-ray pool", "vs best fastokens", "exact"])
    ok = True
    last = None
    try:
        for n in CHAT_SIZES:
            initial, deltas = _chat(n, turns)
            fast, cached = eng.fastokens, eng.segment_cached()
            a, b = f"pool-{n}-turn", f"pool-{n}-extend"
            pool.encode(initial, session=a)  # each session's first call initializes it on its home worker
            pool.encode(initial, session=b)
            if cached is not None:
                cached.ids(initial)
            times = {"turn": [], "extend": [], "fast": [], "cached": []}
            results = []
            text = initial
            bar = Steps(f"pool {size_label(n)}: turns", len(deltas))
            for i, delta in enumerate(deltas):
                text = text + delta
                calls = chat_calls(pool, text, delta, a, b, fast, cached)
                for name, fn in calls:
                    got, s = timed(fn)
                    if i >= 1:  # the first turn warms the paths
                        times[name].append(s)
                    results.append((name, text, got))
                bar.step()
            good = eng.check_all(results, "pool ")
            ref_s = median([eng.ref_seconds[txt] for txt in {txt for _, txt, _ in results[len(calls):]}])
            exact = all(good["turn"]) and all(good["extend"])
            ok &= exact
            n_all, n_good = sum(len(v) for v in good.values()), sum(sum(v) for v in good.values())
            f, c = median(times["fast"]), median(times["cached"])
            for op in ("turn", "extend"):
                d = median(times[op])
                what = "whole transcript sent" if op == "turn" else "extend: the new message only"
                t.add(f"chat {size_label(n)}, {what}", ms(ref_s), ms(f) if fast else "n/a",
                      ms(c) if cached else "n/a", ms(d), ratio(best(f, c), d) if fast else "-",
                      f"{n_good}/{n_all}" if op == "turn" else "")
            last = (n, best(f, c), median(times["turn"]), median(times["extend"]))
        # A long stateless text: cut at safe cuts, chunks on the workers (or the caller: placement).
        src = corpus("english", 1_000_000 + 6 * 37_000)
        texts = [src[k * 37_000:k * 37_000 + 1_000_000] for k in range(4)]
        pool.encode(texts[0])
        d_s, f_s, res = [], [], []
        for text in texts[1:]:
            got, s = timed(lambda: pool.encode(text))
            d_s.append(s)
            res.append(("pool stateless", text, got))
            if eng.fastokens is not None:
                got, s = timed(lambda: eng.fastokens.ids(text))
                f_s.append(s)
                res.append(("fastokens", text, got))
        by_engine = eng.check_all(res)
        good = [g for v in by_engine.values() for g in v]
        ok &= all(by_engine["pool stateless"])
        r_s = median([eng.ref_seconds[x] for x in texts[1:]])
        t.add("stateless 1M chars", ms(r_s), ms(median(f_s)) if f_s else "n/a", "",
              ms(median(d_s)), ratio(median(f_s), median(d_s)) if f_s else "-", f"{sum(good)}/{len(good)}")
    finally:
        pool.close()
    t.print()
    n, f, turn, ext = last
    if f:
        verdict(f"a {size_label(n)}-character session on the pool: {ms(turn)} a turn, {ms(ext)} an extend "
                f"(a hop to the session's worker and back) vs fastokens in the caller {ms(f)} "
                f"(best of whole and segment cache; "
                f"{ratio(f, turn)}); "
                f"{'all exact' if ok else 'MISMATCH against the reference'}")
    return ok
