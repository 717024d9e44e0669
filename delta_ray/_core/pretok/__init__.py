"""Safe-cut transitions derived from a tokenizer's own pre-tokenizer (no hand-written families)."""
