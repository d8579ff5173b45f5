"""One request's meter: what its quotas reserved, what its client was served, and the one
settlement that charges it.

    reserved   the limiter's ``Charge`` made at admission (``Tenancy.reserve``)
    served     what the request's run reports, one way, from the OpenAI layer:
                 running(run)           its figures changed (a choice ended, a refusal)
                 sending(output_tokens) a write is about to go out; once it lands the
                                        client holds this many output tokens in all
               and whether each write reached the client, from the tenancy middleware:
                 written(reached)       reached: served; not: taken back out
    settled    close(): the limiter is settled with what was served and the ledger records
               it; once, however often it is called

Exactly once, whichever process dies:

    sending ──▶ ledger.ahead(the whole service so far, this write included)   journal first
            ──▶ the write ──▶ written(True):  it is served
                          └─▶ written(False): ledger.ahead(the service without it)
    flush   ──▶ progress(): a ``partial`` row of what was sent since the last one
    close   ──▶ ledger.ahead(total) + ledger.record(final row: the rest)

The journal holds a write before the client does, so a server killed mid-stream still
charges what its clients were sent (``replay``), and never what a failed write did not
deliver. The partial rows and the final row sum to the total, so nothing is charged twice.
A failure that sent no output (a 500) is charged nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from app.tenancy.directory import KeyView
from app.tenancy.ledger import PARTIAL, LedgerWriter, UsageRow
from app.tenancy.limiter import Charge, Limiter

# Output past a reservation is charged in steps of this many tokens (fewer where less is left).
GROW_STEP = 16


@dataclass(frozen=True, slots=True)
class Run:
    """A request's run as its server reports it: everything but the output sent."""

    # completed | cancelled | error | rejected; ``cancelled`` while no end is known
    status: str = "cancelled"
    prompt_tokens: int = 0
    cached_tokens: int = 0
    queue_s: float | None = None
    ttft_s: float | None = None


@dataclass(frozen=True, slots=True)
class Outcome:
    """What a request was served: its run, and the output that reached its client."""

    status: str  # completed | cancelled | error | rejected
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    queue_s: float | None = None
    ttft_s: float | None = None


NOTHING_SERVED = Outcome("error")


class Meter:
    def __init__(
        self,
        limiter: Limiter,
        ledger: LedgerWriter,
        clock: Callable[[], float],
        key: KeyView,
        request_id: str,
        charge: Charge,
        prompt: int = 0,
    ) -> None:
        self._limiter = limiter
        self._ledger = ledger
        self._clock = clock
        self._key = key
        self._request_id = request_id
        self._charge = charge
        self._prompt = prompt
        self._run: Run | None = None  # None: nothing ran (the request was never started)
        self._sent = 0  # output tokens in the writes that reached the client
        self._sending = 0  # ... and in the write under way
        self._written = (0, 0, 0)  # prompt, cached, completion tokens in partial rows
        ledger.watch(self)

    # ---- from the OpenAI layer ----

    def allows(self, output_tokens: int) -> bool:
        """May the request have produced ``output_tokens`` (all choices) in all? Output past
        the reservation is charged as it comes; False where the quotas have nothing left."""
        charge = self._charge
        over = self._prompt + output_tokens - charge.tokens
        if over <= 0 or charge.settled:
            return not charge.settled
        return self._limiter.grow(charge, max(over, GROW_STEP), self._clock()) >= over

    def running(self, run: Run) -> None:
        """The run's figures now (they change when a choice ends or the run is refused)."""
        self._run = run

    def sending(self, output_tokens: int) -> None:
        """A write is about to go out; once it lands the client holds ``output_tokens``
        in all. Journalled first, so that a crash during the write still charges it."""
        self._sending = output_tokens
        if not self._charge.settled and self._run is not None:
            self._ahead(self._outcome(output_tokens))

    # ---- from the tenancy middleware ----

    @property
    def writing(self) -> bool:
        """A write was announced (``sending``) and is not yet known to have ended."""
        return self._sending != self._sent

    def written(self, reached: bool) -> None:
        """The write announced last ended. One that did not reach the client is journalled
        out again (the cumulative row without it), so a crash now does not charge it."""
        if reached:
            self._sent = self._sending
            return
        self._sending = self._sent
        if not self._charge.settled and self._run is not None:
            self._ahead(self.outcome())

    def close(self) -> None:
        """Settle: the quotas and the ledger get what was served. Once; later calls do
        nothing."""
        if self._charge.settled:
            return
        self._ledger.unwatch(self)
        now = self._clock()
        out = self.outcome()
        served = self._run is not None and out.status != "rejected"
        charged = _charged(out) if served else 0
        self._limiter.settle(self._charge, charged, now, count_request=served)
        self._ledger.ahead(self._total(out, now))
        self._ledger.record(self._row(out, now))

    # ---- read ----

    def outcome(self) -> Outcome:
        """What the request was served so far: its run and the writes that reached the client."""
        return self._outcome(self._sent) if self._run is not None else NOTHING_SERVED

    def progress(self) -> UsageRow | None:
        """The tokens sent since the last partial row (the ledger asks at each flush)."""
        if self._charge.settled or self._run is None:
            return None
        out = self.outcome()
        if out.completion_tokens == self._written[2] or out.status == "rejected":
            return None
        return self._row(replace(out, status=PARTIAL), self._clock())

    def _outcome(self, output_tokens: int) -> Outcome:
        run = self._run
        assert run is not None
        return Outcome(
            run.status, run.prompt_tokens, run.cached_tokens, output_tokens, run.queue_s, run.ttft_s
        )

    def _ahead(self, out: Outcome) -> None:
        self._ledger.ahead(self._total(out, self._clock(), PARTIAL))

    def _total(self, out: Outcome, now: float, status: str | None = None) -> UsageRow:
        """``out`` as one cumulative row: the request's whole service so far (``status``:
        the row's instead of the outcome's)."""
        key = self._key
        return UsageRow(
            request_id=self._request_id,
            tenant_id=key.tenant_id,
            key_id=key.id,
            slo_class=key.slo_class.value,
            status=out.status if status is None else status,
            prompt_tokens=out.prompt_tokens,
            cached_tokens=out.cached_tokens,
            completion_tokens=out.completion_tokens,
            charged_tokens=_charged(out) if out.status != "rejected" else 0,
            queue_s=out.queue_s,
            ttft_s=out.ttft_s,
            duration_s=now - self._charge.at,
            started_at=self._charge.at,
            finished_at=now,
        )

    def _row(self, out: Outcome, now: float) -> UsageRow:
        """``out`` less what the partial rows already hold; they then hold all of it."""
        total = self._total(out, now)
        p0, c0, o0 = self._written
        self._written = (out.prompt_tokens, out.cached_tokens, out.completion_tokens)
        charged_before = p0 + o0 if o0 else 0  # partial rows exist once output was sent
        return replace(
            total,
            prompt_tokens=out.prompt_tokens - p0,
            cached_tokens=out.cached_tokens - c0,
            completion_tokens=out.completion_tokens - o0,
            charged_tokens=total.charged_tokens - charged_before,
        )


def _charged(out: Outcome) -> int:
    """A request is charged its prompt and the output its client was sent; one that failed
    before sending any output was not served, and is charged nothing."""
    if out.status == "error" and out.completion_tokens == 0:
        return 0
    return out.prompt_tokens + out.completion_tokens
