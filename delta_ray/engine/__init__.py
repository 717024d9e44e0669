"""What runs an engine at request time: the native engines, the guard that keeps each to the code
points where it was proven exact, the switch that holds the engine in use with its fast path, the
shadow verifier that re-checks a share of its answers, and the admission records the switch reads
and writes. Admitting an engine (the probe, the fuzzer, the battery) is delta_ray/verify/'s job."""
