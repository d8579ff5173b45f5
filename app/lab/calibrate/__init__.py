"""``quanta calibrate``: fit a cost model from the real engine (a grid of probe steps, then a
served phase), written under ``config/cost_models/``."""
