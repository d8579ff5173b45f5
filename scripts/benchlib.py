"""``app.lab.measure.common`` under its old name, for ``scripts/bench_fleet.py`` until that
moves into the lab as a ``quanta bench`` command."""

from app.lab.measure.common import console, environment, write_results

__all__ = ["console", "environment", "write_results"]
