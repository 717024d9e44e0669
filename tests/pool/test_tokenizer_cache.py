"""The per-process tokenizer cache fetches a configuration only on a miss, and chunk tasks receive
theirs unresolved (Ray-free: a fake stands for the remote function)."""
import pytest

from delta_ray._core.config import TokenizerConfig, pool_config
from delta_ray._core.loading import DigestMismatch, load_tokenizer
from delta_ray.actors import chunk_task, tokenizer_cache
from delta_ray.actors.calls import ENCODE_PIECES, Call, PiecesArgs
from delta_ray.apps.bundled import DEFAULT_TOKENIZER, bundled_tokenizer_path


@pytest.fixture(scope="module")
def loaded():
    return load_tokenizer(bundled_tokenizer_path(DEFAULT_TOKENIZER))


@pytest.fixture
def empty_cache():
    tokenizer_cache.clear()
    yield
    tokenizer_cache.clear()


OPTIONS = TokenizerConfig(engine="reference", shadow_rate=0.0)


def test_a_held_tokenizer_never_fetches_its_configuration_again(loaded, empty_cache, references):
    fetches = []

    def fetch() -> bytes:
        fetches.append(1)
        return loaded.config_bytes
    first = tokenizer_cache.get_tokenizer(fetch, loaded.digest, OPTIONS)
    again = tokenizer_cache.get_tokenizer(fetch, loaded.digest, OPTIONS)
    assert fetches == [1] and again is first
    text = "Hello, world: 12345 tokens\n\n  and more"
    assert list(again.encode_ids(text, add_special_tokens=False)) == \
        references[DEFAULT_TOKENIZER].encode(text, add_special_tokens=False).ids


def test_fetched_bytes_are_checked_against_the_digest(loaded, empty_cache):
    with pytest.raises(DigestMismatch):
        tokenizer_cache.get_tokenizer(lambda: loaded.config_bytes + b" ", loaded.digest, OPTIONS)
    assert not tokenizer_cache.cached(loaded.digest, OPTIONS)


class FakeRemote:
    """Stands for a Ray remote function: records the arguments each launch passes."""

    def __init__(self):
        self.launches = []

    def options(self, **_):
        return self

    def remote(self, *args):
        self.launches.append(args)
        return object()


def test_a_chunk_task_receives_the_configuration_unresolved(monkeypatch, loaded):
    # Ray resolves a task's top-level object references before it runs (the 11 MB configuration
    # for every chunk); a reference inside a tuple reaches the task as a reference
    fake, ref = FakeRemote(), object()
    monkeypatch.setattr(chunk_task, "encode_chunks", fake)
    launcher = chunk_task.ChunkLauncher(ref, loaded.digest, pool_config(None, {"shadow_rate": 0.0}))
    launcher(Call(ENCODE_PIECES, PiecesArgs(["some text"]), None))
    (config, digest, pieces, *_), = fake.launches
    assert config == (ref,) and digest == loaded.digest and pieces == ["some text"]
