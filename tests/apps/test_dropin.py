"""The transformers drop-in: under ``delta_ray.patch_transformers()`` every output equals stock
transformers (qwen-3, glm-4, llama3.2, minimax-m3: chats, ``__call__``, ``encode``, truncation,
dict outputs, batches, decode, deepcopy/pickle, the exactness battery's adversarial strings).

Each tokenizer is loaded twice from the same folder: once stock, once under the patch (with a small
cut threshold, so long texts take the cut path). Needs transformers 5.23 (the ``test`` extra).
"""
from __future__ import annotations

import copy
import itertools
import pickle

import numpy as np
import pytest

transformers = pytest.importorskip("transformers", reason="the drop-in tests need transformers 5.23: "
                                                          "pip install 'transformers==5.23.*' (the test extra)")

import exactness  # noqa: E402
from delta_ray.apps.dropin import hf as dropin_hf  # noqa: E402
from delta_ray.apps.dropin import is_wrapped, patch_transformers, refresh, unpatch_transformers, wrap_tokenizer  # noqa: E402
from delta_ray.apps.dropin.folders import bundled_hf_folder  # noqa: E402

NAMES = ("qwen-3", "glm-4", "llama3.2", "minimax-m3")
SMALL_CUTS = {"cut_threshold": 4096, "chunk_size": 2048, "threads": 4}
pytestmark = pytest.mark.skipif(not transformers.__version__.startswith("5."),
                                reason=f"the drop-in hooks transformers 5 (found {transformers.__version__})")


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("hf")
    return {n: bundled_hf_folder(n, root) for n in NAMES}


@pytest.fixture(scope="module")
def pairs(folders):
    """name -> (stock tokenizer, the same folder loaded under the patch), loaded on first use."""
    from transformers import AutoTokenizer
    cache: dict = {}

    def get(n: str):
        if n not in cache:
            stock = AutoTokenizer.from_pretrained(folders[n])
            patch_transformers(**SMALL_CUTS)
            try:
                patched = AutoTokenizer.from_pretrained(folders[n])
            finally:
                unpatch_transformers()
            dropin_hf.install_hooks()  # the wrapped tokenizers stay on the delta-ray path for the tests
            cache[n] = (stock, patched)
        return cache[n]
    yield get
    unpatch_transformers()


@pytest.fixture(params=NAMES)
def pair(request, pairs):
    stock, patched = pairs(request.param)
    assert is_wrapped(patched) and not is_wrapped(stock)
    return stock, patched


def _delta_calls(tok) -> int:
    """How many texts the wrapped tokenizer's DeltaTokenizer has served (to show the path ran)."""
    state = tok.__dict__[dropin_hf.STATE_ATTR]
    st = state.current(tok).tokenizer.stats
    return sum(st.values())


def _same(a, b) -> None:
    """Equal outputs: the same type, keys, values (lists or arrays), encodings' tokens."""
    assert type(a) is type(b)
    if isinstance(a, transformers.BatchEncoding):
        assert list(a.keys()) == list(b.keys())
        for k in a:
            if isinstance(a[k], np.ndarray):
                assert a[k].dtype == b[k].dtype and np.array_equal(a[k], b[k]), k
            else:
                assert a[k] == b[k], k
        assert (a.encodings is None) == (b.encodings is None)
        assert a.n_sequences == b.n_sequences
    else:
        assert a == b


def _texts(patched, real_texts) -> list[str]:
    loaded = patched.__dict__[dropin_hf.STATE_ATTR].current(patched).tokenizer.core.loaded  # the live config
    exactness.CONFIGS[id(loaded.tokenizer)] = loaded.config
    frags = exactness.ADVERSARIAL + exactness.special_fragments(loaded.tokenizer)
    out = list(frags)
    out += [a + b for a, b in itertools.islice(itertools.product(frags[:40], frags[:40]), 0, None, 7)]
    out += [real_texts["english"][:9000], real_texts["code"][:12000], real_texts["multilingual"][:9000]]
    return out


# -- the patch itself ---------------------------------------------------------------------------------
def test_patch_wraps_later_loads_and_unpatch_restores(folders):
    from transformers import AutoTokenizer
    from transformers.tokenization_utils_tokenizers import TokenizersBackend
    patch_transformers(engine="reference")
    try:
        assert is_wrapped(AutoTokenizer.from_pretrained(folders["glm-4"]))
    finally:
        unpatch_transformers()
    assert "from_pretrained" not in TokenizersBackend.__dict__
    assert TokenizersBackend._encode_plus.__name__ == "_encode_plus" and not hasattr(TokenizersBackend._encode_plus,
                                                                                      "__wrapped__")
    assert not is_wrapped(AutoTokenizer.from_pretrained(folders["glm-4"]))
    dropin_hf.install_hooks()


def test_bad_options_fail_at_patch_time():
    with pytest.raises(ValueError):
        patch_transformers(engine="warp")
    with pytest.raises(TypeError):
        patch_transformers(reuse="session")
    with pytest.raises(TypeError):
        patch_transformers(content_reuse="yes")


# -- outputs equal stock -------------------------------------------------------------------------------
def test_encode_call_and_battery_equal_stock(pair, real_texts):
    stock, patched = pair
    texts = _texts(patched, real_texts)
    before = _delta_calls(patched)
    for t in texts:
        for ast in (True, False):
            assert patched.encode(t, add_special_tokens=ast) == stock.encode(t, add_special_tokens=ast), (t, ast)
    assert _delta_calls(patched) - before >= 2 * len(texts)  # the delta-ray path served them
    for t in texts[:60] + texts[-3:]:
        _same(patched(t), stock(t))
        _same(patched(t, return_length=True, return_token_type_ids=True, return_attention_mask=True),
              stock(t, return_length=True, return_token_type_ids=True, return_attention_mask=True))
        _same(patched(t, return_tensors="np"), stock(t, return_tensors="np"))
    _same(patched(texts), stock(texts))
    _same(patched(texts, add_special_tokens=False), stock(texts, add_special_tokens=False))


def test_truncation_equal_stock(pair, real_texts):
    stock, patched = pair
    texts = ["", "a", "Hello world, this is a test.", " I'\u017f x", real_texts["english"][:6000]]
    for t, ast, n, side, strategy, stride in itertools.product(
            texts, (True, False), (1, 2, 3, 7, 50, 5000), ("right", "left"),
            ("longest_first", "only_first", "only_second"), (0, 2)):
        stock.truncation_side = patched.truncation_side = side
        kw = dict(truncation=strategy, max_length=n, add_special_tokens=ast, stride=stride)
        try:
            want = stock(t, **kw)
        except BaseException as exc:  # noqa: BLE001 - pyo3's PanicException is a BaseException
            if isinstance(exc, KeyboardInterrupt):
                raise
            with pytest.raises(type(exc)):
                patched(t, **kw)
            continue
        _same(patched(t, **kw), want)
    stock.truncation_side = patched.truncation_side = "right"
    # the backend is left with the call's settings, as stock leaves it
    patched("abc", truncation=True, max_length=3)
    stock("abc", truncation=True, max_length=3)
    assert patched._tokenizer.truncation == stock._tokenizer.truncation


def test_vllms_default_call_takes_the_fast_path(pair, real_texts, monkeypatch):
    """vLLM 0.34's renderer tokenizes every prompt as ``tok(prompt, truncation=True,
    max_length=max_input_tokens + 1, add_special_tokens=...)`` with the truncation side vLLM sets
    (``left`` for generation): equal to stock and served by delta-ray, whether the limit is far,
    exactly at the prompt or cuts it. Fails if that call shape falls back to stock's encode."""
    stock, patched = pair
    served = []
    real = dropin_hf._delta_encode_plus
    monkeypatch.setattr(dropin_hf, "_delta_encode_plus", lambda *a: served.append(r := real(*a)) or r)
    prompt = real_texts["english"][:20000] + " I'\u017f"
    n = len(stock.encode(prompt))
    for side, ast, limit in itertools.product(("left", "right"), (True, False), (1 << 20, n + 1, n, n // 2)):
        stock.truncation_side = patched.truncation_side = side
        kw = dict(truncation=True, max_length=limit, add_special_tokens=ast)
        served.clear()
        _same(patched(prompt, **kw), stock(prompt, **kw))
        assert len(served) == 1 and served[0] is not None, kw
    stock.truncation_side = patched.truncation_side = "right"


def test_chat_turns_equal_stock(pair, real_texts):
    stock, patched = pair
    if stock.chat_template is None:
        pytest.skip("no chat template shipped for this tokenizer")
    prose, code = real_texts["english"], real_texts["code"]
    chat = [{"role": "system", "content": "You are terse."}]
    for turn in range(8):
        chat.append({"role": "user", "content": prose[turn * 1500:(turn + 1) * 1500] + " I'\u017f"})
        for kw in ({}, {"add_generation_prompt": True}, {"return_dict": True}):
            _same(patched.apply_chat_template(chat, tokenize=True, **kw),
                  stock.apply_chat_template(chat, tokenize=True, **kw))
        chat.append({"role": "assistant", "content": code[turn * 2500:(turn + 1) * 2500]})
    batch = [chat[:3], chat]
    _same(patched.apply_chat_template(batch, tokenize=True), stock.apply_chat_template(batch, tokenize=True))


def test_a_chat_call_as_vllm_makes_it_takes_the_ids_directly_and_leaves_what_stock_leaves(pair, real_texts,
                                                                                          monkeypatch):
    """``apply_chat_template(tokenize=True, return_dict=False)`` (vLLM's and SGLang's call) takes its
    IDs from the rendered text without transformers' BatchEncoding: the same list as stock, the
    same backend settings after it, the same too-long warning; every other call shape, or a class
    whose ``__call__`` is its own, takes stock's tokenize step."""
    stock, patched = pair
    if stock.chat_template is None:
        pytest.skip("no chat template shipped for this tokenizer")
    direct = []
    real = dropin_hf._chat_ids
    monkeypatch.setattr(dropin_hf, "_chat_ids", lambda *a: direct.append(1) or real(*a))
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": real_texts["english"][:3000]}]
    vllm_kw = dict(tools=None, chat_template=None, tokenize=True, return_dict=False, add_generation_prompt=True)
    for tok in (stock, patched):
        tok("abc", truncation=True, max_length=3)  # a previous call left truncation on the backend
    want = stock.apply_chat_template(conversation=chat, **vllm_kw)
    _same(patched.apply_chat_template(conversation=chat, **vllm_kw), want)
    assert direct == [1]
    assert patched._tokenizer.truncation == stock._tokenizer.truncation is None  # stock's tokenize step cleared it
    _same(patched.apply_chat_template(chat, **vllm_kw), want)  # the chat given positionally
    assert direct == [1, 1]
    key = "sequence-length-is-longer-than-the-specified-maximum"
    saved = stock.model_max_length, patched.model_max_length
    try:
        for tok in (stock, patched):
            tok.model_max_length = 16
            tok.deprecation_warnings.pop(key, None)
        _same(patched.apply_chat_template(chat, **vllm_kw), stock.apply_chat_template(chat, **vllm_kw))
        assert patched.deprecation_warnings.get(key) is stock.deprecation_warnings.get(key) is True
    finally:
        stock.model_max_length, patched.model_max_length = saved
    taken = len(direct)
    for kw in ({"return_dict": True}, {"truncation": True, "max_length": 40},
               {"padding": "max_length", "max_length": 4000},
               {"tokenizer_kwargs": {"return_attention_mask": False}}, {"tokenize": False}):
        _same(patched.apply_chat_template(chat, **{**vllm_kw, **kw}),
              stock.apply_chat_template(chat, **{**vllm_kw, **kw}))
    _same(patched.apply_chat_template([chat, chat[:1]], **vllm_kw),
          stock.apply_chat_template([chat, chat[:1]], **vllm_kw))
    assert len(direct) == taken  # none of those is the plain call

    class OwnCall(type(patched)):
        def __call__(self, *args, **kwargs):
            out = super().__call__(*args, **kwargs)
            out["input_ids"] = out["input_ids"][:5]
            return out
    own = copy.copy(patched)
    own.__class__ = OwnCall
    assert own.apply_chat_template(chat, **vllm_kw) == want[:5]  # its own __call__ ran, as in stock
    assert len(direct) == taken


def test_lazy_encoding_fields_are_the_references(pair, real_texts):
    stock, patched = pair
    t = "Hello  world!\n" + real_texts["multilingual"][:300]
    a, b = patched(t), stock(t)
    assert a.tokens() == b.tokens() and a.word_ids() == b.word_ids()
    assert [a.char_to_token(i) for i in range(0, len(t), 7)] == [b.char_to_token(i) for i in range(0, len(t), 7)]
    assert patched.tokenize(t) == stock.tokenize(t)


def test_uncovered_calls_fall_back_and_equal_stock(pair):
    stock, patched = pair
    t, u = "Hello world, again.", "And  a second\nsequence"
    for kw in ({"text_pair": u}, {"return_offsets_mapping": True}, {"return_special_tokens_mask": True},
               {"padding": "max_length", "max_length": 12}, {"split_special_tokens": True},
               {"truncation": True, "max_length": 4, "return_overflowing_tokens": True}):
        _same(patched(t, **kw), stock(t, **kw))
    _same(patched([t, u], padding=True), stock([t, u], padding=True))
    _same(patched([t.split(), u.split()], is_split_into_words=True), stock([t.split(), u.split()],
                                                                           is_split_into_words=True))
    added = stock.all_special_tokens[0]
    _same(patched(added + t, split_special_tokens=True), stock(added + t, split_special_tokens=True))
    _same(patched(added + t), stock(added + t))


def test_decode_and_decode_stream(pair, real_texts):
    from tokenizers.decoders import DecodeStream
    stock, patched = pair
    ids = patched.encode(real_texts["multilingual"][:500])
    assert patched.decode(ids) == stock.decode(ids)
    assert patched.decode(ids, skip_special_tokens=True) == stock.decode(ids, skip_special_tokens=True)
    assert patched.batch_decode([ids, ids[:5]]) == stock.batch_decode([ids, ids[:5]])
    streams = [DecodeStream(skip_special_tokens=False), DecodeStream(skip_special_tokens=False)]
    out = [[s.step(tok._tokenizer, i) for i in ids] for s, tok in zip(streams, (patched, stock))]
    assert out[0] == out[1]


def test_deepcopy_and_pickle_round_trip(pair, real_texts):
    stock, patched = pair
    t = real_texts["code"][:5000] + " I'\u017f"
    twin = copy.deepcopy(patched)
    assert is_wrapped(twin) and twin._tokenizer is not patched._tokenizer
    state, twin_state = (x.__dict__[dropin_hf.STATE_ATTR] for x in (patched, twin))
    assert twin_state.snapshot is state.snapshot and twin_state.backend is twin._tokenizer  # shared, no rebuild
    copies = [twin, copy.copy(patched)]
    if stock.name_or_path.endswith("glm-4"):  # a pickled tokenizer rebuilds its snapshot: seconds, so once
        back = pickle.loads(pickle.dumps(patched))
        assert is_wrapped(back)
        copies.append(back)
    for tok in copies:
        _same(tok(t), stock(t))
        assert tok.decode(tok.encode(t)) == stock.decode(stock.encode(t))
    out = pickle.loads(pickle.dumps(patched(t)))  # its encodings travel as the reference's
    assert dict(out) == dict(stock(t)) and out.tokens() == stock(t).tokens()  # (n_sequences is not pickled)


def test_backend_mutations_rebuild_the_snapshot(pairs):
    """add_tokens and add_bos_token change the backend; the next call must see the change (this
    test fails without the invalidating hooks: the snapshot would keep the old vocabulary)."""
    stock = copy.deepcopy(pairs("minimax-m3")[0])  # mutated below: a private copy
    patched = wrap_tokenizer(copy.deepcopy(stock), engine="reference")
    t = "say zqxjk_tok and zqxjk_tok twice"
    old = stock.encode(t)
    for tok in (stock, patched):
        tok.add_tokens(["zqxjk_tok"])
    assert stock.encode(t) != old  # the mutation matters
    assert patched.encode(t) == stock.encode(t)
    for tok in (stock, patched):
        tok.add_bos_token = True
    assert stock.encode(t)[0] == stock.bos_token_id
    assert patched.encode(t) == stock.encode(t)
    # an in-place change transformers does not see needs refresh()
    from tokenizers import processors
    for tok in (stock, patched):
        tok._tokenizer.post_processor = processors.TemplateProcessing(
            single="$A:0 " + stock.eos_token + ":0", special_tokens=[(stock.eos_token, stock.eos_token_id)])
    refresh(patched)
    assert patched.encode(t) == stock.encode(t) and stock.encode(t)[-1] == stock.eos_token_id


def test_backend_changed_in_place_is_seen_on_the_next_call(pairs):
    """The issue's case: ``tok.backend_tokenizer.add_tokens([...])`` and ``.normalizer = ...`` on a
    real tokenizer; the next encode, call and chat are stock's (tests/test_dropin_tripwire.py has
    every kind of change; this one fails with the snapshot kept as it was)."""
    from tokenizers import normalizers
    stock = copy.deepcopy(pairs("minimax-m3")[0])  # mutated below: a private copy
    patched = wrap_tokenizer(copy.deepcopy(stock), engine="reference")
    t = "Say zqxjk_tok, then HELLO World and Stra\u00dfe."
    chat = [{"role": "user", "content": t}]

    def outputs(tok):
        return [tok.encode(t), dict(tok(t)), dict(tok([t, t.upper()])), tok.apply_chat_template(chat, tokenize=True)]
    assert outputs(patched) == outputs(stock)
    for change in (lambda tok: tok.backend_tokenizer.add_tokens(["zqxjk_tok"]),
                   lambda tok: setattr(tok.backend_tokenizer, "normalizer",
                                       normalizers.Sequence([normalizers.NFKC(), normalizers.Lowercase()]))):
        old = outputs(stock)
        for tok in (stock, patched):
            change(tok)
        assert outputs(stock) != old  # the change matters
        assert outputs(patched) == outputs(stock)


def test_the_tripwire_holds_for_an_unchanged_backend(pair):
    """The fingerprints read the same twice for every test tokenizer: an unchanged backend is never
    snapshotted again (a new snapshot costs seconds)."""
    stock, patched = pair
    state = patched.__dict__[dropin_hf.STATE_ATTR]
    snap = state.current(patched)
    assert snap.tripwire.quick_holds(patched._tokenizer) and snap.tripwire.full_holds(patched._tokenizer)
    patched.backend_tokenizer  # noqa: B018 - a read that asks for a full check on the next call
    assert patched.encode("Hello world") == stock.encode("Hello world")
    assert state.current(patched) is snap


def test_sessions_by_default_and_the_old_content_reuse_spellings(pairs, real_texts):
    """Sessions are on by default (keyless texts continue their conversation, found by content);
    ``content_reuse=True``, the old opt-in, means the same; ``content_reuse=False``, the old default,
    keeps keyless calls stateless (test_dropin_sessions.py tests the sessions themselves)."""
    stock, default = pairs("qwen-3")
    snap = default.__dict__[dropin_hf.STATE_ATTR].current(default)
    assert snap.tokenizer.config.reuse == "session" and snap.sessions.content
    for content_reuse, kept in ((True, True), (False, False)):
        patched = wrap_tokenizer(copy.copy(stock), content_reuse=content_reuse, **SMALL_CUTS)  # its own state
        table = patched.__dict__[dropin_hf.STATE_ATTR].current(patched).sessions
        chat = []
        for turn in range(6):
            chat.append({"role": "user", "content": real_texts["english"][turn * 3000:(turn + 1) * 3000]})
            assert patched.apply_chat_template(chat, tokenize=True) == stock.apply_chat_template(chat, tokenize=True)
            chat.append({"role": "assistant", "content": real_texts["code"][turn * 3000:(turn + 1) * 3000]})
        assert (table.stats["continued"] >= 3) is kept and (len(table) == 1) is kept


# -- MiniMax-M3 " I'ſ": where fastokens' patch differs ------------------------------------------------------
LONG_S = [" I'\u017f", " I'\u017f x", "a I'\u017fLL", " I'\u017f\u017f", " You'\u017f", " I'\u212a", " I'S"]


def test_minimax_long_s_with_the_fast_tier(folders, pairs):
    """The drop-in with a guarded fastokens engine equals stock on the " I'ſ" family; the same
    drop-in with the unguarded engine does not (what the guard prevents); fastokens' own patch
    does not either."""
    fastokens = pytest.importorskip("fastokens", reason="the fast tier's engine (fastokens) is not installed")
    from transformers import AutoTokenizer

    from delta_ray._engine.engine import FastTier
    from delta_ray._engine.native import FastEncoder
    from delta_ray._verify.guard_probe import guard_set_for

    stock, patched = pairs("minimax-m3")
    loaded = patched.__dict__[dropin_hf.STATE_ATTR].current(patched).tokenizer.core.loaded
    live, ref = loaded.config_bytes, loaded.tokenizer  # the live backend's configuration
    fast = FastEncoder(live, "fastokens")
    guard = guard_set_for(live, fast, ref_tokenizer=ref, code_points=[0x17F, 0x212A, ord("I"), ord("S")])
    guarded = wrap_tokenizer(copy.copy(stock), encoder=FastTier(fast, guard))
    unguarded = wrap_tokenizer(copy.copy(stock), encoder=fast)
    want = [stock.encode(t) for t in LONG_S]
    assert want[0] == [2586, 158967]
    assert [guarded.encode(t) for t in LONG_S] == want
    assert [unguarded.encode(t) for t in LONG_S] != want  # the test can fail: the engine alone is wrong here

    fastokens.patch_transformers()
    try:
        theirs = AutoTokenizer.from_pretrained(folders["minimax-m3"])
    finally:
        fastokens.unpatch_transformers()
    assert theirs.encode(" I'\u017f") != want[0]  # [343, 39, 158967] with fastokens 0.3.5


# -- the list path: pieces on threads, joined in order ------------------------------------------------------
def test_list_path_on_threads_equals_stock(pairs, real_texts):
    """A long text's pieces encoded by the guarded fast engine on several threads, each converted to a
    list where it was encoded, joined in order (``TokenizerCore.encode_list``): equal to stock, with
    guarded code points inside some pieces (those go to the reference)."""
    pytest.importorskip("fastokens", reason="the fast tier's engine (fastokens) is not installed")
    from delta_ray._core.parallel_encode import MIN_PARALLEL_CHARS
    from delta_ray._engine.engine import FastTier
    from delta_ray._engine.native import FastEncoder
    from delta_ray._verify.guard_probe import guard_set_for

    for name in ("qwen-3", "llama3.2"):  # no template / a BOS template
        stock, patched = pairs(name)
        loaded = patched.__dict__[dropin_hf.STATE_ATTR].current(patched).tokenizer.core.loaded
        fast = FastEncoder(loaded.config_bytes, "fastokens")
        guard = guard_set_for(loaded.config_bytes, fast, ref_tokenizer=loaded.tokenizer, code_points=[0x17F, 0xE9])
        tok = wrap_tokenizer(copy.copy(stock), encoder=FastTier(fast, guard),
                             sessions=False, **SMALL_CUTS)  # the stateless list path (sessions: their own tests)
        core = tok.__dict__[dropin_hf.STATE_ATTR].current(tok).tokenizer.core
        prose, code = real_texts["english"], real_texts["code"]
        texts = [prose[:80000], prose[:9000] + " I'\u017f caf\u00e9 " + code[:70000] + "\u017f",
                 code[:40000] + real_texts["multilingual"][:30000]]
        # long enough for threads, and cut in more pieces than threads (so the order of joining matters)
        assert all(len(t) >= MIN_PARALLEL_CHARS and len(core.plan(t, 8).cuts) >= 4 for t in texts)
        for t in texts:
            for ast in (True, False):
                got = tok.encode(t, add_special_tokens=ast)
                assert type(got) is list and got == stock.encode(t, add_special_tokens=ast)
            _same(tok(t), stock(t))
        assert core.stats["chunked"] >= 2 * len(texts)  # the threaded list path ran
        assert guard.positions(texts[1]).size  # and one text held guarded code points


def test_list_path_takes_over_a_late_helper_and_raises_errors():
    """``PieceThreads.encode_list``: a helper stuck in its piece does not hold the call (the caller
    encodes that piece itself; the same IDs, in order); a piece the engine rejects raises."""
    import threading

    from delta_ray._core.parallel_encode import PieceThreads

    caller, release = threading.get_ident(), threading.Event()

    class StuckHelper:  # a helper thread's first piece blocks until the test releases it
        name = "fake"

        def encode_lists(self, texts):  # no list entry point: the flat path converts
            return None

        def encode_flat(self, texts):
            from delta_ray._core.assembly import flat_from_pieces
            return flat_from_pieces(self.encode_pieces(texts))

        def encode_pieces(self, texts):
            if any("!" in t for t in texts):
                raise ValueError("rejected")
            ids = [np.frombuffer(t.encode("utf-32-le"), dtype=np.int32).copy() for t in texts]
            if threading.get_ident() != caller and not release.wait(5):
                return [-a for a in ids]  # marks an answer the caller waited for (it should not have)
            return ids

    pieces = [chr(65 + i) * 20000 for i in range(6)]
    threads = PieceThreads()
    try:
        got = threads.encode_list(StuckHelper(), pieces, 2)
        assert not release.is_set()  # returned while the helper was still stuck in its piece
        assert got == [ord(c) for p in pieces for c in p]
        release.set()
        with pytest.raises(ValueError):
            threads.encode_list(StuckHelper(), pieces[:3] + ["!" * 20000] + pieces[3:], 2)
    finally:
        release.set()
