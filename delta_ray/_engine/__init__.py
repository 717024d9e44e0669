"""What runs an engine at request time: the engine that encodes every piece (the reference or the
admitted fast tier, guarded, confined and shadow-checked, read once per call), the native engines,
the guard that keeps each to the code points where it was proven exact, the shadow verifier and the
admission records the engine reads and writes. Admitting an engine (the probe, the fuzzer, the
battery) is delta_ray/_verify/'s job."""
