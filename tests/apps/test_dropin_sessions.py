"""The drop-in's sessions (``delta_ray.apps.dropin.sessions``): a one-text encode continues its
conversation, keyed by ``request_scope`` or found by content, and every answer equals stock
transformers': continuations, templates that rewrite their tail (qwen-3.5's ``<think>``, qwen-3
dropping earlier reasoning), tool messages, truncation, ``add_special_tokens`` mixes, tenants,
callers that mutate what they got, states replaced behind the table's back, bounds.

Most tests run the reference engine (the session logic does not depend on it); one runs the guarded
fast engine, whose continuation is the core's compact turn.
"""
from __future__ import annotations

import contextlib
import copy
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

transformers = pytest.importorskip("transformers", reason="the drop-in tests need transformers 5.23: "
                                                          "pip install 'transformers==5.23.*' (the test extra)")

from delta_ray import request_scope  # noqa: E402
from delta_ray._core.constants import KEYLESS_CANDIDATES  # noqa: E402
from delta_ray._core.id_lists import list_bytes  # noqa: E402
from delta_ray._core.keys import session_key  # noqa: E402
from delta_ray.apps.dropin import hf as dropin_hf  # noqa: E402
from delta_ray.apps.dropin import sessions as dropin_sessions  # noqa: E402
from delta_ray.apps.dropin import unpatch_transformers, wrap_tokenizer  # noqa: E402
from delta_ray.apps.dropin.folders import bundled_hf_folder  # noqa: E402

pytestmark = pytest.mark.skipif(not transformers.__version__.startswith("5."),
                                reason=f"the drop-in hooks transformers 5 (found {transformers.__version__})")

CUTS = {"cut_threshold": 4096, "chunk_size": 2048}  # long texts take the cut paths and checkpoints
CHAT = dict(tokenize=True, add_generation_prompt=True, return_dict=False)


@pytest.fixture(scope="module")
def stocks(tmp_path_factory):
    """name -> stock transformers tokenizer (loaded on first use)."""
    from transformers import AutoTokenizer
    root = tmp_path_factory.mktemp("hf")
    cache: dict = {}

    def get(name: str):
        if name not in cache:
            cache[name] = AutoTokenizer.from_pretrained(bundled_hf_folder(name, root))
        return cache[name]
    yield get
    unpatch_transformers()


_WRAPPED: dict = {}  # id(stock) -> a wrapped copy with the default options (a snapshot costs seconds)


def wrapped(stock, *, own: bool = False, **options):
    """A wrapped copy of ``stock`` with an empty session table: with the default options a copy of
    one kept per tokenizer, its table cleared (copies share the snapshot and its table); with
    options or ``own``, a snapshot of its own (a test that patches the core)."""
    if options or own:
        return wrap_tokenizer(copy.copy(stock), **{"engine": "reference", **CUTS, **options})
    base = _WRAPPED.get(id(stock))
    if base is None:
        base = _WRAPPED[id(stock)] = wrap_tokenizer(copy.copy(stock), engine="reference", **CUTS)
    table = sessions_of(base)
    table.clear()
    table.stats = dict.fromkeys(table.stats, 0)
    return copy.copy(base)


def sessions_of(tok) -> dropin_sessions.DropinSessions:
    snap = tok.__dict__[dropin_hf.STATE_ATTR].current(tok)
    assert snap.sessions is not None
    return snap.sessions


def agent_chat(real_texts, turns: int, *, first: int = 20000, step: int = 800, reasoning: bool = True,
               users_every: int = 2):
    """Chats of an agent: a long first message, then per turn an assistant message (with reasoning
    and a tool call on odd turns) and a tool or user message. Yields each turn's messages."""
    prose, code = real_texts["english"], real_texts["code"]
    chat = [{"role": "system", "content": "You are an agent. " + prose[:300]},
            {"role": "user", "content": prose[300:300 + first]}]
    yield list(chat)
    at = 300 + first
    for t in range(turns):
        msg = {"role": "assistant", "content": code[t * step:(t + 1) * step]}
        if reasoning:
            msg["reasoning_content"] = prose[at:at + 200]
        if t % 2:
            msg["tool_calls"] = [{"type": "function", "function": {"name": "read", "arguments": {"path": f"f{t}.py"}}}]
        chat.append(msg)
        role = "user" if t % users_every == users_every - 1 else "tool"
        chat.append({"role": role, "content": prose[at + 200:at + 200 + step]})
        at += 200 + step
        yield list(chat)


def _turns(stock, tok, chats, scope=None, **kw):
    for chat in chats:
        want = stock.apply_chat_template(chat, **CHAT, **kw)
        if scope is None:
            got = tok.apply_chat_template(chat, **CHAT, **kw)
        else:
            with request_scope(**scope):
                got = tok.apply_chat_template(chat, **CHAT, **kw)
        assert got == want
        got.reverse()  # the caller owns what it got: the next turn must not see this
        yield got


# -- every turn equals stock ----------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["qwen-3", "qwen-3.5"])
@pytest.mark.parametrize("keyed", [True, False], ids=["keyed", "keyless"])
def test_agent_turns_equal_stock(stocks, real_texts, name, keyed):
    """Tool calls, reasoning that the template keeps or drops, qwen-3.5's ``<think>`` generation prompt:
    every turn equal to stock, and the turns after the first continued the conversation."""
    stock = stocks(name)
    tok = wrapped(stock)
    table = sessions_of(tok)
    scope = {"session": "conv-1", "tenant": "acme"} if keyed else None
    for _ in _turns(stock, tok, agent_chat(real_texts, 8), scope):
        pass
    assert table.stats["continued"] >= 7 and table.stats["new"] == 1
    assert len(table) == 1


def test_templates_that_rewrite_their_tail_really_do(stocks, real_texts):
    """The premise of the test above: qwen-3.5's and qwen-3's renders are not prefixes of the next
    turn's (the generation prompt's ``<think>``, earlier reasoning dropped), so the core's divergent
    turn ran, not just continuations."""
    for name in ("qwen-3", "qwen-3.5"):
        stock = stocks(name)
        texts = [stock.apply_chat_template(c, tokenize=False, add_generation_prompt=True)
                 for c in agent_chat(real_texts, 6)]
        assert any(not b.startswith(a) for a, b in zip(texts, texts[1:])), name


def test_a_divergent_turn_never_reuses_past_the_divergence(stocks, real_texts):
    """A new text that differs from the stored one a few characters before its end (and in the
    middle): every answer is stock's. The test can fail: the same turns with the store made to keep
    the whole old state's list give other IDs."""
    stock = stocks("qwen-3")
    base = real_texts["english"][:40000]  # long enough for checkpoints inside it (reuse before the end)
    texts = [base, base[:-6] + "there.", base[:-6] + "there. And more text follows here.",
             base[:25000] + "X" + base[25001:], base[:25000] + "X" + base[25001:] + " tail"]

    def run(tok):
        out = []
        with request_scope(session="d"):
            for t in texts:
                out.append(tok.encode(t))
        return out
    want = [stock.encode(t) for t in texts]
    honest_tok = wrapped(stock)
    assert run(honest_tok) == want
    assert sessions_of(honest_tok).stats["continued"] >= 3  # the divergent turns reused their start
    liar = wrapped(stock, own=True)  # its core is patched below
    store = sessions_of(liar).sessions.store
    honest = store.install

    def claim_everything(key, state, current, size=None, keep=None, reused=0, tail=None):
        old = store.peek(key)
        if keep is not None and old is not None and reused < old.n_ids and not old.prefix_of(state.text):
            # pretend the old IDs hold further than they do: the kept list keeps all of them
            tail = (np.frombuffer(tail, dtype=np.int32) if tail is not None else state.ids_from(reused)).tobytes()
            reused = old.n_ids
        return honest(key, state, current, size, keep, reused, tail)
    store.install = claim_everything
    assert run(liar) != want


def test_truncation_and_special_tokens_on_a_session(stocks, real_texts):
    """llama3.2 (a BOS template): turns alternating ``add_special_tokens`` and truncation, one session."""
    stock = stocks("llama3.2")
    tok = wrapped(stock)
    prose = real_texts["english"]
    with request_scope(session="t", tenant="x"):
        for i in range(1, 9):
            text = prose[:6000 + 1500 * i]
            ast = i % 2 == 0
            assert tok.encode(text, add_special_tokens=ast) == stock.encode(text, add_special_tokens=ast)
            assert tok(text)["input_ids"] == stock(text)["input_ids"]
            for side in ("right", "left"):
                stock.truncation_side = tok.truncation_side = side
                kw = dict(truncation=True, max_length=1000 + 97 * i, add_special_tokens=ast)
                assert tok(text, **kw)["input_ids"] == stock(text, **kw)["input_ids"]
            stock.truncation_side = tok.truncation_side = "right"
    assert sessions_of(tok).stats["continued"] >= 8


def test_the_caller_owns_the_list_it_got(stocks, real_texts):
    """A caller that mutates its answer (vLLM appends to prompts) changes nothing the session keeps.
    Fails when the kept list is handed out."""
    stock = stocks("qwen-3")
    for prefix_template in (False, True):  # no template: the kept list would be the answer itself
        tok = wrapped(stocks("llama3.2") if prefix_template else stock)
        ref = stocks("llama3.2") if prefix_template else stock
        text = real_texts["code"][:20000]
        with request_scope(session="m"):
            for i in range(4):
                got = tok.encode(text, add_special_tokens=False)
                assert got == ref.encode(text, add_special_tokens=False)
                got[:] = got[:10] + [1, 2, 3]  # mutated in place
                got.append(7)
                text += real_texts["english"][i * 900:(i + 1) * 900]
        assert sessions_of(tok).stats["continued"] == 3


# -- tenants and keys -----------------------------------------------------------------------------------
def test_no_state_crosses_tenants(stocks, real_texts):
    """The same session name, and the same keyless text, in two tenants: each tenant begins its own
    conversation (nothing continued across), and a request without a tenant shares neither.
    Fails when a key leaves the tenant out."""
    stock = stocks("qwen-3")
    tok = wrapped(stock)
    table = sessions_of(tok)
    text = real_texts["english"][:20000]
    for scope in ({"session": "s", "tenant": "a"}, {"session": "s", "tenant": "b"}, {"session": "s"},
                  {"tenant": "a"}, {"tenant": "b"}, {}):
        with request_scope(**scope):
            assert tok.encode(text) == stock.encode(text)
    assert table.stats["new"] == 6 and table.stats["continued"] == 0
    # and within a tenant the same text continues
    for scope in ({"session": "s", "tenant": "a"}, {"tenant": "b"}, {}):
        with request_scope(**scope):
            assert tok.encode(text + " more") == stock.encode(text + " more")
    assert table.stats["new"] == 6 and table.stats["continued"] == 3
    core = table.sessions
    assert core.has_session(session_key("s", "a")) and core.has_session(session_key("s", "b"))


def test_keyless_lookup_never_answers_with_another_conversation(stocks, real_texts):
    """Conversations sharing a long system prompt (one digest head), served keyless and interleaved:
    every answer is its own conversation's, each continues its own entry, and a text that diverges
    early from a long candidate forks or starts anew instead of replacing it."""
    stock = stocks("qwen-3")
    tok = wrapped(stock)
    table = sessions_of(tok)
    system = real_texts["code"][:6000]
    prose = real_texts["english"]
    convs = [[{"role": "system", "content": system}] for _ in range(5)]
    for turn in range(5):
        for c, chat in enumerate(convs):
            start = (turn * 5 + c) * 1200
            chat.append({"role": "user", "content": f"[{c}] " + prose[start:start + 1200]})
            assert tok.apply_chat_template(chat, **CHAT) == stock.apply_chat_template(chat, **CHAT)
            chat.append({"role": "assistant", "content": f"ok {c}"})
    assert table.stats["continued"] >= 5 * 4 and len(table) == 5
    # a long shared start, then different: another entry (forked), the first one kept
    doc = prose[:60000]
    a, b = doc + " question one?", doc[:50000] + " a different ending"
    for t in (a, b, a + " more", b + " more"):
        assert tok.encode(t) == stock.encode(t)
    assert table.stats["forked"] == 1 and len(table) == 7


def test_a_state_replaced_behind_the_table_is_not_reused(stocks, real_texts):
    """The kept list belongs to one state version: when the core's state under the key is evicted,
    replaced by another text's or purged, the next turn rebuilds it. Fails when the list is kept
    without asking the core which state it continued."""
    stock = stocks("qwen-3")
    tok = wrapped(stock)
    table = sessions_of(tok)
    core = table.sessions
    prose, code = real_texts["english"], real_texts["code"]
    key = session_key("r", "t")
    with request_scope(session="r", tenant="t"):
        assert tok.encode(prose[:20000]) == stock.encode(prose[:20000])
        core.drop_session(key)  # evicted by the core
        assert tok.encode(prose[:21000]) == stock.encode(prose[:21000])
        core.encode_session_delta(key, code[:30000])  # another text installed under the key directly
        assert tok.encode(code[:31000]) == stock.encode(code[:31000])  # continues that state, not the list
        other = copy.copy(tok)  # a copy shares the table
        assert other.encode(code[:32000]) == stock.encode(code[:32000])
        assert tok.encode(prose[:22000]) == stock.encode(prose[:22000])
        core.store.clear()  # a purge (the fast tier found wrong)
        assert tok.encode(prose[:23000]) == stock.encode(prose[:23000])


# -- bounds -----------------------------------------------------------------------------------------------
def test_lists_are_counted_and_the_table_is_bounded(stocks, real_texts):
    """Entries cost their kept list (about 36 bytes an ID), their core state and their key; the table
    stays under its byte and entry bounds by LRU, dropping the core's state with the entry; a huge key
    costs its own size; too many conversations on one head drop that head's oldest."""
    stock = stocks("qwen-3")
    ids = list(range(100_000, 110_000))
    assert 35 * len(ids) < list_bytes(ids) < 37 * len(ids) + 200
    prose = real_texts["english"]
    tok = wrapped(stock, max_session_bytes=4 << 20, max_sessions=6)
    table = sessions_of(tok)
    core = table.sessions
    for i in range(10):
        with request_scope(session=f"s{i}"):
            t = prose[i * 1000:i * 1000 + 40000]
            assert tok.encode(t) == stock.encode(t)
        assert table.resident_bytes <= 4 << 20 and len(table) <= 6
    held = [i for i in range(10) if core.has_session(session_key(f"s{i}"))]
    assert held and held == list(range(10 - len(held), 10)) and len(held) == len(table)  # LRU, in step
    one = table.resident_bytes / len(table)
    assert one > 36 * len(stock.encode(prose[:40000]))  # the list is counted
    big = "k" * (3 << 20)  # a hostile session name: its bytes count, it cannot hide in the table
    with request_scope(session=big):
        assert tok.encode("short text") == stock.encode("short text")
    assert table.resident_bytes <= 4 << 20 and not core.has_session(session_key(big))
    # one head, more conversations than candidates: the oldest of that head goes
    wide = wrapped(stock)
    wt = sessions_of(wide)
    head = real_texts["code"][:5000]
    for c in range(KEYLESS_CANDIDATES + 2):
        t = head + f" conversation {c} " + prose[c * 3000:c * 3000 + 3000]
        assert wide.encode(t) == stock.encode(t)
    assert len(wt) == KEYLESS_CANDIDATES


# -- options, threads, the compact turn -----------------------------------------------------------------
def test_options(stocks, real_texts):
    stock = stocks("qwen-3")
    text = real_texts["english"][:20000]
    off = wrapped(stock, sessions=False)
    assert off.__dict__[dropin_hf.STATE_ATTR].current(off).sessions is None
    with request_scope(session="x"):
        assert off.encode(text) == stock.encode(text)
    keyed_only = wrapped(stock, content_reuse=False)
    table = sessions_of(keyed_only)
    assert keyed_only.encode(text) == stock.encode(text) and len(table) == 0  # keyless: stateless
    with request_scope(session="x"):
        assert keyed_only.encode(text) == stock.encode(text) and len(table) == 1
    with pytest.raises(ValueError, match="sessions"):
        wrapped(stock, sessions=False, content_reuse=True)
    for bad in ({"sessions": "yes"}, {"content_reuse": 1}):
        with pytest.raises(TypeError):
            wrapped(stock, **bad)
    assert sessions_of(wrapped(stock)).content  # keyless lookup on by default


def test_threads_with_their_own_sessions(stocks, real_texts):
    """Requests on a thread pool (as vLLM's renderer runs them), the scope carried by
    ``request_scope.bind``; two requests of one session at once serialize."""
    stock = stocks("qwen-3")
    tok = wrapped(stock)
    prose = real_texts["english"]

    def conv(i):
        out = []
        for turn in range(5):
            t = prose[i * 500:i * 500 + 15000 + turn * 700]
            out.append(tok.encode(t) == stock.encode(t))
        return all(out)
    with ThreadPoolExecutor(4) as ex:
        futures = []
        for i in range(6):
            with request_scope(session=f"c{i % 3}", tenant=f"t{i % 2}"):
                futures.append(ex.submit(request_scope.bind(conv), i))
        assert all(f.result() for f in futures)
    assert len(sessions_of(tok)) == 6


def test_the_fast_engines_compact_turn(stocks, real_texts):
    """With the guarded fastokens engine the core continues a session by its compact turn (one engine
    call); the list built from its (version, k, tail) equals stock's, guarded code points included."""
    pytest.importorskip("fastokens", reason="the fast tier's engine (fastokens) is not installed")
    from delta_ray._engine.engine import FastTier
    from delta_ray._engine.native import FastEncoder
    from delta_ray._verify.guard_probe import guard_set_for

    stock = stocks("qwen-3")
    probe = wrapped(stock)
    loaded = probe.__dict__[dropin_hf.STATE_ATTR].current(probe).tokenizer.core.loaded
    fast = FastEncoder(loaded.config_bytes, "fastokens")
    guard = guard_set_for(loaded.config_bytes, fast, ref_tokenizer=loaded.tokenizer, code_points=[0x17F])
    tok = wrap_tokenizer(copy.copy(stock), encoder=FastTier(fast, guard))
    core = sessions_of(tok).sessions
    for keyed in (True, False):
        for chat in agent_chat(real_texts, 8, first=30000):
            if keyed:
                chat[-1] = {**chat[-1], "content": chat[-1]["content"] + " I'\u017f"}
            want = stock.apply_chat_template(chat, **CHAT)
            with request_scope(session="f" if keyed else None):
                assert tok.apply_chat_template(chat, **CHAT) == want
    assert core.stats["repair"] >= 12


def test_a_disabled_engine_takes_its_kept_lists_with_it(stocks, real_texts):
    """The kept lists are the engine's output too: when the fast tier is caught (here a wrong
    engine, its rejection simulated), the purge drops every kept list with its state, and the next
    turns of the same conversations equal stock's. Fails if a kept list outlived its purge (its IDs
    would be cut and extended) or a turn reused one made before it."""
    from delta_ray._engine.engine import FastTier
    from wrong_engine import WrongEngine

    stock = stocks("qwen-3")
    probe = wrapped(stock)
    loaded = probe.__dict__[dropin_hf.STATE_ATTR].current(probe).tokenizer.core.loaded
    tok = wrap_tokenizer(copy.copy(stock), encoder=FastTier(WrongEngine(loaded.tokenizer)), shadow_rate=0.0)
    table = sessions_of(tok)
    chats = [[dict(m) for m in chat] for chat in agent_chat(real_texts, 6, first=30000)]
    for chat in chats[:3]:
        for key in ("k", None):
            with request_scope(session=key):
                assert tok.apply_chat_template(chat, **CHAT) != stock.apply_chat_template(chat, **CHAT)
    assert table.sessions.store.kept_lists()  # the wrong engine's lists are kept
    tok.__dict__[dropin_hf.STATE_ATTR].current(tok).tokenizer.core.engine.back_to_reference("caught in a test")
    assert table.sessions.store.kept_lists() == [] and len(table.sessions.store) == 0
    for chat in chats[3:]:
        for key in ("k", None):
            with request_scope(session=key):
                assert tok.apply_chat_template(chat, **CHAT) == stock.apply_chat_template(chat, **CHAT)


def test_memory_per_token_is_what_the_docs_say(stocks, real_texts):
    """A kept session of qwen-3 English at about 36 bytes an ID plus the core's state: the figure
    docs/dropin.md gives for a server's default."""
    stock = stocks("qwen-3")
    tok = wrapped(stock)
    table = sessions_of(tok)
    text = real_texts["english"][:200000]
    with request_scope(session="mem"):
        n = len(tok.encode(text))
    per_token = table.resident_bytes / n
    assert 36 < per_token < 60, per_token
    assert sys.getsizeof([]) < 100 and np.int32  # (numpy imported for the fixtures' arrays)


# -- add_special_tokens that is not a bool; lists the caller owns ---------------------------------------
_NOT_A_BOOL = ["false", "true", "", "0", 0, 1, 2, None, 1.0, 0.0, [], [1], np.bool_(True), np.bool_(False)]
_SCOPES = {"plain": None, "session": {"session": "ast"}, "tenant-session": {"session": "ast", "tenant": "x"},
           "tenant": {"tenant": "x"}}


def _outcome(call):
    """("ok", the answer) or ("raised", the exception's type)."""
    try:
        return "ok", call()
    except Exception as exc:  # noqa: BLE001 - compared with stock's
        return "raised", type(exc)


def _in_scope(scope):
    return request_scope(**scope) if scope is not None else contextlib.nullcontext()


@pytest.mark.parametrize("value", _NOT_A_BOOL + [True, False], ids=repr)
@pytest.mark.parametrize("scope", list(_SCOPES), ids=list(_SCOPES))
def test_add_special_tokens_that_is_not_a_bool_is_stocks(stocks, real_texts, value, scope):
    """glm-4 (a two-token prefix template): ``encode``, ``__call__`` (one text, short and long, and a
    batch) and ``apply_chat_template(tokenize=True)`` with ``add_special_tokens`` of any value raise
    where stock raises (its backend takes only a bool or a numpy bool: ``0``, ``1``, ``None`` and
    ``"false"`` are a TypeError), with the same exception type, and answer stock's IDs where stock
    answers; in a session scope and out, the long text continuing a conversation; a bool turn after
    them is still stock's. Fails when the drop-in reads such a value by truthiness (``"false"`` adds
    the prefix) or as a dict key (a KeyError on the session path)."""
    stock = stocks("glm-4")
    tok = wrapped(stock)
    prose = real_texts["english"]
    text = prose[:6000]  # past the content lookup's head: the keyless path keeps it too
    chat = [{"role": "user", "content": text}]
    calls = {
        "encode": lambda t: t.encode(text, add_special_tokens=value),
        "call": lambda t: t(text, add_special_tokens=value)["input_ids"],
        "call-short": lambda t: t("Hello world", add_special_tokens=value)["input_ids"],
        "batch": lambda t: t([text, "Hello world"], add_special_tokens=value)["input_ids"],
        "tokenize": lambda t: t.tokenize(text[:300], add_special_tokens=value),
        "chat": lambda t: t.apply_chat_template(chat, add_special_tokens=value, **CHAT),
        "chat-dict": lambda t: t.apply_chat_template(chat, add_special_tokens=value, tokenize=True)["input_ids"],
    }
    with _in_scope(_SCOPES[scope]):
        for name, call in calls.items():
            want = _outcome(lambda: call(stock))
            assert _outcome(lambda: call(tok)) == want, name
            assert _outcome(lambda: call(tok)) == want, name  # again: the kept state is intact
        more = text + prose[6000:6500]
        assert tok.encode(more) == stock.encode(more)
        assert tok(more, add_special_tokens=False)["input_ids"] == stock(more, add_special_tokens=False)["input_ids"]
    if value.__class__ is not bool and not isinstance(value, np.bool_):
        assert _outcome(lambda: stock.encode(text, add_special_tokens=value))[0] == "raised"  # as measured


def _scramble(ids: list) -> None:
    """What a caller may do to a list it got: every element changed, some removed, some added."""
    ids.reverse()
    ids[:3] = [0, 0, 0]
    del ids[5:9]
    ids.append(1)


@pytest.mark.parametrize("scope", list(_SCOPES), ids=list(_SCOPES))
@pytest.mark.parametrize("name", ["glm-4", "qwen-3"])  # a prefix template, and none (the kept list's own IDs)
def test_a_caller_mutating_any_list_it_got_changes_no_later_answer(stocks, real_texts, scope, name):
    """Every list the drop-in hands out is the caller's alone: ``input_ids`` from ``encode``,
    ``__call__`` (one text, a batch) and ``apply_chat_template``, in session scope and out, is never
    the session's kept list nor the list ``encodings[0].ids`` reads (stock's are distinct lists, and
    a caller's edit of ``input_ids`` never shows in ``encodings``). The caller scrambles each, then
    the next turn (the same text again, then a longer one) equals stock. Fails when ``input_ids`` and
    ``encodings[0].ids`` are one list, or when a kept list is handed out."""
    stock = stocks(name)
    tok = wrapped(stock)
    prose = real_texts["english"]
    with _in_scope(_SCOPES[scope]):
        for i in range(4):
            text = prose[:6000 + 700 * (i // 2)]  # each text twice: the second reuses the whole state
            chat = [{"role": "user", "content": text}]
            for ast in (True, False):
                got = tok.encode(text, add_special_tokens=ast)
                assert got == stock.encode(text, add_special_tokens=ast)
                _scramble(got)
            want, out = stock(text), tok(text)
            assert out["input_ids"] == want["input_ids"] and out.encodings[0].ids == want.encodings[0].ids
            assert (out["input_ids"] is out.encodings[0].ids) == (want["input_ids"] is want.encodings[0].ids)
            assert out.encodings[0].ids is not out.encodings[0].ids  # a new list at each read, as stock's
            _scramble(out["input_ids"])
            _scramble(want["input_ids"])
            assert out.encodings[0].ids == want.encodings[0].ids  # the caller's edit does not show there
            assert out.tokens() == want.tokens() and len(out.encodings[0]) == len(want.encodings[0])
            _scramble(out.encodings[0].ids)
            assert out.encodings[0].ids == want.encodings[0].ids
            batch = tok([text, "Hello world"])
            assert batch["input_ids"] == stock([text, "Hello world"])["input_ids"]
            for ids, enc in zip(batch["input_ids"], batch.encodings):
                assert ids is not enc.ids
                _scramble(ids)
            got = tok.apply_chat_template(chat, **CHAT)
            assert got == stock.apply_chat_template(chat, **CHAT)
            _scramble(got)
            got = tok.apply_chat_template(chat, tokenize=True)
            assert got["input_ids"] == stock.apply_chat_template(chat, tokenize=True)["input_ids"]
            _scramble(got["input_ids"])


class _CountingLock:
    """A ``threading.Lock`` that counts its acquisitions (every lock made while the test patches
    ``threading.Lock``: the snapshot's, the core's, its store's and engine's)."""

    acquired = 0

    def __init__(self):
        self._lock = _REAL_LOCK()

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        _CountingLock.acquired += 1
        return self._lock.acquire(blocking, timeout)

    def release(self) -> None:
        self._lock.release()

    def locked(self) -> bool:
        return self._lock.locked()

    __enter__ = acquire

    def __exit__(self, *exc) -> None:
        self._lock.release()


_REAL_LOCK = threading.Lock


@pytest.mark.parametrize("keyed", [True, False])
def test_a_warm_turn_takes_two_locks(stocks, real_texts, monkeypatch, keyed):
    """A warm drop-in turn (the compact continuation of a held conversation) takes the key's lock and
    the store's table lock, once each: the session has one owner (issue 57)."""
    stock = stocks("qwen-3")
    monkeypatch.setattr(threading, "Lock", _CountingLock)
    tok = wrap_tokenizer(copy.copy(stock), engine="fast", shadow_rate=0.0, **CUTS)
    monkeypatch.undo()
    text = real_texts["english"][:60000]
    scope = {"session": "warm"} if keyed else {}
    for i in range(4):
        text += f" turn {i}: " + real_texts["code"][i * 500:(i + 1) * 500]
        with request_scope(**scope):
            before = _CountingLock.acquired
            got = tok.encode(text)
            taken = _CountingLock.acquired - before
    assert got == stock.encode(text)
    core = tok.__dict__[dropin_hf.STATE_ATTR].current(tok).tokenizer.core
    assert core.uses_fast_engine and core.stats["repair"] >= 3  # the compact turn ran
    assert taken <= 2, taken


def _same_encoding(got, want) -> None:
    assert type(got) is type(want) and list(got.keys()) == list(want.keys())
    for k in want:
        assert got[k] == want[k], k


@pytest.mark.parametrize("name", ["llama3.2", "qwen-3"])
def test_offsets_calls_of_a_conversation_equal_stock(stocks, real_texts, monkeypatch, name):
    """``tok(text, return_offsets_mapping=True)`` of a growing conversation (keyed), with and
    without special tokens and cut as vLLM cuts it: equal to stock's (IDs, mask, offsets). Every
    call is served by the session (llama3.2, and qwen-3 under its NFC normalizer), asking the
    reference only for a tail: the test fails if one falls back to stock's whole encode."""
    stock = stocks(name)
    tok = wrapped(stock)
    table = sessions_of(tok)
    served = []
    real = dropin_hf._delta_encode_plus
    monkeypatch.setattr(dropin_hf, "_delta_encode_plus", lambda *a: served.append(r := real(*a)) or r)
    text = real_texts["english"][:20000]
    for turn in range(5):
        text += " " + real_texts["code"][turn * 900:(turn + 1) * 900] + " caf\u00e9 cafe\u0301 \u65e5\u672c " \
            + stock.eos_token
        for kw in ({}, {"add_special_tokens": False}, {"truncation": True, "max_length": 3000}):
            served.clear()
            with request_scope(session="conv"):
                got = tok(text, return_offsets_mapping=True, **kw)
            _same_encoding(got, stock(text, return_offsets_mapping=True, **kw))
            assert len(served) == 1 and served[0] is not None, (turn, kw)
    assert table.stats["offsets"] == 15
    # a batch, or a keyless text not kept, is stock's call
    served.clear()
    _same_encoding(tok([text], return_offsets_mapping=True), stock([text], return_offsets_mapping=True))
    assert not served
