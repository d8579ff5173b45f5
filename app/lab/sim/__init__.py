"""``quanta sim``: one workload through the real scheduler on the virtual clock."""

from app.lab.sim.command import sim

__all__ = ["sim"]
