"""The batch benches' corpus: documents of 0.2K-8K characters plus two huge ones.

bench_files and bench_data tokenize the same rows, so their figures compare.
"""
from __future__ import annotations

from delta_ray.apps.sample_text import doc_source


def corpus_rows(mb: int, docs=None) -> list[str]:
    """About ``mb`` MB of documents plus two huge ones of 2M and 4M characters a third and two
    thirds of the way in (the batch benches' corpus)."""
    docs = docs or doc_source()
    rows = docs(mb * 1_000_000)
    rows.insert(len(rows) // 3, (docs.src * 2)[:2_000_000])
    rows.insert(2 * len(rows) // 3, (docs.src * 2)[1_000_000:5_000_000])
    return rows
