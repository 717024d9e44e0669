"""The drop-in's chat-template render (``delta_ray.apps.dropin.render``): a wrapped tokenizer renders
through transformers' own sandboxed environment with the sandbox's decisions memoized; the text,
every refusal and every error equal stock transformers', and nothing else is touched."""
from __future__ import annotations

import collections.abc
import json

import pytest

transformers = pytest.importorskip("transformers", reason="the drop-in tests need transformers 5.23: "
                                                          "pip install 'transformers==5.23.*' (the test extra)")
hypothesis = pytest.importorskip("hypothesis")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from delta_ray.apps.dropin import hf as dropin_hf  # noqa: E402
from delta_ray.apps.dropin import patch_transformers, render, unpatch_transformers, wrap_tokenizer  # noqa: E402
from delta_ray.apps.dropin.folders import bundled_hf_folder  # noqa: E402

pytestmark = pytest.mark.skipif(not transformers.__version__.startswith("5."),
                                reason=f"the drop-in hooks transformers 5 (found {transformers.__version__})")

# Templates that touch what the memo remembers: dict fields as attributes, str methods, filters,
# loop and namespace holders, tool calls, reasoning, str.format (wrapped by the sandbox each time).
FEATURES = """{%- set ns = namespace(n=0, last=-1, sys=none) -%}
{%- for m in messages -%}
  {%- if m.role == 'user' %}{% set ns.last = loop.index0 %}{% endif -%}
  {%- set ns.n = ns.n + (m.content | length) -%}
{%- endfor -%}
{%- for m in messages -%}
<{{ m.role.upper() }}{{ '|first' if loop.first }}{{ '|last' if loop.last }}>
{%- if m.reasoning_content is defined and m.reasoning_content %}[think]{{ m.reasoning_content.strip() }}{% endif -%}
{%- set c = m.content if m.content is string else '' -%}
{%- if '</think>' in c %}{{ c.split('</think>')[-1].lstrip('\\n') }}{% else %}{{ c.replace('\\r', '') }}{% endif -%}
{%- if m.tool_calls is defined %}{% for tc in m.tool_calls %}{{ tc.function.name }}({{ tc.function.arguments | tojson }}){% endfor %}{% endif -%}
{%- if loop.index0 == ns.last %}{{ '[{0}/{1}]'.format(loop.index, loop.length) }}{% endif -%}
{%- endfor -%}
{{ ns.n }}{% if tools %}{{ tools | tojson }}{% endif %}{% if add_generation_prompt %}<ASSISTANT>{% endif %}"""  # noqa: E501 - the template's lines are kept whole

# Each must end as stock ends: the same text, or the same exception type and message.
REFUSALS = [
    "{{ messages.pop() }}",
    "{{ messages[0].update({'x': 1}) }}{{ messages[0].content }}",
    "{{ messages[0].content.upper() }}{{ messages[0].pop('content') }}",
    "{{ ''.__class__ }}",
    "{{ messages[0].content.__class__.__mro__ }}",
    "{{ 'x'.upper() }}{{ '{0.__class__}'.format(messages) }}",
    "{{ 'x'.upper() }}{{ '{0.mro}'.format_map(messages[0]) }}",
    "{% set ns = namespace(a=1) %}{{ ns.a }}{{ ns.__init__ }}",
    "{% set ns = namespace(a=1) %}{{ ns._Namespace__attrs }}",
    "{% for m in messages %}{{ loop.index }}{{ loop.__class__ }}{% endfor %}",
    "{% for m in messages %}{{ loop.cycle('a', 'b') }}{% endfor %}",
    "{{ messages[0].items() | list }}{{ messages[0].clear() }}",
    "{{ messages[0].missing }}|{{ messages[0].missing.deeper }}",
    "{{ (1).real }}{{ (1.5).hex() }}{{ none.__class__ }}",
    "{{ (1, 2).index(2) }}{{ (1, 2).count(2) }}{{ (1, 2).nope }}",
]


def _outcome(tok, chat, template: str, **kw):
    try:
        return "text", tok.apply_chat_template(chat, chat_template=template, tokenize=False, **kw)
    except Exception as exc:  # noqa: BLE001 - the comparison is the point
        return type(exc).__name__, str(exc)


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    from transformers import AutoTokenizer
    folder = bundled_hf_folder("qwen-3", tmp_path_factory.mktemp("hf"))
    stock = AutoTokenizer.from_pretrained(folder)
    patch_transformers(engine="reference")
    try:
        patched = AutoTokenizer.from_pretrained(folder)
    finally:
        unpatch_transformers()
    dropin_hf.install_hooks()
    yield stock, patched
    unpatch_transformers()


def _memo_of(template: str) -> render.MemoGetattr:
    getattr_ = render._compiled[template].environment.getattr
    assert isinstance(getattr_, render.MemoGetattr)
    return getattr_


def _chat(texts):
    chat = [{"role": "system", "content": "be brief"}]
    for i, t in enumerate(texts):
        chat.append({"role": "user" if i % 2 == 0 else "assistant", "content": t})
    return chat


@pytest.mark.parametrize("name", ["qwen-3", "glm-4", "minimax-m3"])
def test_bundled_templates_render_as_stock(pair, name, tmp_path):
    from transformers import AutoTokenizer
    stock, patched = pair
    template = AutoTokenizer.from_pretrained(bundled_hf_folder(name, tmp_path)).chat_template
    chat = _chat(["hi </think>\n\nthere", "ok", "<tool_response>x</tool_response>", "done"])
    chat[2]["reasoning_content"] = "mull it over"
    chat[2]["tool_calls"] = [{"type": "function", "function": {"name": "f", "arguments": {"a": 1}}}]
    chat.append({"role": "tool", "content": "42"})
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    for kw in ({}, {"add_generation_prompt": True}, {"tools": tools}, {"enable_thinking": False}):
        for c in (chat, chat[:2], chat[:4]):
            assert _outcome(patched, c, template, **kw) == _outcome(stock, c, template, **kw)
    memo = _memo_of(template)  # the memo's environment served these renders
    assert memo.decisions or name == "glm-4"  # glm-4's template reads items only (m['content'])


def test_feature_template_renders_as_stock(pair):
    stock, patched = pair
    chat = _chat(["a</think>\nb", "c\r\nd", "e"])
    chat[2]["tool_calls"] = [{"type": "function", "function": {"name": "g", "arguments": {"x": [1, "y"]}}}]
    chat[2]["reasoning_content"] = "  why  "
    for kw in ({}, {"add_generation_prompt": True}, {"tools": [{"name": "g"}]}):
        got = _outcome(patched, chat, FEATURES, **kw)
        assert got[0] == "text" and got == _outcome(stock, chat, FEATURES, **kw)
    assert {(k[0].__name__, k[1]) for k in _memo_of(FEATURES).decisions} >= {
        ("dict", "role"), ("str", "upper"), ("LoopContext", "index0"), ("TemplateNamespace", "last")}


@settings(max_examples=40, deadline=None)
@given(st.lists(st.text(alphabet=st.sampled_from(list("ab </think>\n\r{}%ſ")), max_size=30), min_size=1,
                max_size=6),
       st.booleans())
def test_random_chats_render_as_stock(pair, texts, prompt):
    stock, patched = pair
    chat = _chat(texts)
    for template in (stock.chat_template, FEATURES):
        assert _outcome(patched, chat, template, add_generation_prompt=prompt) == \
            _outcome(stock, chat, template, add_generation_prompt=prompt)


@pytest.mark.parametrize("template", REFUSALS)
def test_refusals_and_errors_are_the_sandboxes(pair, template):
    stock, patched = pair
    chat = _chat(["first", "second"])
    for _ in range(2):  # the second render runs on remembered decisions
        assert _outcome(patched, chat, template) == _outcome(stock, chat, template)


def test_an_abc_registration_drops_remembered_verdicts(pair):
    """``update`` on a namespace is safe until the namespace type is registered as a MutableMapping;
    the sandbox then refuses it, and so must the memo (it remembered "safe" before)."""
    stock, patched = pair
    template = "{% set ns = namespace(update=7) %}{{ ns.update + 1 }}"
    chat = _chat(["x"])
    assert _outcome(patched, chat, template) == _outcome(stock, chat, template) == ("text", "8")
    memo = _memo_of(template)
    holder = memo.env.globals["namespace"]
    assert (holder, "update") in memo.decisions
    stock_env = render._original_compile(template).environment
    collections.abc.MutableMapping.register(holder)  # each compile has its own TemplateNamespace class
    collections.abc.MutableMapping.register(stock_env.globals["namespace"])
    want = _outcome(stock, chat, template)
    assert want[0] == "SecurityError"
    assert _outcome(patched, chat, template) == want


def test_names_from_the_data_do_not_grow_the_memo(pair):
    """A format string from the request names attributes (the sandbox's formatter reads each with
    the environment's ``getattr``): the memo stays bounded, and renders as stock."""
    stock, patched = pair
    template = "{% for m in messages %}{{ ('{0.' ~ m.content ~ '}').format(m) }}{% endfor %}"
    chat = [{"role": "user", "content": f"name{i}"} for i in range(render.MAX_DECISIONS + 500)]
    chat[7]["name7"] = "found"
    assert _outcome(patched, chat, template) == _outcome(stock, chat, template)
    assert len(_memo_of(template).decisions) <= render.MAX_DECISIONS


def test_only_the_templates_own_names_are_remembered(pair):
    """A name a request builds (a format string) goes to the sandbox every time: one request can
    neither grow the memo nor learn, by timing, which names another request used."""
    stock, patched = pair
    template = "{% for m in messages %}{{ m.role }}{{ ('{0.' ~ m.content ~ '}').format(m) }}{% endfor %}"
    chat = [{"role": "user", "content": "secret_name", "secret_name": "x"}]
    assert _outcome(patched, chat, template) == _outcome(stock, chat, template)
    names = {k[1] for k in _memo_of(template).decisions}
    assert "role" in names and "secret_name" not in names


def test_the_hook_keeps_transformers_signature(pair):
    """vLLM picks the kwargs it forwards from ``inspect.signature(tok.apply_chat_template)``."""
    import inspect
    stock, patched = pair
    assert inspect.signature(patched.apply_chat_template) == inspect.signature(stock.apply_chat_template)
    assert "tokenize" in inspect.signature(patched.apply_chat_template).parameters


def test_only_wrapped_tokenizers_render_through_the_memo(pair, tmp_path):
    from transformers import AutoTokenizer
    from transformers.utils import chat_template_utils as ctu
    stock, patched = pair
    template = "{{ messages[0].content.title() }}|" + json.dumps("only-wrapped")
    chat = _chat(["plain"])
    _outcome(stock, chat, template)
    assert template not in render._compiled
    assert not isinstance(ctu._compile_jinja_template(template).environment.getattr, render.MemoGetattr)
    off = wrap_tokenizer(AutoTokenizer.from_pretrained(bundled_hf_folder("qwen-3", tmp_path)), engine="reference",
                         fast_render=False)
    assert _outcome(off, chat, template) == _outcome(stock, chat, template)
    assert template not in render._compiled
    assert _outcome(patched, chat, template) == _outcome(stock, chat, template)
    assert template in render._compiled
    with pytest.raises(TypeError):
        wrap_tokenizer(stock, fast_render="yes")


def test_the_vllm_mode_takes_fast_render_from_the_environment(monkeypatch):
    from delta_ray.apps.dropin import vllm_plugin
    assert vllm_plugin._options()["fast_render"] is True
    monkeypatch.setenv("DELTA_RAY_FAST_RENDER", "0")
    assert vllm_plugin._options()["fast_render"] is False
    monkeypatch.setenv("DELTA_RAY_FAST_RENDER", "yes")
    with pytest.raises(ValueError, match="DELTA_RAY_FAST_RENDER"):
        vllm_plugin._options()


def test_unpatch_restores_transformers_render(pair):
    from transformers.tokenization_utils_tokenizers import TokenizersBackend
    from transformers.utils import chat_template_utils as ctu
    unpatch_transformers()
    try:
        assert "apply_chat_template" not in TokenizersBackend.__dict__
        assert ctu._compile_jinja_template is not render._compile and not render._compiled
    finally:
        dropin_hf.install_hooks()
    assert ctu._compile_jinja_template is render._compile
    assert TokenizersBackend.__dict__["apply_chat_template"].__wrapped__ is not None
