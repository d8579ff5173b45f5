"""Reliability benchmarks: soak, chaos and overload against a real ``quanta run`` process."""
