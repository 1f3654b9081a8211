"""Benchmarks of memwal_datasource against what a user would write instead.

``make bench`` / ``python -m benchmarks.run`` (see ``benchmarks/run.py``): one harness
(``harness.py``) and one file per scenario (``bench_<name>.py``); results land in
``benchmarks/results/``. Speed is measured here, never asserted in tests.
"""
