"""The cost model's KV-layout terms: micro-batches, n_kv and the stream features, counted
from hand-built plans (exact expectations), and the simulated engine pricing by them."""

from __future__ import annotations

import json
from pathlib import Path

import msgspec
import pytest

from quanta_core.engine.fake import FakeExecutor
from quanta_core.engine.types import SeqSlice, StepPlan
from quanta_core.sim.cost_model import (
    UNIFIED,
    CostModel,
    KvLayout,
    StepFeatures,
    features_of,
    micro_batches,
    stream_terms,
)
from quanta_core.sim.executor import SimExecutor

STREAMS = KvLayout(unified=False, stream_cells=4096, n_ubatch=512)


def _decode(seq: int, pos: int) -> SeqSlice:
    return SeqSlice(seq, (7,), pos, sample=True, owner=f"o{seq}")


# ---- how llama.cpp splits a step with a stream per sequence ----


def test_a_run_of_consecutive_ids_is_one_micro_batch() -> None:
    assert micro_batches([(0, 1), (1, 1), (2, 1)], 512) == [[(0, 1), (1, 1), (2, 1)]]


def test_each_break_in_the_ids_or_their_order_is_one_more_micro_batch() -> None:
    assert micro_batches([(0, 1), (2, 1), (4, 1)], 512) == [[(0, 1)], [(2, 1)], [(4, 1)]]
    assert micro_batches([(2, 1), (1, 1), (0, 1)], 512) == [[(2, 1)], [(1, 1)], [(0, 1)]]
    # 3 then 4 (3 + 1) join, 1 waits for the next micro-batch
    assert micro_batches([(3, 1), (1, 1), (4, 1)], 512) == [[(3, 1), (4, 1)], [(1, 1)]]


def test_a_mixed_step_takes_a_token_of_each_then_the_rest_of_the_chunk() -> None:
    got = micro_batches([(0, 1), (1, 1), (2, 120)], 512)
    assert got == [[(0, 1), (1, 1), (2, 1)], [(2, 119)]]


def test_equal_shares_stop_at_n_ubatch() -> None:
    # two prompts of 300: 256 each fill 512, then the 44 left of each
    assert micro_batches([(0, 300), (1, 300)], 512) == [[(0, 256), (1, 256)], [(0, 44), (1, 44)]]
    assert micro_batches([(5, 1000)], 512) == [[(5, 512)], [(5, 488)]]


def test_n_kv_is_padded_to_256_floored_at_256_and_capped_at_the_stream() -> None:
    assert [STREAMS.n_kv(n) for n in (1, 256, 257, 1001, 4000)] == [256, 256, 512, 1024, 4096]
    assert KvLayout(False, 1000, 512).n_kv(999) == 1000


# ---- the features of a step ----


def test_streams_a_decode_spans_the_longest_of_its_streams_and_no_other_cells() -> None:
    plan = StepPlan(slices=(_decode(0, 100), _decode(1, 300), _decode(2, 600)))
    lengths = {0: 100, 1: 300, 2: 600, 7: 3000}  # seq 7 holds 3,000 cells outside the step
    f = features_of(plan, lengths, {}, STREAMS)
    # one micro-batch; its longest stream holds 601 once it is in: n_kv 768
    assert f.stream_read_k == pytest.approx(3 * 768 / 1000)
    assert f.stream_kv_m == pytest.approx(3 * 768 / 1e6)
    assert f.extra_passes == 0
    assert (f.batch_kv_m, f.idle_k, f.batch_idle_m) == (0.0, 0.0, 0.0)
    assert f.attended_k == pytest.approx((101 + 301 + 601) / 1000)
    assert f.kv_held_k == pytest.approx(1003 / 1000)


def test_streams_a_mixed_step_is_two_passes_each_with_its_own_span() -> None:
    chunk = SeqSlice(2, (7,) * 120, 0)
    plan = StepPlan(slices=(_decode(0, 1000), _decode(1, 1000), chunk))
    f = features_of(plan, {0: 1000, 1: 1000}, {}, STREAMS)
    # [0, 1, 2] x 1 token over n_kv 1024 (seq 0 at 1,001), then seq 2's 119 over 256
    assert f.stream_read_k == pytest.approx((3 * 1024 + 256) / 1000)
    assert f.stream_kv_m == pytest.approx((3 * 1024 + 119 * 256) / 1e6)
    assert f.extra_passes == 1
    assert stream_terms([(0, 1000, 1), (1, 1000, 1), (2, 0, 120)], STREAMS) == (
        f.stream_read_k,
        f.stream_kv_m,
        1,
    )


def test_streams_a_decode_of_scattered_ids_pays_a_pass_each() -> None:
    plan = StepPlan(slices=(_decode(0, 10), _decode(2, 10), _decode(4, 10)))
    f = features_of(plan, {0: 10, 2: 10, 4: 10}, {}, STREAMS)
    assert f.extra_passes == 2
    assert f.stream_read_k == pytest.approx(3 * 256 / 1000)


def test_one_buffer_keeps_its_terms_and_counts_a_pass_per_n_ubatch_tokens() -> None:
    plan = StepPlan(slices=(_decode(0, 100), SeqSlice(1, (7,) * 600, 0)))
    lengths = {0: 100, 5: 50}
    f = features_of(plan, lengths, {}, KvLayout(True, 0, 512))
    assert f == features_of(plan, lengths, {}, KvLayout(True, 0, 512))
    assert (f.stream_read_k, f.stream_kv_m, f.extra_passes) == (0.0, 0.0, 1)
    assert f.batch_kv_m == pytest.approx(601 * 701 / 1e6)  # batch tokens x the batch's cells
    assert f.idle_k == pytest.approx(0.05)
    assert features_of(plan, lengths, {}) == f._replace(extra_passes=1)  # the default: 512


def test_predict_adds_the_stream_terms() -> None:
    model = CostModel(per_pass=0.01, per_stream_read=0.002, per_stream_kv=0.5, per_extra_pass=0.004)
    f = StepFeatures(2, 2, 0, stream_read_k=3.0, stream_kv_m=0.2, extra_passes=2)
    assert model.predict(f) == pytest.approx(0.01 + 0.006 + 0.1 + 0.008)


def test_a_file_fitted_before_the_stream_terms_loads_them_as_zero_and_prices_as_before(
    tmp_path: Path,
) -> None:
    coefficients = {"per_pass": 0.006, "per_decode": 0.005, "per_batch_kv": 0.7}
    path = tmp_path / "old.json"
    path.write_text(
        json.dumps({"schema": "quanta.cost_model/2", "coefficients": coefficients, "meta": {}})
    )
    model = CostModel.load(path)
    assert (model.per_stream_read, model.per_stream_kv, model.per_extra_pass) == (0, 0, 0)
    plan = StepPlan(slices=(_decode(0, 99), _decode(1, 99)))
    f = features_of(plan, {0: 99, 1: 99}, {})
    assert model.predict(f) == pytest.approx(0.006 + 2 * 0.005 + 0.7 * 2 * 200 / 1e6)


def test_the_committed_cost_models_load() -> None:
    for path in sorted(Path("config/cost_models").glob("*.json")):
        model = CostModel.load(path)
        assert model.predict(StepFeatures(1, 1, 0, 0.1, 0.0001, 0.1)) > 0, path


# ---- the simulated engine prices by its layout ----


def _streams_sim(model: CostModel) -> SimExecutor:
    info = msgspec.structs.replace(
        FakeExecutor(n_ctx=8 * 2048, n_seq_max=8, n_batch=512).info, kv_unified=False
    )
    return SimExecutor(info, model)


MODEL = CostModel(
    per_pass=0.01,
    per_decode=0.002,
    per_prefill=0.001,
    per_attended=0.0001,
    per_kv_held=0.003,
    per_stream_read=0.004,
    per_stream_kv=0.3,
    per_extra_pass=0.005,
    meta={"kv_unified": False, "n_ubatch": 512},
)


def test_the_simulated_engine_prices_a_stream_per_sequence() -> None:
    ex = _streams_sim(MODEL)
    assert ex.layout == KvLayout(False, 2048, 512)
    ex.step(StepPlan(slices=(SeqSlice(0, (7,) * 300, 0), SeqSlice(1, (7,) * 40, 0))))
    plan = StepPlan(slices=(_decode(0, 300), _decode(1, 40)))
    want = MODEL.predict(features_of(plan, {0: 300, 1: 40}, {}, ex.layout))
    assert ex.step(plan).timings.total_s == pytest.approx(want)
    # two decodes over n_kv 512 (seq 0 at 301), one pass
    assert want == pytest.approx(
        0.01 + 2 * 0.002 + 0.0001 * 0.342 + 0.003 * 0.342 + 0.004 * 1.024 + 0.3 * 1024 / 1e6
    )


@pytest.mark.parametrize("chunk", [1, 64])
def test_a_bulk_decode_run_prices_each_step_as_the_step_would(chunk: int) -> None:
    bulk, one = _streams_sim(MODEL), _streams_sim(MODEL)
    seqs = [0, 1, 3]  # a gap: two micro-batches a step
    prompt = StepPlan(
        slices=(SeqSlice(0, (7,) * 250, 0), SeqSlice(1, (7,) * 200, 0), SeqSlice(3, (7,), 0))
    )
    for ex in (bulk, one):
        ex.step(prompt)
    priced = bulk.decode_seconds(seqs, chunk)
    lengths = {0: 250, 1: 200, 3: 1}
    for _ in range(10):  # across seq 0's 256-cell boundary
        slices = [_decode(0, lengths[0]), _decode(1, lengths[1])]
        last = SeqSlice(3, (7,) * chunk, lengths[3]) if chunk > 1 else _decode(3, lengths[3])
        step = one.step(StepPlan(slices=(*slices, last)))
        assert next(priced) == pytest.approx(step.timings.total_s)
        lengths = {0: lengths[0] + 1, 1: lengths[1] + 1, 3: lengths[3] + chunk}


def test_a_unified_model_prices_as_before() -> None:
    model = CostModel(per_pass=0.01, per_decode=0.002, per_batch_kv=0.5)
    ex = SimExecutor(FakeExecutor().info, model)
    assert ex.layout.unified and ex.layout == UNIFIED
