"""Stateless chunks as Ray tasks: encode pieces with no post-processing, return int32 buffers."""
from __future__ import annotations

import numpy as np
import ray

from .tokenizer_cache import get_tokenizer


@ray.remote(max_retries=3)
def encode_chunks(config_bytes: bytes, digest: str, pieces: list[str], options: dict) -> list[np.ndarray]:
    """IDs of each piece (reference-exact, add_special_tokens=False) from a cached tokenizer."""
    dt = get_tokenizer(config_bytes, digest, **options)
    return dt.encoder.encode_pieces(pieces)
