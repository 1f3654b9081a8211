"""Benchmarks of memwal_datasource against pylance's native writer and the raw disk.

Run ``python -m benchmarks.run`` (or ``make bench``); see ``benchmarks/run.py``.
Results land in ``benchmarks/results/``. Speed is measured here, never asserted
in tests.
"""
