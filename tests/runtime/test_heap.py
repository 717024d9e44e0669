"""Full garbage collections skip what a process built at set-up: ``freeze_heap`` freezes it, a
second call frees what became garbage meanwhile unless other code froze objects too (those stay
frozen), a loaded tokenizer keeps no parsed JSON, and a pool's own processes freeze after building
their tokenizer (Ray-free)."""
import gc
import json
import weakref

import pytest

from delta_ray import freeze_heap
from delta_ray._core.config import TokenizerConfig
from delta_ray._core.loading import load_tokenizer
from delta_ray.actors import chunk_task, tokenizer_cache
from delta_ray.apps.bundled import DEFAULT_TOKENIZER, bundled_tokenizer_path


@pytest.fixture
def thawed():
    gc.unfreeze()
    yield
    gc.unfreeze()  # the rest of the suite runs with the collector as it found it


class Node:
    def __init__(self):
        self.other = self  # a cycle: only the collector frees it


def test_frozen_objects_leave_the_collected_generations(thawed):
    before = len(gc.get_objects())
    assert freeze_heap() > 0
    assert len(gc.get_objects()) < before / 10  # what a full collection traces now


def test_a_second_freeze_frees_cyclic_garbage_frozen_by_the_first(thawed):
    node = Node()
    alive = weakref.ref(node)
    freeze_heap()
    del node  # garbage now, but frozen: no collection looks at it
    gc.collect()
    assert alive() is not None
    freeze_heap()  # unfreezes first (a closed pool, an evicted tokenizer), then collects
    assert alive() is None


def _frozen(obj) -> bool:
    return not any(o is obj for o in gc.get_objects())  # collections list only the collected generations


@pytest.mark.parametrize("host_froze", ["before the first call", "between the calls"])
def test_a_second_freeze_keeps_what_the_host_froze(thawed, host_froze):
    """The host application (vLLM's freeze_gc_heap, a server's start-up) froze its own objects:
    freeze_heap never thaws them, so their garbage stays frozen, as the host decided."""
    if host_froze == "between the calls":
        freeze_heap()
    host = Node()
    alive = weakref.ref(host)
    gc.freeze()  # the host's own freeze
    assert _frozen(host)
    freeze_heap()
    freeze_heap()
    assert _frozen(host)
    del host
    freeze_heap()
    assert alive() is not None  # the host's cyclic garbage was not thawed and collected
    gc.unfreeze()  # the host thaws everything: the permanent generation is freeze_heap's alone again
    gc.collect()
    assert alive() is None
    ours = Node()
    alive = weakref.ref(ours)
    freeze_heap()
    del ours
    freeze_heap()  # thaws again what it froze itself
    assert alive() is None


def test_a_loaded_tokenizer_keeps_no_parsed_configuration():
    # its ~150K BPE merges (two-item lists) were traced by every full collection of a pool's
    # driver, 100+ ms with the GIL held
    loaded = load_tokenizer(bundled_tokenizer_path(DEFAULT_TOKENIZER))
    gc.collect()
    tracked = len(gc.get_objects())
    config = loaded.config
    assert config == json.loads(loaded.config_bytes) and len(config["model"]["merges"]) > 100_000
    assert loaded.config is not config  # parsed anew, not kept
    del config
    gc.collect()
    assert len(gc.get_objects()) < tracked + 1_000


OPTIONS = TokenizerConfig(engine="reference", shadow_rate=0.0)


@pytest.mark.parametrize("chunk_process", [True, False])
def test_a_chunk_process_freezes_its_heap_after_a_build(monkeypatch, thawed, chunk_process):
    loaded = load_tokenizer(bundled_tokenizer_path(DEFAULT_TOKENIZER))
    tokenizer_cache.clear()
    monkeypatch.setattr(chunk_task, "_fetch", lambda config: lambda: loaded.config_bytes)
    if chunk_process:
        monkeypatch.setenv("DELTA_RAY_CHUNK_PROCESS", "1")
    else:  # a process other tasks share (Ray Data's, a user's) is left as it is
        monkeypatch.delenv("DELTA_RAY_CHUNK_PROCESS", raising=False)
    freezes = []

    def counted() -> int:
        freezes.append(1)
        return freeze_heap()
    monkeypatch.setattr(tokenizer_cache, "freeze_heap", counted)
    try:
        core = chunk_task._tokenizer((None,), loaded.digest, OPTIONS)
        assert (gc.get_freeze_count() > 0) == chunk_process and len(freezes) == chunk_process
        assert chunk_task._tokenizer((None,), loaded.digest, OPTIONS) is core  # held: no build, no freeze
        assert len(freezes) == chunk_process
    finally:
        tokenizer_cache.clear()
