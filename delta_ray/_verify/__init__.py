"""Admitting a native engine: the probe (contexts, guard set), the fuzzer, the verification battery, and the admission
that runs them and chooses the engine (``admit``). Imports the core, the runtime and the engine it admits."""
