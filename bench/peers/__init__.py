"""What users run instead of delta-ray, as the demo and the benches run it beside delta-ray.

The modules a peer runs as its own process (:mod:`.plain_script`, :mod:`.plain_server`) import
nothing of this project: importing delta-ray pins fastokens to one thread, and a peer runs with its
own defaults.
"""
