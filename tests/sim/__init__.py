"""A deterministic simulator of the commit protocol (see test_sim.py)."""
