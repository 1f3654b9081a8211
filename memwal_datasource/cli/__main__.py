"""``python -m memwal_datasource.cli``: the ``memwal`` command without the console script."""

from . import run

run()
