"""What a delta-ray process needs around the exact core: the private on-disk cache and its lock,
clean exit of its background threads, and a heap kept out of full garbage collections. Imports
nothing else of the project."""
