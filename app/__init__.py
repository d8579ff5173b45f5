"""Quanta's web layer: settings, the CLI and (later) the HTTP API around the scheduler core."""
