"""The drop-in's tripwire: a transformers backend changed in place (``tok.backend_tokenizer.x = ...``,
``tok._tokenizer.add_tokens(...)``, a component's attribute, a replaced model) makes the wrapped
tokenizer's IDs those of stock transformers again: a token added, on the next call; a change made
through ``tok.backend_tokenizer``, on the next call; any other, within ``check_every`` calls (or on
the next long call). Each test fails with the snapshot kept as it was.

A small byte-level BPE trained here stands in for a real tokenizer (a re-snapshot of a bundled one
takes seconds); test_dropin.py checks the issue's changes on a bundled tokenizer.
"""
from __future__ import annotations

import copy

import pytest

transformers = pytest.importorskip("transformers", reason="the drop-in tests need transformers 5.23: "
                                                          "pip install 'transformers==5.23.*' (the test extra)")

from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers  # noqa: E402

from delta_ray.apps.dropin import hf as dropin_hf  # noqa: E402
from delta_ray.apps.dropin import is_wrapped, wrap_tokenizer  # noqa: E402
from delta_ray.apps.dropin.tripwire import MAX_EVERY, Tripwire, fingerprint  # noqa: E402

pytestmark = pytest.mark.skipif(not transformers.__version__.startswith("5."),
                                reason=f"the drop-in hooks transformers 5 (found {transformers.__version__})")

CORPUS = ["Hello world, the quick brown fox jumps over the lazy dog. Tokenization of tokens, twice: tokens!",
          "Caf\u00e9 na\u00efve r\u00e9sum\u00e9 \u2014 hello HELLO Hello; 12345 67890 and more words here."] * 40
TEXTS = ["hello world", "Hello  world, the quick brown fox!", "zqx tokens HELLO caf\u00e9", "a  b\n\nc   d",
         "helloworld the tokenization", "CAF\u00c9 Caf\u00e9 cafe\u0301"]
TEMPLATE = "{% for m in messages %}<s>{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
CHAT = [{"role": "user", "content": "hello world, the quick brown fox"},
        {"role": "assistant", "content": "zqx tokens HELLO caf\u00e9"}]


def _backend() -> Tokenizer:
    tk = Tokenizer(models.BPE())
    tk.normalizer = normalizers.NFC()
    tk.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(" ", "isolated"),
                                                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tk.decoder = decoders.ByteLevel()
    tk.train_from_iterator(CORPUS, trainers.BpeTrainer(vocab_size=400, special_tokens=["<s>", "</s>"],
                                                       initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tk.post_processor = processors.ByteLevel(trim_offsets=False)
    return tk


@pytest.fixture(scope="module")
def original():
    stock = transformers.PreTrainedTokenizerFast(tokenizer_object=_backend(), bos_token="<s>", eos_token="</s>")
    stock.chat_template = TEMPLATE
    return stock


def _pair(original, check_every: int, **options):
    stock = copy.deepcopy(original)
    patched = wrap_tokenizer(copy.deepcopy(original), engine="reference", check_every=check_every, **options)
    assert is_wrapped(patched)
    return stock, patched


@pytest.fixture
def pair(original):
    """(stock, wrapped): two equal tokenizers with their own backends; the test changes both alike.
    No full check comes by count here (``check_every`` = the maximum), so what a test sees on the
    next call was seen by the quick check, the ``backend_tokenizer`` hook or transformers' hooks."""
    return _pair(original, MAX_EVERY)


@pytest.fixture
def pair8(original):
    """The same with a full check every 8 calls."""
    return _pair(original, 8)


def _state(tok) -> dropin_hf.DropinState:
    return tok.__dict__[dropin_hf.STATE_ATTR]


def _outputs(tok) -> list:
    """What a caller sees on the drop-in's paths: encode, __call__ (one text, a batch), a chat."""
    out = [tok.encode(t) for t in TEXTS] + [tok.encode(t, add_special_tokens=False) for t in TEXTS]
    out += [dict(tok(TEXTS[1])), dict(tok(TEXTS)), tok.apply_chat_template(CHAT, tokenize=True)]
    return out


def _served(tok) -> int:
    """Texts the wrapped tokenizer's current snapshot has encoded (the delta-ray path ran)."""
    return sum(_state(tok).snapshot.tokenizer.stats.values())


def _both(pair, change) -> None:
    for tok in pair:
        change(tok)


def test_the_small_tokenizer_is_served_by_delta_ray(pair):
    stock, patched = pair
    before = _served(patched)
    assert _outputs(patched) == _outputs(stock)
    assert _served(patched) > before


# -- a token added to the backend: on the next call ---------------------------------------------------
@pytest.mark.parametrize("method", ["add_tokens", "add_special_tokens"])
def test_a_token_added_to_the_backend_is_seen_on_the_next_call(pair, method):
    stock, patched = pair
    assert _outputs(patched) == _outputs(stock)
    old = _outputs(stock)
    _both(pair, lambda tok: getattr(tok._tokenizer, method)(["zqx tok", AddedToken("HELLO", single_word=True)]))
    assert _outputs(stock) != old  # the change matters
    assert _outputs(patched) == _outputs(stock)


# -- changes made through tok.backend_tokenizer: on the next call -------------------------------------
def _normalizer(tok):
    tok.backend_tokenizer.normalizer = normalizers.Sequence([normalizers.NFC(), normalizers.Lowercase()])


def _pre_tokenizer(tok):
    tok.backend_tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)


def _post_processor(tok):
    tok.backend_tokenizer.post_processor = processors.TemplateProcessing(
        single="<s> $A </s>", special_tokens=[("<s>", 0), ("</s>", 1)])


def _component_attribute(tok):
    tok.backend_tokenizer.pre_tokenizer[1].add_prefix_space = True  # the Sequence's ByteLevel, in place


def _model(tok):
    vocab = tok.backend_tokenizer.get_vocab(with_added_tokens=False)
    tok.backend_tokenizer.model = models.WordLevel(vocab, unk_token="<s>")


def _model_kept_size(tok):
    """A model of the same kind and size, its vocabulary in another order (only its entries differ)."""
    vocab = tok.backend_tokenizer.get_vocab(with_added_tokens=False)
    order = ["<s>", "</s>"] + sorted(set(vocab) - {"<s>", "</s>"}, key=lambda t: (-len(t), t))
    tok.backend_tokenizer.model = models.BPE({t: i for i, t in enumerate(order)}, [])


def _token_in_the_vocabulary(tok):
    tok.backend_tokenizer.add_tokens(["ll"])  # a model token already (not a new ID): "hello" splits at it


CHANGES = [_normalizer, _pre_tokenizer, _post_processor, _component_attribute, _model,
           _model_kept_size, _token_in_the_vocabulary]


@pytest.mark.parametrize("change", CHANGES, ids=lambda f: f.__name__.strip("_"))
def test_a_change_made_through_backend_tokenizer_is_seen_on_the_next_call(pair, change):
    stock, patched = pair
    assert _outputs(patched) == _outputs(stock)
    old = _outputs(stock)
    _both(pair, change)
    assert _outputs(stock) != old  # the change matters
    assert _outputs(patched) == _outputs(stock)


def test_new_flags_of_an_added_token_are_seen_on_the_next_call(pair):
    """Adding an added token again with other flags changes no ID the quick check reads."""
    stock, patched = pair
    _both(pair, lambda tok: tok.backend_tokenizer.add_tokens(["ll"]))
    assert _outputs(patched) == _outputs(stock)
    old = _outputs(stock)
    _both(pair, lambda tok: tok.backend_tokenizer.add_tokens([AddedToken("ll", single_word=True)]))
    assert _outputs(stock) != old
    assert _outputs(patched) == _outputs(stock)


def test_a_model_setting_changed_in_place_is_seen_on_the_next_call(pair):
    """tokenizers' BPE keeps the words it has cached as they were when a setting of its model
    changes in place, so stock itself answers the old way for those: compared on new words."""
    stock, patched = pair
    fresh = ["quirky zebras vexed jumbo wizards", "Jinxed grumpy folks quizzed", "boxing gloves"]
    old = [copy.deepcopy(stock).encode(t) for t in fresh]  # a copy: stock's own BPE caches none of them
    _both(pair, lambda tok: setattr(tok.backend_tokenizer.model, "end_of_word_suffix", "ing"))
    want = [stock.encode(t) for t in fresh]
    assert want != old
    assert [patched.encode(t) for t in fresh] == want


def test_a_backend_no_snapshot_can_serialize_falls_back_to_stock(pair):
    """A Python pre-tokenizer (tokenizers cannot serialize it): the wrapped tokenizer encodes as
    stock from then on, with no error of its own."""
    stock, patched = pair

    class Words:
        def pre_tokenize(self, pretok):
            pretok.split(lambda i, s: s.split(" ", "removed"))

    old = _outputs(stock)
    _both(pair, lambda tok: setattr(tok.backend_tokenizer, "pre_tokenizer",
                                    pre_tokenizers.PreTokenizer.custom(Words())))
    assert _outputs(stock) != old
    assert _outputs(patched) == _outputs(stock)
    assert not is_wrapped(patched)  # disabled: stock serves it


def test_a_backend_whose_serialization_does_not_load_falls_back_to_stock(pair):
    """A model setting tokenizers accepts in place but its own loader then panics on (pyo3's
    PanicException is no Exception): stock serves, and the panic reaches no caller."""
    stock, patched = pair
    fresh = ["quirky zebras vexed jumbo wizards", "Jinxed grumpy folks quizzed"]
    old = [copy.deepcopy(stock).encode(t) for t in fresh]
    _both(pair, lambda tok: setattr(tok.backend_tokenizer.model, "continuing_subword_prefix", "##"))
    want = [stock.encode(t) for t in fresh]
    assert want != old
    assert [patched.encode(t) for t in fresh] == want
    assert not is_wrapped(patched)


# -- changes through a backend held from before: within check_every calls, or on a long call -----------
def _lowercase(backend) -> None:
    backend.normalizer = normalizers.Sequence([normalizers.NFC(), normalizers.Lowercase()])


def test_a_change_through_a_held_backend_is_seen_within_check_every_calls(pair8):
    """Code that kept the backend object (``tok._tokenizer``, or ``backend_tokenizer`` read before
    the last call) reads no property when it changes it: the full check every ``check_every`` (8
    here) calls sees it; until then calls may still use the old snapshot."""
    stock, patched = pair8
    held = [tok.backend_tokenizer for tok in pair8]
    patched.encode("x")  # the check that reading backend_tokenizer asked for has run
    text = "Hello HELLO World"
    old = stock.encode(text)
    for backend in held:
        _lowercase(backend)
    want = stock.encode(text)
    assert want != old
    got = [patched.encode(text) for _ in range(_state(patched).snapshot.tripwire.every)]
    assert got[-1] == want
    assert all(ids == want for ids in got[got.index(want):])  # once seen, kept


@pytest.mark.parametrize("sessions", [False, True])
def test_a_long_call_is_checked_in_full(original, sessions):
    """A long stateless call runs the full check (it costs far more than the check); a session turn
    does not count its length (it costs its change), so a long one is seen by the count instead."""
    stock, patched = _pair(original, 8, sessions=sessions)
    held = [stock.backend_tokenizer, patched.backend_tokenizer]
    patched.encode("x")  # a full check (asked for by the read above): the next full one by count is 8 calls away
    long = "Hello HELLO World. " * (_state(patched).snapshot.tripwire.long_chars // 19 + 1)
    old = stock.encode(long)
    for backend in held:
        _lowercase(backend)
    assert stock.encode(long) != old
    if sessions:  # seen by the count: within check_every calls
        for _ in range(8):
            patched.encode("x")
    assert patched.encode(long) == stock.encode(long)


def test_an_unchanged_backend_is_not_snapshotted_again(pair8):
    """Many calls, full checks, reads of backend_tokenizer, decoding: one snapshot throughout."""
    stock, patched = pair8
    snap = _state(patched).snapshot
    for i in range(5 * snap.tripwire.every):
        assert patched.encode(TEXTS[i % len(TEXTS)]) == stock.encode(TEXTS[i % len(TEXTS)])
        if i % 7 == 0:
            patched.backend_tokenizer.get_vocab_size()
            patched.decode(patched.encode(TEXTS[0]))
    assert _state(patched).snapshot is snap
    assert Tripwire(patched._tokenizer).full == snap.tripwire.full == fingerprint(patched._tokenizer)


def test_a_copy_checks_its_own_backend(pair8):
    """copy.deepcopy shares the snapshot but not the count of calls: a change to the copy's backend
    is seen on the copy's own calls, however many the original makes."""
    stock, patched = pair8
    twin = copy.deepcopy(patched)
    assert _state(twin).snapshot is _state(patched).snapshot
    text = "Hello HELLO World"
    old = stock.encode(text)
    _lowercase(stock._tokenizer)
    _lowercase(twin._tokenizer)
    for _ in range(3 * _state(patched).snapshot.tripwire.every):
        assert patched.encode(text) == old  # the original's backend did not change
    got = [twin.encode(text) for _ in range(_state(twin).snapshot.tripwire.every)]
    assert got[-1] == stock.encode(text) != old


# -- transformers' own mutators: on the next call (hooks) ---------------------------------------------
def _add_tokens(tok):
    tok.add_tokens(["ll"])  # a model token already: no new ID for the quick check to see


def _add_special_tokens(tok):
    tok.add_special_tokens({"additional_special_tokens": ["ll"]})


def _add_bos_token(tok):
    tok.add_bos_token = True


@pytest.mark.parametrize("change", [_add_tokens, _add_special_tokens, _add_bos_token], ids=lambda f: f.__name__[1:])
def test_transformers_own_mutators_are_seen_on_the_next_call(pair, change):
    stock, patched = pair
    old = _outputs(stock)
    _both(pair, change)
    assert _outputs(stock) != old
    assert _outputs(patched) == _outputs(stock)


def test_check_every_is_checked():
    with pytest.raises(TypeError):
        wrap_tokenizer(None, check_every=2.0)
    with pytest.raises(TypeError):
        wrap_tokenizer(None, check_every=True)
    with pytest.raises(ValueError):
        wrap_tokenizer(None, check_every=0)
