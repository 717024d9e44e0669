"""The pool at scale: a discrete-event simulation driven by the real scheduler, the service times it
is fed (measured on the machine at hand), its validation against the real pool, and its grid.

``python -m bench.scaleout`` measures, validates and runs the grid; ``python -m
bench.scaleout.manycore`` checks the real pool at 4, 8 and 16 workers against the simulation.
"""
