"""delta-ray's benchmarks, its demo, the peers they measure it against and the scale-out lab.

Not part of the installed package: run from a checkout (``bench/README.md``). The package never
imports this folder; this folder imports the package.
"""
