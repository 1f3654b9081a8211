"""Benchmarks of memwal_datasource against what a user would write instead: ``make bench``
(``benchmarks/run.py``). Speed is measured here, never asserted in tests.
"""
