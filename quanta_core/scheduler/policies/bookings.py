"""Bookings: a refused interactive request's place, held for its retry.

A refusal says when to come back (retry-after). Under sustained overload that time is only
honest if nobody takes the place in between: every new arrival would otherwise be admitted
into the room the refused request was told would be free, and its retry refused again. So
a refusal books its retry: until the booking is claimed or lapses, admission projects it
ahead of every request that arrives after it (a phantom of the same size), and the retry
that matches it (same tenant, prompt and max_tokens, arriving within the window) is
projected behind only the bookings made before its own: refused requests come back in
the order they were refused, each told a later time than the one before. Room a booking
will not need yet is not kept idle: an arrival that fits before the booked times, late for
none of them (projected in due order, each from its time), is admitted; and a booking whose
time has passed (by ``keep_s``) without its retry keeps no room (it can still be claimed
until it lapses).

    refused at t, told r ─▶ booked for t + r ─▶ claimed by a retry in [t + r - early,
                                                 t + r + late], or dropped after
                            (early: at most half of r; r over the horizon: not booked)
"""

from __future__ import annotations

from dataclasses import dataclass

from quanta_core.scheduler.choice import Choice


@dataclass(frozen=True, slots=True)
class Booking:
    tenant: str
    prompt: int  # the prompt's hash: a retry sends the same one
    prompt_len: int
    max_tokens: int
    at: float  # when the retry is expected
    made: float  # when the refusal was made
    seq: int  # the order refusals were made in


class Bookings:
    def __init__(self, early_s: float = 0.5, late_s: float = 2.0, horizon_s: float = 60.0) -> None:
        self.early_s = early_s
        self.late_s = late_s
        # A retry told to come back later than this is not booked: clients wait at most
        # about that long (the OpenAI SDK honours a retry-after of up to 60 s), and under
        # sustained overload each booking pushes the next refusal's time further out. Any
        # shorter, and the times told under a 2x overload outrun it within a minute: those
        # retries come back unbooked, into room others took (bench/results/scenarios/).
        self.horizon_s = horizon_s
        # A booking keeps its room until this long after its time: a retry sent at its
        # retry-after arrives a little after it (the client's sleep, its connection).
        self.keep_s = early_s
        self._held: list[Booking] = []
        self._seq = 0

    def __len__(self) -> int:
        return len(self._held)

    def book(self, x: Choice, at: float) -> None:
        if at - x.arrival > self.horizon_s:
            return
        self._seq += 1
        self._held.append(
            Booking(x.tenant, _prompt(x), x.prompt_len, x.max_tokens, at, x.arrival, self._seq)
        )

    def claim(self, x: Choice) -> Booking | None:
        """The earliest booking ``x`` is the retry of, removed; None if it is new."""
        self._expire(x.arrival)
        key = (x.tenant, _prompt(x), x.max_tokens)
        # One pass, not a sort: under a flood this runs on hundreds of bookings per request.
        found: Booking | None = None
        for b in self._held:
            if (b.tenant, b.prompt, b.max_tokens) != key:
                continue
            early = min(self.early_s, (b.at - b.made) / 2)
            if b.at - early <= x.arrival and (found is None or b.at < found.at):
                found = b
        if found is not None:
            self._held.remove(found)
        return found

    def ahead_of(self, own: Booking | None, now: float) -> list[Booking]:
        """The bookings to project ahead of a request: those made before its own (a retry),
        or all of them (a new arrival: each was refused before it came)."""
        self._expire(now)
        if own is None:
            return list(self._held)
        return [b for b in self._held if b.seq < own.seq]

    def _expire(self, now: float) -> None:
        self._held = [b for b in self._held if now <= b.at + self.late_s]


def _prompt(x: Choice) -> int:
    return hash(tuple(x.tokens[: x.prompt_len]))
