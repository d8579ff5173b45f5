"""``quanta step-report`` and ``quanta step-replay``: read a server's step trace, and replay it
through the cost model."""

from app.lab.steps.replay import step_replay
from app.lab.steps.report import step_report

__all__ = ["step_replay", "step_report"]
