"""The Ray pool against the reference: sessions, extend, chunks, batches, faults, named pools."""
from __future__ import annotations

import asyncio
import random
import threading

import pytest
import ray

from delta_ray import SessionNotFound, TokenizerPool

pytestmark = pytest.mark.ray


@pytest.fixture(scope="module")
def pool(ray_session, tokenizer_paths):
    # placement=False: these tests exercise the pool's own paths (chunks, tasks), which the cost
    # model would skip for a caller whose fast engine finishes first.
    p = TokenizerPool(tokenizer_paths["llama3.2"], num_workers=3, chunk_size=8192, cut_threshold=20_000,
                      placement=False, name="test-pool")
    yield p
    p.close()


def _stream(real_texts, n_sessions=4, turns=6, seed=0):
    rnd = random.Random(seed)
    src = real_texts["code"] + real_texts["multilingual"]
    texts = {f"s{i}": src[rnd.randrange(50_000):][:5_000 + 4_000 * i] for i in range(n_sessions)}
    for t in range(turns):
        for key in list(texts):
            start = rnd.randrange(len(src) - 3000)
            texts[key] += src[start:start + rnd.randint(1, 2600)]
            yield key, texts[key]


def test_sessions_stateless_and_batches_are_exact(pool, references, real_texts):
    ref = references["llama3.2"]
    for key, text in _stream(real_texts):
        assert pool.encode(text, session=key).to_pylist() == ref.encode(text).ids
    long_text = (real_texts["english"] * 2)[:150_000]
    for special in (True, False):
        assert pool.encode(long_text, add_special_tokens=special).to_pylist() == \
            ref.encode(long_text, add_special_tokens=special).ids
    assert pool.stats.get("chunked", 0) >= 1
    batch = ["short", real_texts["code"][:9_000], long_text, "", real_texts["multilingual"][:30_000]]
    assert [a.to_pylist() for a in pool.encode_batch(batch)] == [e.ids for e in ref.encode_batch(batch)]
    keyless = real_texts["english"][:12_000]
    assert pool.encode(keyless).to_pylist() == ref.encode(keyless).ids


def test_extend_and_unknown_session(pool, references, real_texts):
    ref = references["llama3.2"]
    text = real_texts["english"][:30_000]
    pool.encode(text, session="ext")
    for delta in ["\nmore text", " 12345", "\u0301x", "<|eot_id|>", "\r\n\r\n"]:
        text += delta
        assert pool.extend("ext", delta).to_pylist() == ref.encode(text).ids
    assert pool.extend("ext", "!", add_special_tokens=False).to_pylist() == \
        ref.encode(text + "!", add_special_tokens=False).ids
    with pytest.raises(SessionNotFound):
        pool.extend("never-seen", "x")
    with pytest.raises(TypeError):
        pool.encode(None)
    with pytest.raises(ValueError):
        pool.encode("x" * 5000 + "\ud800", session="bad")


def test_arguments_are_checked_in_delta_rays_words(pool):
    """A non-bool flag was accepted (the string "false" added the BOS); tenant=5 failed inside len();
    decode([-1]) was an OverflowError. Each is now a TypeError or ValueError that says what is wrong."""
    pool.encode("hello", session="args")
    for call in (lambda: pool.encode("hello", add_special_tokens="false"),
                 lambda: pool.encode("x" * 30_000, add_special_tokens=0),
                 lambda: pool.encode("hello", session="args", add_special_tokens=None),
                 lambda: pool.extend("args", " x", add_special_tokens="no"),
                 lambda: pool.encode_batch(["a"], add_special_tokens=1)):
        with pytest.raises(TypeError, match="add_special_tokens must be bool"):
            call()
    for call in (lambda: pool.encode("hello " * 2000, tenant=5), lambda: pool.extend("args", "x", tenant=b"t")):
        with pytest.raises(TypeError, match="tenant must be str or None"):
            call()
    with pytest.raises(ValueError, match="position 0 holds -1"):
        pool.decode([-1])
    with pytest.raises(TypeError, match="integers"):
        pool.decode(["a"])


def test_a_session_named_after_a_content_key_gets_nothing(pool, references, real_texts):
    """The reproduced attack: a caller who knows the opening 4 KB of another caller's keyless text
    (a public system prompt) named a session after its content key and extended it by "" to read
    that caller's whole last text. Now a session's key is never a content key (and the digest is
    keyed by the pool's secret): the extend finds nothing, and the victim's state stays exact."""
    import hashlib

    from delta_ray._core.keys import ContentDigest, content_key

    ref = references["llama3.2"]
    victim = real_texts["english"][:8_000] + "\nMy account number is 4242-1717-9999."
    for tenant in (None, "bank"):
        assert pool.encode(victim, tenant=tenant).to_pylist() == ref.encode(victim).ids
        ns = "t-" if tenant is None else f"t{len(tenant)}:{tenant}"
        old = f"{ns}|c:{hashlib.blake2b(victim.encode()[:4096], digest_size=16).hexdigest()}"
        keyed = content_key(ContentDigest.derived(pool.secret, b"delta-ray pool content keys").of(victim), tenant)
        for spelled in (old, keyed):
            for as_tenant in (None, tenant):
                with pytest.raises(SessionNotFound):
                    pool.extend(spelled, "", tenant=as_tenant)
            other = "Attacker text. " * 600
            assert pool.encode(other, session=spelled).to_pylist() == ref.encode(other).ids
        assert pool.encode(victim, tenant=tenant).to_pylist() == ref.encode(victim).ids


def test_long_session_initialization_is_chunked(pool, references, real_texts):
    ref = references["llama3.2"]
    text = (real_texts["code"] * 2)[:120_000]
    before = pool.stats.get("chunked_init", 0)
    assert pool.encode(text, session="long").to_pylist() == ref.encode(text).ids
    assert pool.stats.get("chunked_init", 0) == before + 1
    text += "\n# next turn\n"
    assert pool.encode(text, session="long").to_pylist() == ref.encode(text).ids
    assert pool.extend("long", "x = 1\n").to_pylist() == ref.encode(text + "x = 1\n").ids


def test_concurrent_threads_and_coroutines(pool, references, real_texts):
    ref = references["llama3.2"]
    errors = []

    def client(i):
        try:
            for key, text in _stream(real_texts, n_sessions=2, turns=3, seed=10 + i):
                if pool.encode(text, session=f"t{i}-{key}").to_pylist() != ref.encode(text).ids:
                    errors.append((i, key))
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []

    async def main():
        texts = [real_texts["english"][i * 9000:(i + 1) * 9000] for i in range(6)]
        outs = await asyncio.gather(*(pool.encode_async(t, session=f"a{i}") for i, t in enumerate(texts)))
        return texts, outs

    texts, outs = asyncio.run(main())
    assert [o.to_pylist() for o in outs] == [ref.encode(t).ids for t in texts]


def test_connect_to_named_pool(pool, references, real_texts):
    ref = references["llama3.2"]
    from delta_ray.actors.pool import PoolAuthError
    with pytest.raises(PoolAuthError):  # any job on the cluster could try: the secret is required
        TokenizerPool.connect("test-pool", b"wrong secret, 32 bytes long....")
    with pytest.raises(PoolAuthError):
        TokenizerPool.connect("test-pool")
    other = TokenizerPool.connect("test-pool", pool.secret.hex())
    try:
        assert other.secret == pool.secret and set(other._workers) == set(pool._workers)
        text = real_texts["english"][:25_000]
        assert other.encode(text, session="shared").to_pylist() == ref.encode(text).ids
        # the same workers: the owner's pool finds the session at its home and repairs it
        assert pool.encode(text + " and more", session="shared").to_pylist() == ref.encode(text + " and more").ids
    finally:
        other.close()
    with pytest.raises(LookupError):
        TokenizerPool.connect("no-such-pool", pool.secret)


@pytest.mark.parametrize("impostor", ["forged", "replayed"])
def test_connect_refuses_a_registry_that_does_not_prove_the_secret(pool, tokenizer_paths, impostor):
    """An actor that took a pool's registry name first answers any proof. Forged: it hands out its
    own workers and secret. Replayed: it returns a genuine registry answer (obtained for another
    nonce) with the workers swapped. Either way connect() must refuse, not adopt them."""
    import os

    from delta_ray._core import constants as C
    from delta_ray.actors.pool import PoolAuthError, _attach_proof

    @ray.remote(num_cpus=0)
    class Impostor:
        def __init__(self, answer):
            self._answer = answer

        def info(self, nonce, proof):
            return self._answer

    if impostor == "forged":
        answer = {"loaded": pool._loaded, "workers": {}, "config": pool.config, "secret": b"i" * 32,
                  "proof": b"\0" * 32}
    else:
        nonce = os.urandom(32)
        genuine = ray.get(pool._registry.info.remote(nonce, _attach_proof(pool.secret, "test-pool", nonce)))
        answer = {**genuine, "workers": {}}
    name = f"squatted-{impostor}"
    actor = Impostor.options(name=f"{name}:registry", namespace=C.NAMESPACE).remote(answer)
    try:
        with pytest.raises(PoolAuthError, match="did not prove"):
            attached = TokenizerPool.connect(name, pool.secret)
            attached.close()  # (only without the defence)
    finally:
        ray.kill(actor)


def test_workers_install_only_sealed_states(pool, references):
    """A job calling a worker's install with a state it made up is refused; the pool's own is adopted."""
    import numpy as np
    import ray

    from delta_ray._core.session_store import SessionState
    from delta_ray._core.state_seal import seal_state
    worker = next(iter(pool._workers.values()))
    z = np.zeros(0, np.int64)
    bogus = SessionState("hello", np.array([1, 2, 3], np.int32), z, z, z)
    with pytest.raises(Exception, match="not sealed"):
        ray.get(worker.install.remote("victim", bogus, b"\0" * 32))
    with pytest.raises(Exception, match="not sealed"):
        ray.get(worker.install.remote("victim", bogus, seal_state(b"guessed" * 5, "victim", bogus)))
    assert ray.get(worker.install.remote("mine", bogus, seal_state(pool.secret, "mine", bogus)))
    assert not ray.get(worker.has_session.remote("victim"))


def test_killed_workers_lose_nothing(ray_session, tokenizer_paths, references, real_texts):
    """Kill workers mid-stream: every request completes and equals the reference."""
    ref = references["qwen-3"]
    p = TokenizerPool(tokenizer_paths["qwen-3"], num_workers=3, chunk_size=8192, cut_threshold=20_000)
    try:
        results = []
        stream = list(_stream(real_texts, n_sessions=4, turns=8, seed=5))
        long_text = real_texts["english"][:60_000]

        def run():
            for i, (key, text) in enumerate(stream):
                results.append((text, p.encode(text, session=key)))
                if i % 5 == 0:
                    results.append((long_text, p.encode(long_text)))

        th = threading.Thread(target=run)
        th.start()
        killed = []
        while th.is_alive() and len(killed) < 2:
            th.join(timeout=0.05 + 0.3 * len(killed))
            victim = sorted(set(p._workers) - set(killed))[0]
            ray.kill(p._workers[victim])
            killed.append(victim)
        th.join(timeout=300)
        assert not th.is_alive()
        assert len(results) == len(stream) + len(stream[::5])
        for text, got in results:
            assert got.to_pylist() == ref.encode(text).ids
        # Every session still works, wherever its home is now; a dead worker is retired when a
        # call to it fails (the chunks of a long text go to every idle worker).
        for key, text in stream[-4:]:
            assert p.encode(text + " end", session=key).to_pylist() == ref.encode(text + " end").ids
        assert p.encode(long_text + "!").to_pylist() == ref.encode(long_text + "!").ids
        assert len(killed) == 2 and p.stats.get("worker_retired", 0) >= 1
        assert 1 <= p.num_workers < 3
    finally:
        p.close()


# Timeouts, hung and dead workers and lost connections are tested on a fake transport in
# tests/pool/test_orchestrator.py (milliseconds, no Ray); killing real workers stays here.


def _settled_free_cpus(timeout_s: float = 20.0) -> float:
    """Ray's free CPUs once actors killed by earlier tests have released theirs (that is asynchronous)."""
    import time
    deadline, last, stable_since = time.monotonic() + timeout_s, None, time.monotonic()
    while time.monotonic() < deadline:
        free = ray.available_resources().get("CPU", 0)
        if free != last:
            last, stable_since = free, time.monotonic()
        elif time.monotonic() - stable_since > 1.0:
            break
        time.sleep(0.1)
    return last


def test_chunks_never_wait_on_cpu_reservations(ray_session, tokenizer_paths, references, real_texts):
    # Workers (this pool's, another pool's, another job's) may hold every CPU Ray has: chunk tasks
    # must still run at once, bounded by the dispatcher rather than by a reservation.
    free = _settled_free_cpus()
    ref = references["qwen-3"]
    text = (real_texts["english"] * 2)[:150_000]
    with TokenizerPool(tokenizer_paths["qwen-3"], num_workers=2, worker_cpus=free / 2, placement=False,
                       request_timeout_s=30, startup_timeout_s=120) as p:
        assert ray.available_resources().get("CPU", 0) < 0.01
        assert p.encode(text).to_pylist() == ref.encode(text).ids
        assert p.stats.get("chunked") == 1 and "timeout_fallback" not in p.stats


def test_whole_transcript_turns_ship_only_the_suffix(pool, references, real_texts):
    """A turn whose text extends what the session last sent travels as an extend; a text that
    diverges (a template dropping an old block) travels whole; every answer is exact."""
    ref = references["llama3.2"]
    text = real_texts["english"][:12_000]
    assert pool.encode(text, session="ship").to_pylist() == ref.encode(text).ids
    before = dict(pool.stats)
    for i in range(4):
        text += f"\nturn {i}: " + real_texts["code"][i * 500:(i + 1) * 500]
        assert pool.encode(text, session="ship").to_pylist() == ref.encode(text).ids
    assert pool.stats.get("session_delta", 0) - before.get("session_delta", 0) == 4
    diverged = text[:5000] + " a different ending"
    assert pool.encode(diverged, session="ship").to_pylist() == ref.encode(diverged).ids
    assert pool.extend("ship", " more").to_pylist() == ref.encode(diverged + " more").ids
    again = diverged + " more and more"
    assert pool.encode(again, session="ship").to_pylist() == ref.encode(again).ids


# Closing force-cancels no chunk task (actors/transport.py HUNG): ray.cancel racing a task's own
# completion once aborted this process inside Ray 2.60; tests/pool/test_transport.py holds the rule.
def test_closing_a_pool_answers_every_caller_in_flight(pool, references, real_texts):
    """close() while threads wait on the pool: each gets its exact IDs or PoolClosed, none hangs."""
    from delta_ray._core.errors import PoolClosed
    ref = references["llama3.2"]
    other = TokenizerPool.connect("test-pool", pool.secret)  # its own loop and channels, the same workers
    text = real_texts["english"][:60_000]  # over cut_threshold: chunk tasks in flight
    want = ref.encode(text).ids
    outcomes: list = []

    def hammer(i):
        while True:
            try:
                got = other.encode(text) if i % 2 else other.encode(text + str(i), session=f"closing-{i}")
            except PoolClosed:
                outcomes.append("closed")
                return
            outcomes.append(got.to_pylist() == (want if i % 2 else ref.encode(text + str(i)).ids))

    threads = [threading.Thread(target=hammer, args=(i,), daemon=True) for i in range(4)]
    for t in threads:
        t.start()
    for _ in range(600):
        if len(outcomes) >= 4:
            break
        threading.Event().wait(0.05)
    other.close()
    for t in threads:
        t.join(30)
        assert not t.is_alive(), "a caller still waits on a closed pool"
    assert outcomes.count("closed") == 4
    assert all(o is True for o in outcomes if o != "closed")
