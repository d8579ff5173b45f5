"""What a step costs: a line through the measured figures, corrected online per batch size.

    estimate(s, t) = prior(s, t) * ratio[bucket(s)]
    prior(s, t)    = base + seq_s * s + token_s * (t - s)      s sequences, t tokens in all

``observe`` folds each measured step into an EWMA of ``measured / prior`` for its bucket of
batch sizes (1, 2, 3-4, 5-8, ... 65+), so the model learns what this machine (and its context
lengths, and llama.cpp's KV layout) really costs without ever leaving the prior's shape. A
step with no timing (the fake executor) teaches nothing. O(1) per step.
"""

from __future__ import annotations

from quanta_core.scheduler.slo import SloConfig

_BUCKETS = 8  # 1, 2, 3-4, 5-8, 9-16, 17-32, 33-64, 65+


def _bucket(n_seqs: int) -> int:
    return min(max(n_seqs - 1, 0).bit_length(), _BUCKETS - 1)


class StepCostModel:
    def __init__(self, config: SloConfig) -> None:
        self.base_s = config.step_base_s
        self.seq_s = config.step_seq_s
        self.token_s = config.step_token_s
        self.alpha = config.step_ewma_alpha
        self._ratio = [1.0] * _BUCKETS

    def prior(self, n_seqs: int, n_tokens: int) -> float:
        n_seqs = max(n_seqs, 1)
        return self.base_s + self.seq_s * n_seqs + self.token_s * max(n_tokens - n_seqs, 0)

    def estimate(self, n_seqs: int, n_tokens: int) -> float:
        """Seconds for one step of ``n_seqs`` sequences carrying ``n_tokens`` tokens."""
        return self.prior(n_seqs, n_tokens) * self._ratio[_bucket(n_seqs)]

    def observe(self, n_seqs: int, n_tokens: int, seconds: float) -> None:
        if n_seqs < 1 or seconds <= 0:
            return
        b = _bucket(n_seqs)
        measured = seconds / self.prior(n_seqs, n_tokens)
        self._ratio[b] += self.alpha * (measured - self._ratio[b])

    def max_seqs(self, target_s: float, limit: int) -> int:
        """The most decoding sequences (one token each) whose step fits ``target_s``; >= 1."""
        n = 1
        while n < limit and self.estimate(n + 1, n + 1) <= target_s:
            n += 1
        return n

    def max_tokens(self, n_seqs: int, target_s: float, limit: int) -> int:
        """The most tokens a step of ``n_seqs`` sequences may carry within ``target_s``.

        Never fewer than ``n_seqs``: every running stream gets its token, even when the
        target cannot be met (then it is missed, and admission stops adding to it).
        """
        n_seqs = max(n_seqs, 1)
        spare = target_s / self._ratio[_bucket(n_seqs)] - self.base_s - self.seq_s * n_seqs
        extra = int(spare / self.token_s) if spare > 0 else 0
        return max(n_seqs, min(limit, n_seqs + extra))

    def decode_step_s(self, n_seqs: int) -> float:
        return self.estimate(n_seqs, n_seqs)

    def prefill_s(self, n_tokens: int, n_decoding: int, step_tokens: int) -> float:
        """Prefilling ``n_tokens`` in chunks beside ``n_decoding`` streams, ``step_tokens``
        tokens per step in all: full chunks, then the rest."""
        if n_tokens <= 0:
            return 0.0
        chunk = max(step_tokens - n_decoding, 1)
        full, rest = divmod(n_tokens, chunk)
        seqs = n_decoding + 1
        total = full * self.estimate(seqs, n_decoding + chunk)
        return total + (self.estimate(seqs, n_decoding + rest) if rest else 0.0)
