"""Typed failures of an executor."""

from __future__ import annotations


class EngineError(Exception):
    """Base of every executor failure."""


class EngineInputError(EngineError):
    """The plan was invalid (unknown sequence, position gap, batch too large, overflow…).

    Nothing in the engine changed; the worker is alive and the next plan may run.
    """


class EngineDied(EngineError):
    """The worker process is gone (crash, kill, out of memory) or hung and was killed.

    ``held_seqs`` are the sequences that had KV in it: their KV is lost. Stashes survive.
    Call ``restart()`` for a fresh, empty worker.
    """

    def __init__(self, message: str, held_seqs: frozenset[int], exit_code: int | None) -> None:
        super().__init__(message)
        self.held_seqs = held_seqs
        self.exit_code = exit_code


class EngineHung(EngineDied):
    """The worker did not answer within the step timeout and was killed."""


class EngineStartError(EngineError):
    """A worker could not be started (bad model file, out of memory…)."""
