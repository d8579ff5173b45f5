"""``quanta sweep``: policies × loads on the virtual clock, with curves and plots."""

from app.lab.sweep.command import sweep

__all__ = ["sweep"]
