"""llama-batched-bench rows as cost-model points: the steps it runs, counted exactly."""

from __future__ import annotations

import pytest

from app.lab.calibrate.batched_bench import (
    BenchRow,
    decode_point,
    fit_terms,
    prefill_point,
)
from quanta_core.sim.cost_model import CostModel, KvLayout

STREAMS = KvLayout(False, 0, 256)
ONE_BUFFER = KvLayout(True, 0, 256)


def test_the_prefill_point_is_the_mean_of_the_benchs_batches() -> None:
    # 2 prompts of 300 in batches of 512: [seq 0's 300 + seq 1's first 212], [seq 1's 88]
    row = BenchRow(2, 300, 2, prefill_tok_s=600.0, decode_tok_s=20.0)
    f, seconds = prefill_point(row, STREAMS, n_batch=512)
    assert seconds == pytest.approx(600 / 600.0 / 2)
    assert f.prefill_tokens == pytest.approx(300)  # 512 and 88
    assert f.sampled_chunks == pytest.approx(1)  # each prompt's last token, one a batch
    # batch 1, in micro-batches of 256: 128 of each (n_kv 256), 84 of each (212 cells: 256),
    # seq 0's last 88 (300 cells: 512); batch 2: seq 1's last 88 (512). 2 extra passes, 0.
    assert f.extra_passes == pytest.approx(1.0)
    read_1 = 2 * 256 + 2 * 256 + 1 * 512
    read_2 = 1 * 512
    assert f.stream_read_k == pytest.approx((read_1 + read_2) / 2 / 1000)
    kv_1 = 256 * 256 + 168 * 256 + 88 * 512
    assert f.stream_kv_m == pytest.approx((kv_1 + 88 * 512) / 2 / 1e6)


def test_the_decode_point_is_its_steps_mean_and_its_time_the_rate_per_step() -> None:
    row = BenchRow(4, 255, 3, prefill_tok_s=1.0, decode_tok_s=40.0)
    f, seconds = decode_point(row, STREAMS)
    assert seconds == pytest.approx(4 / 40.0)
    assert f.decode_tokens == 4
    # positions 255, 256, 257: n_kv 256, 512, 512 for each of the 4
    assert f.stream_read_k == pytest.approx(4 * (256 + 512 + 512) / 3 / 1000)
    assert f.extra_passes == 0
    g, _ = decode_point(row, ONE_BUFFER)
    assert g.batch_kv_m == pytest.approx(4 * 4 * (256 + 257 + 258) / 3 / 1e6)
    assert g.stream_read_k == 0.0


def test_fit_terms_recovers_a_known_term_and_zeroes_the_other_layouts() -> None:
    truth = CostModel(per_pass=0.004, per_decode=0.0002, per_stream_read=0.00004)
    base = CostModel(per_pass=0.004, per_decode=0.0002, per_batch_kv=0.1, per_kv_held=0.5)
    points = []
    for n in (1, 16, 64):
        f, _ = decode_point(BenchRow(n, 2048, 8, 1.0, 1.0), STREAMS)
        points.append((f, truth.predict(f)))
    model = fit_terms(base, points, ("per_stream_read",))
    assert model.per_stream_read == pytest.approx(0.00004)
    assert model.per_batch_kv == model.per_kv_held == 0.0
    assert model.per_pass == 0.004
