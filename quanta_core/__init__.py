"""Quanta's core: pure Python, no web and no database; time only from an injected clock."""
