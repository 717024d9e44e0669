"""Where a session lives: rendezvous (highest-random-weight) hashing over CRC-32.

Routing is a pure function of the session key and the set of live nodes (pool workers, Serve
replicas), so every pool, every Serve router and every restart agrees on a session's home without
shared state, and a session's cached prefix stays on one node for as long as the node set does not
change. When a node joins or leaves, only the sessions that move to the new node, or that lived
on the one that left, change home (about 1/n of them), unlike a modulo which moves nearly all.
"""
from __future__ import annotations

import functools
import zlib
from typing import Iterable, Sequence


def _utf8(text: str) -> bytes:
    # surrogatepass: a lone surrogate must not crash routing; the encoder rejects such text later
    # with a proper error, and for valid text this is exactly UTF-8.
    return text.encode("utf-8", "surrogatepass")


def _mix32(h: int) -> int:
    """MurmurHash3's 32-bit finalizer: a bijection with full avalanche.

    CRC-32 is linear (crc(a) ^ crc(b) has structure), so the key's and the node's CRCs are
    combined and then mixed; without the mix, the winner of ``max`` would follow the bits of the
    node ids and split keys unevenly.
    """
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & 0xFFFFFFFF
    h ^= h >> 16
    return h


def worker_name(i: int) -> str:
    """The id of a pool's ``i``-th worker: routing weighs ids, so the pool and anything that must
    agree with it on a session's home (the scale-out simulation) name workers alike."""
    return f"w{i:03d}"


def key_hash(key: str) -> int:
    """CRC-32 of the key's UTF-8 bytes (the routing hash a client or load balancer can reproduce)."""
    return zlib.crc32(_utf8(key))


@functools.lru_cache(maxsize=65536)
def _node_mix(node: str) -> int:
    """The node's half of its weight, the same for every key: computed once per node id, not once
    per key and node (without this cache it was most of a decision over many nodes)."""
    return _mix32(zlib.crc32(_utf8(node)))


def node_score(key_crc: int, node: str) -> int:
    """The rendezvous weight of ``node`` for a key whose CRC-32 is ``key_crc``."""
    return _mix32(key_crc ^ _node_mix(node))


def rendezvous_order(key: str, nodes: Iterable[str]) -> list[str]:
    """``nodes`` (de-duplicated) from the key's home to its last fallback, by rendezvous weight.

    Ties (two node ids with equal weight) are broken by the id, so the order never depends on how
    the caller lists the nodes.
    """
    k = key_hash(key)
    return sorted(set(nodes), key=lambda n: (node_score(k, n), n), reverse=True)


def home_worker(session_key: str, live_workers: Sequence[str]) -> str:
    """Return the home of ``session_key`` among ``live_workers``: the highest rendezvous weight.

    The answer does not depend on the order or repetition of ``live_workers``. Raises ValueError
    when no worker is live.
    """
    if not live_workers:
        raise ValueError("no live workers to route to")
    k = key_hash(session_key)
    best, best_score = "", -1
    for n in live_workers:
        h = node_score(k, n)
        if h > best_score or (h == best_score and n > best):
            best, best_score = n, h
    return best
