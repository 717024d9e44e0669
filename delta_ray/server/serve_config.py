"""``ServeConfig``: what every replica of the tokenization service runs with, validated once.

A frozen value built by ``serve_app`` from its keyword options and sent to each replica as it is:
the replica's :class:`~delta_ray._core.config.TokenizerConfig`, the :class:`~delta_ray._core.config.PoolConfig`
of a pool started per replica (or the name of a running pool to attach to), and the request
limits. The tokenizer and pool options are the config classes' own fields, so no list of option
names is kept by hand here. Ray-free.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any, Mapping

from delta_ray._core.config import PoolConfig, TokenizerConfig, pool_config, tokenizer_config

DEFAULT_MAX_BODY_BYTES = 64 * 1024 * 1024
# IDs per /detokenize request (1,048,576); more is a 413. Past a million the GIL-bound steps of a
# request (turning the IDs into Python ints for the decode, the answer's string) hold the loop
# for tens of milliseconds each.
DEFAULT_MAX_DETOKENIZE_TOKENS = 1 << 20
DEFAULT_MAX_JSON_ITEMS = 65_536  # JSON values and keys per request body; more is a 413

# What the one-process server (``delta-ray serve --local``, ``server/local.py``) lets clients hold.
# uvicorn's own settings where it has one (``server/http_limits.py`` says which are whose).
DEFAULT_MAX_CONNECTIONS = 1024  # open connections; the one past it is answered 503 and closed unread
DEFAULT_MAX_HEADER_BYTES = 32 * 1024  # a request's line and headers; more is a 431 and a close
# A request's line and headers must be in within this, from the connection's start (its first
# request) or the head's first byte (later ones); else a 408 and a close (a close if nothing came).
DEFAULT_HEADER_TIMEOUT_S = 10.0
DEFAULT_KEEP_ALIVE_S = 5.0  # an idle connection between requests is closed after this (uvicorn's)
DEFAULT_BACKLOG = 2048  # connections the kernel queues before they are accepted (uvicorn's)
# Request body bytes held at once by the requests in progress: by all of them (past it a 503) and
# by those of one client address (past it a 429). Either is raised to max_body_bytes where that is
# larger, so the largest body a request may send always fits one client's share.
DEFAULT_MAX_INFLIGHT_BYTES = 256 * 1024 * 1024
DEFAULT_MAX_CLIENT_INFLIGHT_BYTES = 128 * 1024 * 1024

TOKENIZER_OPTIONS = frozenset(f.name for f in fields(TokenizerConfig))
POOL_OPTIONS = frozenset(f.name for f in fields(PoolConfig)) - {"tokenizer"}
# The replica's session store bounds are the replica's alone: a pool's workers keep their defaults.
REPLICA_ONLY = frozenset({"max_session_bytes", "max_sessions"})


@dataclass(frozen=True)
class ServeConfig:
    """One replica's configuration (see ``serve_app`` for what each option does)."""

    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    pool: PoolConfig | None = None  # a pool started in each replica (its num_workers); None: none
    pool_name: str | None = None  # or attach to this running named pool
    pool_secret: str | None = field(default=None, repr=False)  # its secret (hex); default $DELTA_RAY_POOL_SECRET
    model_name: str = "delta-ray"
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    max_model_len: int | None = None
    require_tenant: bool = False
    pool_min_chars: int | None = None  # keyless texts from this length go to the pool; None: cut_threshold
    overflow_inflight: int | None = None  # keyless texts go to the pool while more run here; None: 2 x threads
    max_detokenize_tokens: int = DEFAULT_MAX_DETOKENIZE_TOKENS
    max_json_items: int = DEFAULT_MAX_JSON_ITEMS

    def __post_init__(self):
        if not isinstance(self.tokenizer, TokenizerConfig):
            raise TypeError(f"tokenizer must be a TokenizerConfig, got {type(self.tokenizer).__name__}")
        if self.tokenizer.reuse == "content":
            # The tokenizer's own keyless reuse runs without a tenant: one namespace for every caller
            # would be a cross-tenant timing oracle. Replicas reuse keyless prompts per tenant.
            raise ValueError("Serve does not take reuse='content': keyless prompts are already reused by "
                             "content, inside each tenant (cache_salt)")
        if self.pool is not None and not isinstance(self.pool, PoolConfig):
            raise TypeError(f"pool must be a PoolConfig, got {type(self.pool).__name__}")
        if self.pool is not None and self.pool_name:
            raise ValueError("give num_workers (a pool per replica) or pool_name (a running pool), not both")
        for name in ("max_body_bytes", "max_detokenize_tokens", "max_json_items"):
            _positive(name, getattr(self, name))
        for name in ("max_model_len", "pool_min_chars", "overflow_inflight"):
            if getattr(self, name) is not None:
                _positive(name, getattr(self, name))
        if not isinstance(self.model_name, str) or not self.model_name:
            raise ValueError(f"model_name must be a non-empty str, got {self.model_name!r}")

    @classmethod
    def from_options(cls, options: Mapping[str, Any], *, threads: int | None = None,
                     num_workers: int | None = None, **fields_: Any) -> "ServeConfig":
        """``serve_app``'s keyword options: tokenizer fields configure the replica (and the pool's
        workers, but for the replica's session-store bounds), pool fields the pool; others raise."""
        options = dict(options)
        unknown = set(options) - TOKENIZER_OPTIONS - POOL_OPTIONS
        if unknown:
            raise TypeError(f"unknown option(s) {sorted(unknown)}; known: {sorted(TOKENIZER_OPTIONS | POOL_OPTIONS)}")
        if "threads" in options or "num_workers" in options:
            raise TypeError("threads and num_workers are serve_app's own parameters")
        tok = {k: v for k, v in options.items() if k in TOKENIZER_OPTIONS}
        replica = tokenizer_config(None, {**tok, "threads": threads})
        pool = None
        if num_workers:
            pool = pool_config(None, {**{k: v for k, v in tok.items() if k not in REPLICA_ONLY},
                                      **{k: v for k, v in options.items() if k in POOL_OPTIONS},
                                      "num_workers": num_workers})
        elif set(options) & POOL_OPTIONS:
            raise TypeError(f"pool option(s) {sorted(set(options) & POOL_OPTIONS)} need num_workers "
                            "(a pool per replica); a named pool keeps its own")
        return cls(tokenizer=replica, pool=pool, **fields_)


def inflight_limits(max_body_bytes: int, max_inflight_bytes: "int | None" = None,
                    max_client_inflight_bytes: "int | None" = None) -> "tuple[int, int]":
    """(in all, per client): the body bytes requests may hold at once. Given values are kept; a
    default is raised to what one largest body (``max_body_bytes``) needs, and the total to the
    per-client share."""
    client = max_client_inflight_bytes
    if client is None:
        client = max(DEFAULT_MAX_CLIENT_INFLIGHT_BYTES, max_body_bytes)
    total = max_inflight_bytes
    if total is None:
        total = max(DEFAULT_MAX_INFLIGHT_BYTES, client)
    _positive("max_client_inflight_bytes", client)
    _positive("max_inflight_bytes", total)
    return total, client


def _positive(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
