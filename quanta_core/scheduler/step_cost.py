"""What a step costs: a line with a per-sequence and a per-token term, learnt online.

    mean(s, t, a)     = base + seq_s * s + token_s * (t - s) + attn_s * a
                        s sequences, t tokens in all, a thousand attended (query, key) pairs
    estimate(s, t, a) = mean(s, t, a) * margin                what the policy plans against

The attention term: each token attends over its own sequence's cells before it (a stream
per sequence), so a chunk of n tokens from position p attends n * p + n (n + 1) / 2 pairs
and a decode at context c attends c. At short contexts it is nothing; at real prompt
lengths it is most of the step (a 7,600-token prompt attends ~29 million pairs, as many
seconds again as its per-token cost on the reference CPU), and a line without it prices a
long prompt's first token several times too early, or, having learnt from long ones, a
short one too late. Its price is the configured one (``step_attn_s``, a calibration's),
not learnt: in served steps the pairs move with the sequences and the tokens (decodes at
one context, chunks of one size), and a fourth coefficient learnt from them on a busy
machine ran far above its price and dragged the intercept with it. The line learns what
is left once attention is taken out.

Why this shape. A decode-only step and a step carrying a prefill chunk cost different things:
every sequence pays a per-sequence term (its sampled row, its attention), every prompt token
beyond the first pays a per-token term. On the reference machine the two deviate from any
prior by different factors (prefill beside running streams runs 2-3x the prior while decodes
stay close), so one correction ratio for both would price the mixed steps that matter most for
the inter-token target wrongly.

How it learns. Exponentially weighted least squares over ``(1, s, t - s) -> seconds``: every
measured step adds ``x x^T`` and ``x y`` to running sums that decay by ``step_forgetting``
per step (a memory of ~1 / (1 - forgetting) steps, so it follows the context lengths and the
KV layout as they drift). The prior enters as a ridge term that never decays: each of its
three coefficients is worth ``step_prior_weight`` steps of a typical size (8 sequences, a
32-token chunk), so a direction the recent steps do not excite (only decodes at one batch
size, say) stays where the prior put it instead of drifting (no covariance wind-up, the usual
trouble of recursive least squares with forgetting), while the ~50 recent steps it
remembers outweigh it where they do excite it. One global model rather than one per
batch size: the measured costs are linear in s over the range the policies use (1-16), and a
global fit learns from every step instead of splitting them across buckets. A 3x3 solve per
measured step: O(1).

The margin: a high quantile (``step_quantile``) of ``measured / mean`` over the last
``step_window`` measured steps, each residual taken before that step was learnt (out of sample).
Never below 1: the policy plans a step to be at least as slow as the mean. A step with no
timing (the fake executor) teaches nothing and leaves the model at its prior.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections import deque
from collections.abc import Callable, Sequence
from typing import Protocol

from quanta_core.scheduler.slo import SloConfig

Vec = tuple[float, float, float, float]
Mat = list[list[float]]
_N = 3  # the coefficients learnt: base, per sequence, per token

# A typical step's features (1, sequences, extra tokens): the scale the prior's weight is in.
_PRIOR_SCALE = (1.0, 8.0, 32.0)


def _features(n_seqs: int, n_tokens: int, pairs_k: float = 0.0) -> Vec:
    n_seqs = max(n_seqs, 1)
    return (1.0, float(n_seqs), float(max(n_tokens - n_seqs, 0)), max(pairs_k, 0.0))


def attended_k(start: int, n_tokens: int) -> float:
    """Thousands of (query, key) pairs ``n_tokens`` from position ``start`` attend."""
    return (n_tokens * start + n_tokens * (n_tokens + 1) / 2) / 1000.0


def _solve(a: Mat, b: list[float]) -> tuple[float, float, float] | None:
    """``a x = b`` for 3x3 ``a`` (``_solve_n``)."""
    x = _solve_n(a, b, tiny=1e-18)
    return None if x is None else (x[0], x[1], x[2])


class StepCostModel:
    def __init__(self, config: SloConfig) -> None:
        self.prior_theta: Vec = (
            config.step_base_s,
            config.step_seq_s,
            config.step_token_s,
            config.step_attn_s,
        )
        self.forgetting = config.step_forgetting
        self.quantile = config.step_quantile
        self._a: Mat = [[0.0] * _N for _ in range(_N)]  # decaying sum of w x x^T (measured)
        self._b = [0.0] * _N  # decaying sum of w x y
        self._a0: Mat = [[0.0] * _N for _ in range(_N)]  # the prior's pseudo-observations
        self._b0 = [0.0] * _N
        for i, scale in enumerate(_PRIOR_SCALE):
            self._a0[i][i] = config.step_prior_weight * scale * scale
            self._b0[i] = self._a0[i][i] * self.prior_theta[i]
        self.theta: Vec = self.prior_theta
        self._ratios: deque[float] = deque(maxlen=config.step_window)
        self._ranked: list[float] = []  # the same, sorted: the quantile without a sort per step
        self.margin = 1.0

    @staticmethod
    def _add(a: Mat, b: list[float], x: Vec, y: float, w: float) -> None:
        for i in range(_N):
            b[i] += w * x[i] * y
            for j in range(_N):
                a[i][j] += w * x[i] * x[j]

    def prior(self, n_seqs: int, n_tokens: int, pairs_k: float = 0.0) -> float:
        return _dot(self.prior_theta, _features(n_seqs, n_tokens, pairs_k))

    def mean(self, n_seqs: int, n_tokens: int, pairs_k: float = 0.0) -> float:
        """The expected seconds of a step of ``n_seqs`` sequences carrying ``n_tokens``
        that attend ``pairs_k`` thousand pairs."""
        return _dot(self.theta, _features(n_seqs, n_tokens, pairs_k))

    def estimate(self, n_seqs: int, n_tokens: int, pairs_k: float = 0.0) -> float:
        """Seconds to plan for: the mean times the learnt margin (a high quantile)."""
        return self.mean(n_seqs, n_tokens, pairs_k) * self.margin

    def observe(self, n_seqs: int, n_tokens: int, seconds: float, pairs_k: float = 0.0) -> None:
        if n_seqs < 1 or seconds <= 0:
            return
        x = _features(n_seqs, n_tokens, pairs_k)
        ratio = seconds / max(self.mean(n_seqs, n_tokens, pairs_k), 1e-9)
        learnt = seconds - self.theta[3] * x[3]  # what the line is to explain
        if len(self._ratios) == self._ratios.maxlen:
            del self._ranked[bisect_left(self._ranked, self._ratios[0])]  # the one that drops out
        self._ratios.append(ratio)
        insort(self._ranked, ratio)
        lam = self.forgetting
        for i in range(_N):
            self._b[i] *= lam
            for j in range(_N):
                self._a[i][j] *= lam
        self._add(self._a, self._b, x, learnt, 1.0)
        self._refit()

    def _refit(self) -> None:
        a = [[self._a0[i][j] + self._a[i][j] for j in range(_N)] for i in range(_N)]
        b = [self._b0[i] + self._b[i] for i in range(_N)]
        theta = _solve(a, b)
        if theta is not None:
            # A step never gets cheaper with more sequences or tokens: keep the slopes
            # positive (a noisy window can tilt the plane), the intercept non-negative.
            base, seq, tok = theta
            self.theta = (max(base, 0.0), max(seq, 1e-6), max(tok, 1e-6), self.theta[3])
        ranked = self._ranked
        k = min(int(self.quantile * len(ranked)), len(ranked) - 1)
        self.margin = max(ranked[k], 1.0)

    def reseed(self, theta: Vec) -> None:
        """Make ``theta`` (four terms, attention's included: ``fit_steps``, measured on this
        machine) the prior, and forget what was learnt against the old one: its line was
        learnt with the old attention price taken out, and its margin against its mean."""
        self.prior_theta = theta
        for i in range(_N):
            self._b0[i] = self._a0[i][i] * theta[i]
            self._b[i] = 0.0
            self._a[i] = [0.0] * _N
        self.theta = theta
        self._ratios.clear()
        self._ranked.clear()
        self.margin = 1.0

    # ---- what the policies ask ----

    def max_seqs(self, target_s: float, limit: int, context: float = 0.0) -> int:
        """The most decoding sequences (one token each, at ``context`` cells each) whose
        step fits ``target_s``; >= 1."""
        return _max_seqs(self.estimate, target_s, limit, context)

    def max_tokens(
        self,
        n_seqs: int,
        target_s: float,
        limit: int,
        context: float = 0.0,
        start: int = 0,
        *,
        at_mean: bool = False,
    ) -> int:
        """The most tokens a step of ``n_seqs`` sequences (decoding at ``context`` cells)
        may carry within ``target_s``, the extra ones a chunk from position ``start``;
        priced with the margin (a bound per step), or ``at_mean`` (a step's length on
        average).

        Never fewer than ``n_seqs``: every running stream gets its token, even when the
        target cannot be met (then it is missed, and admission stops adding to it).
        """
        n_seqs = max(n_seqs, 1)
        base, seq, tok, attn = self.theta
        margin = 1.0 if at_mean else self.margin
        spare = target_s / margin - base - seq * n_seqs - attn * n_seqs * context / 1000
        per_token = tok + attn * start / 1000
        extra = int(spare / per_token) if spare > 0 else 0
        return max(n_seqs, min(limit, n_seqs + extra))

    def room(self, n_seqs: int, n_tokens: int, target_s: float) -> int:
        """The most tokens one more sequence may carry in a step that holds ``n_seqs``
        sequences and ``n_tokens`` tokens, within ``target_s`` (0: not even one)."""
        if self.estimate(n_seqs + 1, n_tokens + 1) > target_s:
            return 0
        spare = target_s / self.margin - self.mean(n_seqs + 1, n_tokens + 1)
        return 1 + int(spare / self.theta[2])

    def decode_step_s(self, n_seqs: int, context: float = 0.0) -> float:
        """A decode step of ``n_seqs`` streams at ``context`` cells each."""
        return self.estimate(n_seqs, n_seqs, n_seqs * context / 1000)

    def prefill_s(self, n_tokens: int, n_decoding: int, step_tokens: int, start: int = 0) -> float:
        """Prefilling ``n_tokens`` from position ``start`` in chunks beside ``n_decoding``
        streams, ``step_tokens`` tokens per step in all: full chunks, then the rest."""
        return _prefill_s(self.estimate, n_tokens, n_decoding, step_tokens, start)

    def at_mean(self) -> MeanCosts:
        return MeanCosts(self)


class StepCosts(Protocol):
    """What admission's projections ask of a step-cost model."""

    def estimate(self, n_seqs: int, n_tokens: int, pairs_k: float = 0.0) -> float: ...
    def decode_step_s(self, n_seqs: int, context: float = 0.0) -> float: ...
    def prefill_s(
        self, n_tokens: int, n_decoding: int, step_tokens: int, start: int = 0
    ) -> float: ...
    def max_tokens(
        self, n_seqs: int, target_s: float, limit: int, context: float = 0.0, start: int = 0
    ) -> int: ...


class MeanCosts:
    """The same learnt model priced at its mean, for projections over many steps: their
    noise averages out, so a per-step high quantile summed over a projection is far too
    late (on a shared machine the quantile of a short window is its worst step). Chunk
    sizes for the inter-token target keep the model's margin: that is a bound per step."""

    def __init__(self, model: StepCostModel) -> None:
        self.model = model

    def estimate(self, n_seqs: int, n_tokens: int, pairs_k: float = 0.0) -> float:
        return self.model.mean(n_seqs, n_tokens, pairs_k)

    def decode_step_s(self, n_seqs: int, context: float = 0.0) -> float:
        return self.model.mean(n_seqs, n_seqs, n_seqs * context / 1000)

    def prefill_s(self, n_tokens: int, n_decoding: int, step_tokens: int, start: int = 0) -> float:
        return _prefill_s(self.estimate, n_tokens, n_decoding, step_tokens, start)

    def max_tokens(
        self, n_seqs: int, target_s: float, limit: int, context: float = 0.0, start: int = 0
    ) -> int:
        return self.model.max_tokens(n_seqs, target_s, limit, context, start)

    def max_seqs(self, target_s: float, limit: int, context: float = 0.0) -> int:
        """The most decoding sequences whose mean step fits ``target_s``; >= 1."""
        return _max_seqs(self.estimate, target_s, limit, context)


Estimate = Callable[[int, int, float], float]


def _max_seqs(estimate: Estimate, target_s: float, limit: int, context: float = 0.0) -> int:
    """The largest n in 1..``limit`` whose decode step (n sequences, a token each) fits
    ``target_s``, 1 when none does. A bisection: the step's price only grows with n (the
    slopes are kept positive), and the policies ask this every cycle, before the next plan,
    with ``limit`` the running slots (256 on a GPU): a count up from 1 is linear in them."""
    lo, hi = 1, limit
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if estimate(mid, mid, mid * context / 1000) <= target_s:
            lo = mid
        else:
            hi = mid - 1
    return lo


def _prefill_s(
    estimate: Estimate, n_tokens: int, n_decoding: int, step_tokens: int, start: int = 0
) -> float:
    """Full chunks, then the rest; a step is linear in its attended pairs, so the full
    chunks are priced as one step's tokens times their number plus all their pairs (the
    decoding streams' attention is left out: the callers price it in their decode steps)."""
    if n_tokens <= 0:
        return 0.0
    chunk = max(step_tokens - n_decoding, 1)
    full, rest = divmod(n_tokens, chunk)
    seqs = n_decoding + 1
    total = 0.0
    if full:
        # chunk k (0-based) starts at start + k * chunk
        pairs = full * attended_k(start, chunk) + chunk * chunk * full * (full - 1) / 2000
        total = full * estimate(seqs, n_decoding + chunk, 0.0)
        total += estimate(seqs, n_decoding + chunk, pairs) - estimate(seqs, n_decoding + chunk, 0.0)
    if rest:
        total += estimate(seqs, n_decoding + rest, attended_k(start + full * chunk, rest))
    return total


def _dot(a: Vec, b: Vec) -> float:
    return a[0] * b[0] + a[1] * b[1] + a[2] * b[2] + a[3] * b[3]


Sample = tuple[int, int, float, float]  # (sequences, tokens, thousand pairs, seconds)
_FIT_FLOOR: Vec = (0.0, 1e-6, 1e-6, 0.0)


def fit_steps(samples: Sequence[Sample], prior: Vec, ridge: float = 1e-3) -> Vec:
    """The four terms (base, per sequence, per token, per thousand attended pairs) that fit
    ``samples`` best in least squares, relative error weighted (a short step counts as much
    as a long one): the warm-up's measurement of a machine. ``ridge`` pulls each term a
    little towards ``prior``, so that a direction the samples do not excite stays there."""
    n = 4
    a = [[0.0] * n for _ in range(n)]
    b = [0.0] * n
    for n_seqs, n_tokens, pairs_k, seconds in samples:
        if seconds <= 0:
            continue
        x = _features(n_seqs, n_tokens, pairs_k)
        w = 1.0 / (seconds * seconds)
        for i in range(n):
            b[i] += w * x[i] * seconds
            for j in range(n):
                a[i][j] += w * x[i] * x[j]
    for i in range(n):  # the ridge, on the data's own scale of each term
        reg = ridge * max(a[i][i], 1e-12)
        a[i][i] += reg
        b[i] += reg * prior[i]
    theta = _solve_n(a, b)
    if theta is None:
        return prior
    return (
        max(theta[0], _FIT_FLOOR[0]),
        max(theta[1], _FIT_FLOOR[1]),
        max(theta[2], _FIT_FLOOR[2]),
        max(theta[3], _FIT_FLOOR[3]),
    )


def _solve_n(a: Mat, b: list[float], tiny: float = 1e-30) -> list[float] | None:
    """``a x = b`` for square ``a`` by Gaussian elimination with partial pivoting; None
    where a pivot is under ``tiny`` (singular)."""
    n = len(b)
    m = [[*row, b[i]] for i, row in enumerate(a)]
    for col in range(n):
        pivot = max(range(col, n), key=lambda r: abs(m[r][col]))
        if abs(m[pivot][col]) < tiny:
            return None
        m[col], m[pivot] = m[pivot], m[col]
        for r in range(col + 1, n):
            f = m[r][col] / m[col][col]
            for c in range(col, n + 1):
                m[r][c] -= f * m[col][c]
    x = [0.0] * n
    for r in range(n - 1, -1, -1):
        x[r] = (m[r][n] - sum(m[r][c] * x[c] for c in range(r + 1, n))) / m[r][r]
    return x
