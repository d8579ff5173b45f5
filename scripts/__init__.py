"""Benchmark and build scripts; run from the repository root as ``python -m scripts.NAME``."""
