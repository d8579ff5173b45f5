"""The results file's token times: rounded to the microsecond exactly as ``round`` does."""

from __future__ import annotations

import math
import random

from app.lab.bench.report import TIME_DECIMALS, rounded


def test_rounded_is_round_for_every_value() -> None:
    rng = random.Random(3)
    rows: list[list[float]] = [[]]
    for _ in range(300):
        base = rng.uniform(0, 200_000)
        rows.append([base + rng.random() * rng.choice((1e-3, 1.0, 100.0)) for _ in range(50)])
    halves = []  # the values round's half-to-even decides, and their neighbours
    for _ in range(3000):
        x = (rng.randrange(2 * 10**11) + 0.5) / 10**TIME_DECIMALS
        halves += [x, math.nextafter(x, 0.0), math.nextafter(x, math.inf)]
    rows.append(halves)
    rows.append([0.0, -0.0, -4e-7, 5e-7, 1.5e-6, 2.5e-6, 4.5e9, 3e15, 1e300, math.inf])
    got = rounded(rows, TIME_DECIMALS)
    want = [[round(t, TIME_DECIMALS) for t in row] for row in rows]
    assert [[t.hex() for t in row] for row in got] == [[t.hex() for t in row] for row in want]


def test_rounded_keeps_nan() -> None:
    (row,) = rounded([[math.nan, 1.2345678]], TIME_DECIMALS)
    assert math.isnan(row[0]) and row[1] == 1.234568
