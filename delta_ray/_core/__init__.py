"""The exact core: loading and admission, the cut predicate and planner, session repair and state, Arrow assembly, the
encoder protocol. Imports nothing else of the project (tests/core/test_layout.py)."""
