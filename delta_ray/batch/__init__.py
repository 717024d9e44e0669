"""Batch files without Ray: the inputs (text, JSONL, Parquet, compressed), and their tokenization into
Parquet on this machine (``delta-ray tokenize``'s local path; Ray Data's path, ``actors/data.py``,
reads the same inputs)."""
