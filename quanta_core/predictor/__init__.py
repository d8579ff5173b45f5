"""Online output-length prediction (for memory-aware admission and shortest-first order)."""

from quanta_core.predictor.predictor import LengthPredictor, Prediction, length_keys
from quanta_core.predictor.window import LengthWindow

__all__ = ["LengthPredictor", "LengthWindow", "Prediction", "length_keys"]
