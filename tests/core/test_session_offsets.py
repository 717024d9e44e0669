"""A session's character offsets (``Sessions.session_offsets``, ``delta_ray/_core/offsets.py``,
docs/proof.md §17) against the reference's own offsets of the whole text.

* Every turn of a conversation (appends, added tokens, multi-byte and combining characters, runs of
  spaces, a rewritten tail, a replay, an unrelated text) gives the reference's IDs and offsets of
  the whole text, with and without special tokens, on every development tokenizer whose offsets
  splice, with the reference and the fast tier, and the warm turns re-encode only their tail.
* Under NFC (qwen-3, minimax-m3) the same holds on texts dense in what NFC composes, reorders or
  leaves apart (precomposed and decomposed letters, Hangul jamo, nuktas, stacked marks, singletons),
  and a splice starts only at a checkpoint whose character is an NFC anchor in both texts.
* The zoo's kinds whose offsets splice (Tekken, GPT-2, DeepSeek V2, Gemma 4, Llama 2) pass the
  same turns, and so does a ``ByteLevel`` post-processor that trims offsets without
  ``add_prefix_space``; refused configurations answer None.
* Controls: under a ``ByteLevel`` post-processor that trims offsets with ``add_prefix_space``, and
  under Phi-3's ``Prepend`` normalizer, the offsets of the piece after a cut are not the whole
  text's, so each refusal is needed; a fast tier whose tail IDs the reference does not give is
  disabled by the offsets call.
"""
from __future__ import annotations

import json

import numpy as np
import pytest
from tools.wrong_engine import WrongEngine

from delta_ray import DeltaTokenizer
from delta_ray._core.encoder import ReferenceEncoder
from delta_ray._core.loading import load_tokenizer
from delta_ray._core.offsets import offsets_refusal, splice_offsets, splice_starts
from delta_ray._core.reference_api import FULL_API
from delta_ray._tokenizer_core import TokenizerCore
from exactness import accepted_cuts

pytestmark = pytest.mark.skipif(not FULL_API, reason="tokenizers 1.x's encodings carry no offsets")
CUTS = {"cut_threshold": 4096, "chunk_size": 2048}
SPLICED = ("llama3.2", "glm-4", "deepseek-v3", "qwen-3", "qwen-3.5", "minimax-m3")  # every development tokenizer
NFC = ("qwen-3", "qwen-3.5", "minimax-m3")
# What NFC composes, reorders, decomposes or leaves apart: precomposed and decomposed letters, Hangul
# jamo (L V T and LV T), a nukta and its composition exclusion, marks out of canonical order, a
# singleton (the angstrom sign), a mark that decomposes into two, Oriya's two-part vowel, a kana
# voicing mark, a mark after a space, and a mark that composes with nothing.
NFC_BITS = ("caf\u00e9", "cafe\u0301", "\u1100\u1161\u11a8", "\uac00\u11a8", "\u0915\u093c", "\u0958",
            "a\u0323\u0301", "a\u0301\u0323", "\u212b", "\u0344", "o\u0308\u0304", "\u0b47\u0b3e",
            "\u304b\u3099", " \u0301", "x\u0335\u0301", "\u1e9b\u0323", "\u00c5\u030a")


def _turns(real_texts, specials: list[str]) -> list[str]:
    """A conversation's texts, each the next call's whole text."""
    prose, code = real_texts["english"], real_texts["code"]
    sp = specials[0] if specials else ""
    t0 = prose[:20000]
    t1 = t0 + " " + code[:3000]
    t2 = t1 + sp + "  several   spaces\n\n\tcaf\u00e9 e\u0301 \u65e5\u672c\u8a9e \U0001f642 " + sp + " x"
    t3 = t2 + prose[20000:21500]
    t4 = t3[:-700] + " a rewritten tail" + sp
    t5 = "unrelated start " + t4[:9000]
    t6 = t5 + code[3000:5000] + " I'\u017f"
    return [t0, t1, t2, t3, t3, t4, t5, t6]


def _specials(ref) -> list[str]:
    return sorted(t.content for t in ref.get_added_tokens_decoder().values() if t.special)[:2]


def _check_turns(dt, ref, texts) -> None:
    sessions = dt.core.sessions
    for i, text in enumerate(texts):
        for add in (True, False):
            got = sessions.session_offsets("conv", text, add)
            want = ref.encode(text, add_special_tokens=add)
            assert got is not None, (i, add)
            ids, offsets = got
            assert ids == want.ids, (i, add)
            assert offsets == want.offsets, (i, add)


def _counting(monkeypatch) -> list[int]:
    """The length of every text the reference is asked for offsets of, from now on."""
    asked: list[int] = []
    encode_offsets = ReferenceEncoder.encode_offsets

    def counting(self, text):
        asked.append(len(text))
        return encode_offsets(self, text)

    monkeypatch.setattr(ReferenceEncoder, "encode_offsets", counting)
    return asked


def _spliced(tok_name, engine, tokenizer_paths, references, monkeypatch):
    """The reference, a delta-ray tokenizer whose offsets splice, and the lengths the reference is
    asked for offsets of from now on (skipped where the installed tokenizers refuses the file)."""
    if tok_name not in references:
        pytest.skip(f"{tok_name} is not among this run's tokenizers")
    dt = DeltaTokenizer(tokenizer_paths[tok_name], engine=engine, shadow_rate=0.0, **CUTS)
    assert dt.core.sessions.offsets_refusal is None
    return references[tok_name], dt, _counting(monkeypatch)


@pytest.mark.parametrize("engine", ["reference", "auto"])
@pytest.mark.parametrize("tok_name", SPLICED)
def test_every_turn_gives_the_references_offsets(tok_name, engine, tokenizer_paths, references, real_texts,
                                                 monkeypatch):
    """Turns of one session give the reference's IDs and offsets of each whole text, with and
    without special tokens; a warm turn asks the reference only for its tail."""
    ref, dt, asked = _spliced(tok_name, engine, tokenizer_paths, references, monkeypatch)
    texts = _turns(real_texts, _specials(ref))
    _check_turns(dt, ref, texts)
    assert dt.stats["offsets_mismatch"] == 0
    # the first turn encodes its whole text; the appends after it only what follows a checkpoint
    assert asked[0] == len(texts[0]) and max(asked[2:4]) < 8000, asked


def _nfc_turns(real_texts, seed: int) -> list[str]:
    """A conversation whose texts are dense in :data:`NFC_BITS`, next to spaces, newlines and each
    other, so that checkpoints fall beside them."""
    rng = np.random.default_rng(seed)
    words = (real_texts["english"][:30000] + real_texts["code"][:10000]).split(" ")

    def chunk(n: int) -> str:
        out = []
        for w in rng.choice(len(words), n):
            out.append(words[w])
            if rng.random() < 0.4:
                out.append(NFC_BITS[rng.integers(len(NFC_BITS))] + ("\n" if rng.random() < 0.2 else ""))
        return " ".join(out)

    texts = [chunk(3000)]
    for _ in range(6):
        texts.append(texts[-1] + ("" if rng.random() < 0.5 else " ") + chunk(150))
    texts.append(texts[-1][:-900] + chunk(100))  # a rewritten tail
    texts.append(texts[-1] + NFC_BITS[3][1:] + chunk(50))  # a jamo continuing the last character
    return texts


@pytest.mark.parametrize("engine", ["reference", "auto"])
@pytest.mark.parametrize("tok_name", NFC)
def test_nfc_turns_dense_in_compositions_give_the_references_offsets(tok_name, engine, tokenizer_paths,
                                                                     references, real_texts, monkeypatch):
    """Under an NFC normalizer, turns over texts dense in what NFC composes and reorders give the
    reference's IDs and offsets, and the warm appends still ask the reference only for a tail."""
    ref, dt, asked = _spliced(tok_name, engine, tokenizer_paths, references, monkeypatch)
    for seed in (1, 2):
        texts = _nfc_turns(real_texts, seed)
        del asked[:]
        _check_turns(dt, ref, texts)
        assert asked[0] == len(texts[0]) and max(asked[2:6]) < 8000, (seed, asked)
    assert dt.stats["offsets_mismatch"] == 0


def test_an_nfc_splice_starts_only_at_an_anchor_of_both_texts(tokenizer_paths, references, real_texts, monkeypatch):
    """:func:`splice_starts`: under NFC a splice may start where the character is an anchor in the
    new text and in the kept offsets' text (or either's end), nowhere else; without NFC, anywhere.
    ``splice_offsets`` passes over a checkpoint it may not start at and splices at an earlier one
    (asking the reference for a longer tail), still the reference's offsets."""
    ref = references["qwen-3"]
    dt = DeltaTokenizer(tokenizer_paths["qwen-3"], engine="reference", shadow_rate=0.0, **CUTS)
    pred, sessions = dt.core.predicate, dt.core.sessions
    reference = ReferenceEncoder(dt.core.loaded)
    assert splice_starts(DeltaTokenizer(tokenizer_paths["llama3.2"], engine="reference").core.predicate,
                         "e\u0301", None) is None
    starts = splice_starts(pred, "ab\u0301 c", None)
    assert [starts(i) for i in range(6)] == [True, True, False, True, True, True]
    head = real_texts["english"][:9000]
    sessions.session_offsets("s", head + " \u0301x", False)
    previous = sessions.store.peek("s")
    starts = splice_starts(pred, head + " yx more", previous)  # ' ' in both, then U+0301 against 'y'
    n = len(head)
    assert starts(n) and not starts(n + 1) and starts(n + 3) and starts(n + 8)

    # A turn whose last checkpoint is refused: the splice starts at the one before it.
    text = head + " and then some more words"
    ids, _ = sessions.session_list("t", text, False)
    new = sessions.store.peek("t")
    cps = [int(p) for p, t in zip(new.cp_pos, new.cp_tok) if t <= len(ids)]
    assert len(cps) >= 2
    want = ref.encode(text, add_special_tokens=False)
    whole = np.asarray(want.offsets, dtype=np.int32)
    asked = _counting(monkeypatch)
    encode_offsets = reference.encode_offsets  # counted from here on
    got = splice_offsets(text, new, len(ids), whole, encode_offsets)
    assert got.tolist() == [list(o) for o in want.offsets] and asked == [len(text) - cps[-1]]
    del asked[:]
    got = splice_offsets(text, new, len(ids), whole, encode_offsets,
                         lambda pos: pos != cps[-1])
    assert got.tolist() == [list(o) for o in want.offsets] and asked == [len(text) - cps[-2]]
    del asked[:]
    assert splice_offsets(text, new, len(ids), whole, encode_offsets,
                          lambda pos: False).tolist() == whole.tolist() and asked == [len(text)]


def _trimming(tokenizer_paths, tmp_path, add_prefix_space: bool = True) -> str:
    """llama3.2 with its ByteLevel post-processor trimming offsets (add_prefix_space as shipped, or off)."""
    cfg = json.loads(open(tokenizer_paths["llama3.2"], encoding="utf-8").read())
    for p in cfg["post_processor"]["processors"]:
        if p["type"] == "ByteLevel":
            assert p["add_prefix_space"] is True
            p["trim_offsets"] = True
            p["add_prefix_space"] = add_prefix_space
    path = tmp_path / f"trimming-{add_prefix_space}.json"
    path.write_text(json.dumps(cfg), encoding="utf-8")
    return str(path)


def test_control_a_post_processor_that_trims_with_add_prefix_space_is_needed(tokenizer_paths, real_texts,
                                                                             tmp_path):
    """With ``trim_offsets`` and ``add_prefix_space``, the reference keeps the one leading space of
    an encode's first token: spliced at a checkpoint, a tail that starts with `` word`` would keep
    it where the whole text's token drops it. The configuration is refused, and without the refusal
    the splice is wrong on the same turns."""
    from tokenizers import Tokenizer
    path = _trimming(tokenizer_paths, tmp_path)
    ref = Tokenizer.from_file(path)
    dt = DeltaTokenizer(path, engine="reference", **CUTS)
    sessions = dt.core.sessions
    assert "trims offsets" in (sessions.offsets_refusal or "")
    texts = _turns(real_texts, _specials(ref))
    assert sessions.session_offsets("s", texts[0], False) is None
    sessions.__dict__["offsets_refusal"] = None  # the refusal bypassed
    wrong = 0
    for text in texts:
        ids, offsets = sessions.session_offsets("s", text, False)
        want = ref.encode(text, add_special_tokens=False)
        assert ids == want.ids
        wrong += offsets != want.offsets
    assert wrong


def test_a_post_processor_that_trims_without_add_prefix_space_splices(tokenizer_paths, real_texts, tmp_path):
    """Trimming alone is a function of each token: such a configuration's turns give the reference's
    offsets (which differ from the untrimmed ones on these texts)."""
    from tokenizers import Tokenizer
    path = _trimming(tokenizer_paths, tmp_path, add_prefix_space=False)
    ref = Tokenizer.from_file(path)
    dt = DeltaTokenizer(path, engine="reference", shadow_rate=0.0, **CUTS)
    assert dt.core.sessions.offsets_refusal is None
    texts = _turns(real_texts, _specials(ref))
    _check_turns(dt, ref, texts)
    plain = Tokenizer.from_file(tokenizer_paths["llama3.2"])
    assert ref.encode(texts[1]).offsets != plain.encode(texts[1]).offsets


def test_a_wrong_tail_disables_the_fast_tier(tokenizer_paths, references, real_texts):
    """The offsets call checks the reference's IDs of the tail it encodes against the turn's: a fast
    tier that gave other IDs is disabled (its sessions purged) and the call answers None."""
    path = tokenizer_paths["llama3.2"]
    core = TokenizerCore(path, encoder=WrongEngine(references["llama3.2"]), shadow_rate=0.0, **CUTS)
    sessions = core.sessions
    text = real_texts["english"][:12000]
    sessions.session_offsets("s", text, False)  # the first call's whole encode: the tier's IDs are wrong
    assert core.engine.disabled_reason is not None and "offsets" in core.engine.disabled_reason
    assert core.stats["offsets_mismatch"] == 1
    got = sessions.session_offsets("s", text + " more", False)  # the reference now: exact
    want = references["llama3.2"].encode(text + " more", add_special_tokens=False)
    assert got == (want.ids, want.offsets)


def test_offsets_are_kept_with_the_state_and_go_with_it(tokenizer_paths, real_texts):
    """The offsets live beside their state in the store, counted in its bytes, and go when a turn
    without offsets replaces the state, and with an eviction."""
    dt = DeltaTokenizer(tokenizer_paths["llama3.2"], engine="reference", **CUTS)
    sessions, store = dt.core.sessions, dt.core.sessions.store
    text = real_texts["english"][:10000]
    before = store.resident_bytes
    ids, _ = sessions.session_offsets("s", text, False)
    state = store.peek("s")
    kept = store.kept_offsets("s", state.version)
    assert kept is not None and kept.shape == (len(ids), 2) and kept.dtype == np.int32
    assert store.resident_bytes - before >= kept.nbytes
    sessions.session_list("s", text + " next", False)  # a turn without offsets: a new state
    assert store.kept_offsets("s", state.version) is None and store.kept_offsets("s", store.peek("s").version) is None
    sessions.session_offsets("s", text, False)
    sessions.drop_session("s")
    assert store.resident_bytes == before


zoo = pytest.importorskip("bench.zoo")
KINDS = ("mistral-tekken-240911", "gguf-gpt-2", "otc-deepseek-v2", "gguf-gemma-4", "gguf-llama-spm")


@pytest.fixture(scope="module")
def folders():
    return zoo.build()


@pytest.mark.parametrize("kind", KINDS)
def test_the_zoos_kinds_give_the_references_offsets(kind, folders, real_texts):
    """Tekken, GPT-2, DeepSeek V2, Gemma 4 and Llama 2 (SentencePiece BPE behind a Metaspace or
    one-character maps) splice."""
    path = folders[kind]
    ref = load_tokenizer(path).tokenizer
    dt = DeltaTokenizer(path, engine="reference", shadow_rate=0.0, **CUTS)
    if dt.core.sessions.offsets_refusal is not None:
        pytest.fail(f"{kind}: {dt.core.sessions.offsets_refusal}")
    _check_turns(dt, ref, _turns(real_texts, _specials(ref)))


def test_control_a_prepend_normalizer_is_refused_and_needs_to_be(folders):
    """Phi-3's ``Prepend`` writes back the ``▁`` the piece after a cut leaves out, aligned to the
    piece's first character: the whole text's token starts one character earlier. Refused, and at
    every accepted cut of these texts the piece's first offset is not the whole text's."""
    path = folders["gguf-phi-3"]
    ref = load_tokenizer(path).tokenizer
    dt = DeltaTokenizer(path, engine="reference", **CUTS)
    pred = dt.core._predicate
    assert offsets_refusal(pred, None) is not None and "Prepend" in dt.core.sessions.offsets_refusal
    texts = ["hello world and more", "a b c d", "two  spaces here", "<|user|>\n hi there<|end|>\n ok now"]
    pairs = [(t, b) for t in texts for b in accepted_cuts(pred, t)]
    assert len(pairs) >= 5
    for t, b in pairs:
        whole = ref.encode(t, add_special_tokens=False)
        left = ref.encode(t[:b], add_special_tokens=False)
        right = ref.encode(t[b + 1:], add_special_tokens=False)
        assert whole.ids == left.ids + right.ids  # the IDs splice (the skip) ...
        k = len(left.ids)
        assert whole.offsets[k][0] == b != right.offsets[0][0] + b + 1  # ... the offsets do not
