"""Chat templates of wrapped tokenizers render through the same jinja sandbox, its decisions memoized.

transformers renders every ``apply_chat_template`` in jinja's ``ImmutableSandboxedEnvironment``,
and that sandbox decides every attribute access anew: ``message.content`` on a dict first fails as
an attribute (an exception) before it is read as an item, and ``content.split`` runs four safety
checks (``is_internal_attribute``, ``modifies_known_mutable``'s ABC ``isinstance`` calls). On a
long chat that is about half of the render, and the render a large share of a long turn. Here the environment
transformers builds for the template is kept as it is (same extensions, filters, globals, sandbox class) and only its
``getattr`` is replaced by one that remembers each decision the sandbox made, keyed by the object's exact type and the
attribute name. The rendered text, every refusal and every error are the sandbox's own (docs/dropin.md §16):

* For the exact built-in types in ``_BUILTINS`` an instance has no attributes of its own, so
  whether ``getattr`` finds the name, and whether the sandbox calls it safe, are functions of
  (type, name). Remembered: "an attribute, safe" (read it) and "not an attribute" (the sandbox's
  item read, then ``undefined``). Never remembered: a refusal and ``format``/``format_map`` (the
  sandbox wraps those per object); those go to the sandbox each time.
* For jinja's holder types (``Namespace``, transformers' ``TemplateNamespace``, ``LoopContext``)
  only the safety verdict is remembered (it reads the type and the name, not the value); the value
  is read each time, and a method value goes to the sandbox (it may be a ``str.format`` to wrap).
* The safety verdict reads ABC registrations (``isinstance(obj, MutableMapping)``): every verdict
  is dropped when ``abc.get_cache_token()`` moves, i.e. after any ``register``.

Anything else (other types, a non-str name, an environment that is not exactly the one this was
written against, a jinja2 outside 3.1) renders through the sandbox untouched.
"""
from __future__ import annotations

import abc
import contextvars
import threading
import types
from collections import OrderedDict
from typing import Any, Callable

import jinja2
from jinja2 import nodes
from jinja2.runtime import LoopContext
from jinja2.sandbox import ImmutableSandboxedEnvironment
from jinja2.utils import Namespace

_BUILTINS = frozenset({str, dict, list, tuple, int, float, bool, type(None)})
_METHODS = (types.MethodType, types.BuiltinMethodType)
_WRAPPED_BY_SANDBOX = ("format", "format_map")  # str.format / format_map: wrapped per object
_ATTR, _ITEM = "attr", "item"  # remembered for built-ins; holders remember _SAFE
_SAFE = "safe"
_CACHE_SIZE = 64  # compiled templates kept (transformers' own lru_cache keeps 128)
# Decisions kept per template: only the template's own attribute names are remembered (a format
# string built from the request, ``'{0.x}'.format(m)``, names attributes through the environment's
# getattr too: remembering those would let one request grow the memo and time another's names); the
# bound stays as a second line.
MAX_DECISIONS = 4096

_scope: contextvars.ContextVar[bool] = contextvars.ContextVar("delta_ray_memo_render", default=False)
_lock = threading.Lock()
_compiled: OrderedDict[str, Any] = OrderedDict()
_original_compile: Callable[[str], Any] | None = None


def supported() -> bool:
    """Whether this jinja2 is the one the memo's argument was checked against (3.1.x)."""
    return jinja2.__version__.split(".")[:2] == ["3", "1"]


class MemoGetattr:
    """A sandbox's ``getattr`` that remembers the decisions that depend only on (type, name)."""

    def __init__(self, env, holders: tuple[type, ...] = (), names: frozenset[str] = frozenset()):
        self.env = env
        self.names = names  # the template's own attribute names: the only ones remembered
        self.sandbox_getattr = env.getattr  # the class's own method, bound before we shadow it
        self.holders = frozenset({Namespace, LoopContext, *holders})
        self.decisions: dict[tuple[type, str], str] = {}
        self.token = abc.get_cache_token()

    def __call__(self, obj: Any, attribute: str) -> Any:
        key = (type(obj), attribute)
        decision = self.decisions.get(key)
        if decision is not None and abc.get_cache_token() != self.token:
            self.decisions.clear()  # an ABC registration may have changed a verdict
            self.token = abc.get_cache_token()
            decision = None
        if decision is _ATTR:
            return getattr(obj, attribute)
        if decision is _ITEM:
            try:
                return obj[attribute]
            except (TypeError, LookupError):
                return self.env.undefined(obj=obj, name=attribute)
        if decision is _SAFE:
            try:
                value = getattr(obj, attribute)
            except AttributeError:
                return self.sandbox_getattr(obj, attribute)
            if not isinstance(value, _METHODS):
                return value
            return self.sandbox_getattr(obj, attribute)
        self._learn(key, obj, attribute)
        return self.sandbox_getattr(obj, attribute)

    def _learn(self, key: tuple[type, str], obj: Any, attribute: str) -> None:
        tp = key[0]
        if attribute not in self.names or attribute in _WRAPPED_BY_SANDBOX:
            return  # a name from the request (a format string) is never remembered
        token = abc.get_cache_token()
        if tp in _BUILTINS:
            try:
                value = getattr(obj, attribute)
            except AttributeError:
                decision = _ITEM
            else:
                if not self.env.is_safe_attribute(obj, attribute, value):
                    return
                decision = _ATTR
        elif tp in self.holders:
            if not self.env.is_safe_attribute(obj, attribute, None):
                return
            decision = _SAFE
        else:
            return
        if token != self.token or len(self.decisions) >= MAX_DECISIONS:  # start afresh
            self.decisions.clear()
            self.token = token
        self.decisions[key] = decision


def memoize(template, source: str):
    """Give ``template``'s own environment a :class:`MemoGetattr` remembering the attribute names
    ``source`` (the template's text) writes; returns the template. A template whose environment is
    not exactly jinja's ``ImmutableSandboxedEnvironment`` is left as it is."""
    env = template.environment
    if type(env) is ImmutableSandboxedEnvironment and "getattr" not in env.__dict__:
        namespace = env.globals.get("namespace")
        holders = (namespace,) if isinstance(namespace, type) else ()
        names = frozenset(n.attr for n in env.parse(source).find_all(nodes.Getattr))
        env.getattr = MemoGetattr(env, holders, names)
    return template


def _compile(chat_template: str):
    """transformers' compile for templates rendered in scope: a template of its own (a fresh
    environment from transformers' uncached builder), memoized; transformers' cache otherwise."""
    if not _scope.get():
        original = _original_compile
        if original is None:  # uninstalled while this call ran: transformers' own is back in place
            from transformers.utils import chat_template_utils as ctu
            original = ctu._compile_jinja_template  # third-party seam: transformers' template compile
        return original(chat_template)
    with _lock:
        template = _compiled.get(chat_template)
        if template is not None:
            _compiled.move_to_end(chat_template)
            return template
    from transformers.utils import chat_template_utils as ctu
    # third-party seam: transformers' cached compile (checked present by install())
    template = memoize(ctu._cached_compile_jinja_template(chat_template), chat_template)
    with _lock:
        _compiled[chat_template] = template
        while len(_compiled) > _CACHE_SIZE:
            _compiled.popitem(last=False)
    return template


def install() -> bool:
    """Route transformers' template compile through :func:`_compile` (idempotent); False where the
    seam is missing or jinja2 is not 3.1 (templates then render as stock everywhere)."""
    global _original_compile
    from transformers.utils import chat_template_utils as ctu
    with _lock:
        if _original_compile is not None:
            return True
        # third-party seam: transformers' compile functions, present in the versions this hooks
        if not supported() or not hasattr(ctu, "_cached_compile_jinja_template") \
                or not callable(getattr(ctu, "_compile_jinja_template", None)):  # third-party seam (as above)
            return False
        # third-party seam: transformers' template compile, the one function the render hook replaces
        _original_compile = ctu._compile_jinja_template
        ctu._compile_jinja_template = _compile  # third-party seam (as above)
        return True


def uninstall() -> None:
    global _original_compile
    from transformers.utils import chat_template_utils as ctu
    with _lock:
        if _original_compile is not None:
            ctu._compile_jinja_template = _original_compile  # third-party seam (as in install)
            _original_compile = None
        _compiled.clear()


class memo_render:
    """``with memo_render(): ...``: templates compiled on this thread (or task) in the block render
    through the memoized sandbox (where :func:`install` succeeded)."""

    def __enter__(self):
        self._token = _scope.set(True)
        return self

    def __exit__(self, *exc):
        _scope.reset(self._token)
        return False
