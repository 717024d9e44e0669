"""The fast tier: native engines and the verification that admits them (probe, fuzz, battery, guard), and the shadow check at run time. Imports only the core."""
