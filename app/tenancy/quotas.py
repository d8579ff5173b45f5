"""What a quota allows (``Limits``), what a request asks of it (``Ask``) and why a request was
refused (``Denial``)."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


@dataclass(frozen=True, slots=True)
class Limits:
    """One quota policy; ``None`` is unlimited."""

    max_requests_per_1_minute: int | None = None
    max_tokens_per_1_minute: int | None = None
    max_tokens_per_1_day: int | None = None
    max_concurrent_requests: int | None = None


UNLIMITED = Limits()


@dataclass(frozen=True, slots=True)
class Ask:
    """A request's claim on token quotas: its prompt, ``n`` choices of at most ``max_tokens``
    each, and the output a choice will likely produce (the length predictor's quantile;
    ``None``: nothing learned, ``max_tokens``).

    It is admitted if its prompt and one token per choice fit (``least``); it reserves what
    it will likely use (``likely_total``), as much of it as the quotas have left; output past
    the reservation is charged as it comes, and where the quotas have nothing left the request
    ends there with ``finish_reason: "length"``. Settled to what was served."""

    prompt: int
    max_tokens: int
    n: int = 1
    likely: int | None = None

    @property
    def least(self) -> int:
        return self.prompt + self.n

    @property
    def most(self) -> int:
        return self.prompt + self.n * self.max_tokens

    @property
    def likely_total(self) -> int:
        per_choice = self.max_tokens if self.likely is None else min(self.likely, self.max_tokens)
        return self.prompt + self.n * max(per_choice, 1)


class Limit(StrEnum):
    REQUESTS = "requests per min (RPM)"
    TOKENS = "tokens per min (TPM)"
    TOKENS_DAY = "tokens per day (TPD)"
    CONCURRENCY = "concurrent requests"


@dataclass(frozen=True, slots=True)
class Denial:
    limit: Limit
    scope: str  # "key key_…" or "tenant ten_…"
    allowed: int
    used: int
    requested: int
    retry_after_s: float
    should_retry: bool  # False: waiting a minute cannot help (daily quota spent, too large)

    @property
    def is_quota(self) -> bool:
        return self.limit is Limit.TOKENS_DAY

    def message(self) -> str:
        if not self.should_retry and self.limit is Limit.TOKENS:
            return (
                f"Request too large for {self.scope} on {self.limit.value}: Limit "
                f"{self.allowed}, Requested {self.requested}. Reduce the prompt."
            )
        if self.is_quota:
            return (
                f"You exceeded your current quota for {self.scope} on {self.limit.value}: "
                f"Limit {self.allowed}, Used {self.used}, Requested {self.requested}. "
                f"It resets at 00:00 UTC (in {self.retry_after_s:.0f}s)."
            )
        return (
            f"Rate limit reached for {self.scope} on {self.limit.value}: Limit {self.allowed}, "
            f"Used {self.used}, Requested {self.requested}. "
            f"Please try again in {duration(self.retry_after_s)}."
        )


def duration(seconds: float) -> str:
    """OpenAI's reset format: ``20ms``, ``1s``, ``6m0s``, ``1h2m3s``."""
    if seconds < 1:
        return f"{max(0, round(seconds * 1000))}ms"
    whole = round(seconds)
    h, rest = divmod(whole, 3600)
    m, s = divmod(rest, 60)
    if h:
        return f"{h}h{m}m{s}s"
    if m:
        return f"{m}m{s}s"
    return f"{s}s"
