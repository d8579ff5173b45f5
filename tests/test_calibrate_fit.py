"""The cost model's features, its file, and fitting it: synthetic data, no engine."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest

from quanta_core.engine.types import Restore, SeqSlice, Stash, StepPlan, Truncate
from quanta_core.sim.cost_model import SCHEMA, CostModel, StepFeatures, features_of
from quanta_core.sim.fit import (
    Group,
    Sample,
    fit_cost_model,
    fit_errors,
    fit_points,
    fit_samples,
    group_of,
    identifiable,
    load_samples,
    nnls,
    save_samples,
)

TRUE = CostModel(  # shaped like a refit of an earlier calibration's samples
    per_pass=0.008,
    per_batched_pass=0.0095,
    per_decode=0.011,
    per_prefill=0.006,
    per_attended=0.00002,
    per_batch_kv=2.5,
    per_kv_held=0.017,
    per_stash=0.0001,
    per_restore=0.00008,
    per_idle_kv=0.001,
    per_batch_idle=0.2,
)


def grid_features(with_stash: bool = True) -> list[StepFeatures]:
    """Shaped like the calibration grid: decode, prefill, mixed, multi-sequence fills, stash."""

    def step(seqs: int, dec: int, pre: int, attended: float, held: int) -> StepFeatures:
        batch = dec + pre
        return StepFeatures(seqs, dec, pre, attended / 1000, batch * held / 1e6, held / 1000)

    out = []
    for c in (64, 256, 1024, 2048):
        out += [step(b, b, 0, b * (c + 1), b * (c + 1)) for b in (1, 2, 4, 8, 16, 32, 64)]
        out += [step(1, 0, n, n * c + n * (n + 1) // 2, c + n) for n in (16, 64, 256)]
        out += [
            step(b + 1, b, 128 - b, b * (c + 1) + (128 - b) * (129 - b) // 2, b * (c + 1) + 128 - b)
            for b in (2, 8, 32)
        ]
        if with_stash:
            out += [StepFeatures(stash_tokens=c), StepFeatures(restore_tokens=c)]
    out += [step(k, 0, 512, k * (512 // k) * (512 // k + 1) // 2, 512) for k in (2, 8)]
    out += [  # decodes at 64 beside a prefix cache's idle cells
        step(b, b, 0, b * 65, b * 65)._replace(idle_k=i / 1000, batch_idle_m=b * i / 1e6)
        for i in (512, 2048)
        for b in (1, 4, 16)
    ]
    return out


def points(model: CostModel, features: list[StepFeatures], noise: float = 0.0):
    rng = random.Random(7)
    return [(f, model.predict(f) * (1 + rng.gauss(0, noise))) for f in features]


def assert_close(got: CostModel, want: CostModel, rel: float, names: tuple[str, ...]) -> None:
    for name in names:
        assert getattr(got, name) == pytest.approx(getattr(want, name), rel=rel), name


# ---- (b) features counted from hand-built plans ----


def test_features_of_a_decode_batch() -> None:
    plan = StepPlan(slices=(SeqSlice(0, (5,), 10, True), SeqSlice(1, (6,), 3, True)))
    f = features_of(plan, {0: 10, 1: 3}, {})
    # a token at position p attends p + 1 positions: 11 + 4; 2 batch tokens x 15 cells held
    assert f == StepFeatures(
        seqs=2,
        decode_tokens=2,
        prefill_tokens=0,
        attended_k=0.015,
        batch_kv_m=30e-6,
        kv_held_k=0.015,
    )
    assert group_of(f) is Group.DECODE


def test_features_of_count_the_cells_of_sequences_outside_the_batch_as_idle() -> None:
    plan = StepPlan(slices=(SeqSlice(0, (5,), 10, True), SeqSlice(1, (6,), 3, True)))
    f = features_of(plan, {0: 10, 1: 3, 5: 40, 7: 8}, {})  # 5 and 7: cache holders
    assert f == features_of(plan, {0: 10, 1: 3}, {})._replace(idle_k=0.048, batch_idle_m=96e-6)
    # a step that runs no token attends nothing: its stash costs what it costs
    stash = features_of(StepPlan(kv_ops=(Stash(5, "k"),)), {0: 10, 5: 40}, {})
    assert (stash.idle_k, stash.batch_idle_m, stash.stash_tokens) == (0.0, 0.0, 40)


def test_features_of_a_prefill_chunk_counts_attention_inside_the_chunk() -> None:
    plan = StepPlan(slices=(SeqSlice(2, (1, 2, 3, 4), 100),))
    f = features_of(plan, {2: 100}, {})
    # 4 tokens at 100..103 attend 101 + 102 + 103 + 104 = 4 * 100 + 4 * 5 / 2;
    # 4 batch tokens x 104 cells held
    assert f == StepFeatures(
        seqs=1,
        decode_tokens=0,
        prefill_tokens=4,
        attended_k=0.41,
        batch_kv_m=416e-6,
        kv_held_k=0.104,
    )
    assert group_of(f) is Group.PREFILL


def test_a_prompts_last_chunk_prices_its_sampled_token_as_a_decode_token() -> None:
    chunks = (SeqSlice(0, (1, 2, 3), 0, sample=True, owner="a"), SeqSlice(1, (4, 5), 0))
    f = features_of(StepPlan(slices=chunks), {}, {})
    assert (f.decode_tokens, f.prefill_tokens, f.sampled_chunks) == (0, 5, 1)
    assert group_of(f) is Group.PREFILL  # still a prefill step: no slice is a decode
    model = CostModel(per_pass=0.01, per_batched_pass=0.001, per_decode=0.002, per_prefill=0.003)
    assert model.predict(f) == pytest.approx(0.01 + 0.001 + 0.002 + 4 * 0.003)
    # the fit sees it the same way: one decode token, four prefill tokens
    assert f.as_row()[2:4] == (1.0, 4.0)


def test_features_of_a_mixed_batch() -> None:
    plan = StepPlan(slices=(SeqSlice(0, (9,), 7), SeqSlice(1, (1, 2, 3), 0)))
    f = features_of(plan, {0: 7}, {})
    assert (f.seqs, f.decode_tokens, f.prefill_tokens) == (2, 1, 3)
    assert f.attended_k == pytest.approx((8 + 6) / 1000)
    assert f.batch_kv_m == pytest.approx(4 * (7 + 4) / 1e6)
    assert f.kv_held_k == pytest.approx(11 / 1000)
    assert group_of(f) is Group.MIXED


def test_features_of_stash_and_restore_use_the_lengths_before_the_plan() -> None:
    plan = StepPlan(kv_ops=(Stash(0, "a"), Restore(1, "b"), Truncate(2)))
    f = features_of(plan, {0: 300, 2: 50}, {"b": 120})
    assert f == StepFeatures(stash_tokens=300, restore_tokens=120)
    assert group_of(f) is Group.STASH
    assert group_of(features_of(StepPlan(), {}, {})) is Group.EMPTY


def test_the_pass_terms_are_charged_by_the_steps_token_count() -> None:
    model = CostModel(
        per_pass=0.008, per_batched_pass=0.01, per_decode=0.003, per_prefill=0.004, per_stash=1e-4
    )
    cases = [
        (StepFeatures(), 0.0, (0, 0)),
        (StepFeatures(stash_tokens=100), 0.01, (0, 0)),  # no forward pass
        (StepFeatures(1, 1), 0.008 + 0.003, (1, 0)),  # one token: the vector path
        (StepFeatures(2, 2), 0.008 + 0.01 + 0.006, (1, 1)),  # two: the matrix path
        (StepFeatures(1, 0, 16), 0.008 + 0.01 + 0.064, (1, 1)),  # a chunk is batched too
        (StepFeatures(1, 1, stash_tokens=100), 0.01 + 0.011, (1, 0)),
    ]
    for f, seconds, indicators in cases:
        assert model.predict(f) == pytest.approx(seconds), f
        assert f.as_row()[:2] == indicators, f


def test_scaled_multiplies_every_prediction_and_records_the_factor() -> None:
    slower = TRUE.scaled(1.25)
    for f in grid_features():
        assert slower.predict(f) == pytest.approx(1.25 * TRUE.predict(f))
    assert slower.meta["speed_factor"] == 1.25
    assert TRUE.scaled(2.0).scaled(0.5).meta["speed_factor"] == 1.0
    for bad in (0.0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="above 0"):
            TRUE.scaled(bad)


# ---- (c) the cost model file ----


def test_cost_model_json_round_trip(tmp_path: Path) -> None:
    model = CostModel(*(k / 1000 for k in range(1, 15)), meta={"machine": "m"})
    assert tuple(model.coefficients().values()) == tuple(k / 1000 for k in range(1, 15))
    path = tmp_path / "sub" / "m.json"
    model.save(path)
    assert CostModel.load(path) == model
    assert CostModel.from_json(json.loads(path.read_text())) == model


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "cannot read cost model"),
        ('{"schema": "other/1"}', "not a cost model file"),
        (json.dumps({"schema": SCHEMA}), "no 'coefficients'"),
        (json.dumps({"schema": SCHEMA, "coefficients": {"per_x": 1}}), "unknown cost model"),
        ("[1, 2]", "not a JSON object"),
        (
            json.dumps({"schema": "quanta.cost_model/1", "coefficients": {"intercept": 0.01}}),
            "predates the per-pass and batched-pass terms.*--refit",
        ),
    ],
)
def test_cost_model_bad_file_says_what_is_wrong(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(ValueError, match=message):
        CostModel.load(path)


def test_a_file_fitted_before_the_idle_terms_loads_them_as_zero() -> None:
    doc = TRUE.to_json()
    del doc["coefficients"]["per_idle_kv"], doc["coefficients"]["per_batch_idle"]
    old = CostModel.from_json(doc)
    assert (old.per_idle_kv, old.per_batch_idle) == (0.0, 0.0)
    assert old.per_batch_kv == TRUE.per_batch_kv


def test_missing_cost_model_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="cannot read cost model"):
        CostModel.load(tmp_path / "absent.json")


# ---- (a) the fit ----


def test_nnls_matches_least_squares_when_unconstrained_and_clips_at_zero() -> None:
    rng = np.random.default_rng(0)
    a = rng.uniform(0.5, 2.0, size=(30, 3))
    x = np.array([1.0, 2.0, 3.0])
    assert nnls(a, a @ x) == pytest.approx(x)
    # the best unconstrained fit wants a negative second coefficient: NNLS holds it at 0
    b = a @ np.array([1.0, -2.0, 3.0])
    got = nnls(a, b)
    assert got[1] == 0.0
    assert (got >= 0).all()
    free = np.linalg.lstsq(a[:, [0, 2]], b, rcond=None)[0]
    assert got[[0, 2]] == pytest.approx(free)


def test_fit_recovers_known_coefficients_exactly_without_noise() -> None:
    model = fit_cost_model(points(TRUE, grid_features()))
    assert_close(model, TRUE, 1e-6, tuple(TRUE.coefficients()))
    errors = model.meta["fit"]["errors"]
    assert errors["all"]["max"] < 1e-6
    assert set(errors) == {"all", "decode", "prefill", "mixed", "stash"}


def test_fit_recovers_the_large_coefficients_under_noise() -> None:
    model = fit_cost_model(points(TRUE, grid_features(), noise=0.03))
    assert_close(model, TRUE, 0.05, ("per_decode", "per_prefill", "per_stash", "per_restore"))
    # The fixed costs are a few ms beside steps of up to seconds: less exact, still there.
    assert_close(model, TRUE, 0.2, ("per_pass", "per_batched_pass"))
    assert model.meta["fit"]["errors"]["all"]["mape"] < 10


def test_fit_recovers_the_fixed_costs_of_one_token_and_batched_passes_under_noise() -> None:
    # The measured shape (context 64): 1 sequence 10 ms, 2 sequences 30 ms, 4 sequences 31 ms.
    # One intercept cannot give both ends; a pass term and a batched-pass term can.
    truth = CostModel(
        per_pass=0.008, per_batched_pass=0.0095, per_decode=0.003, per_kv_held=0.01, per_stash=7e-5
    )
    features = [
        StepFeatures(b, b, 0, b * (c + 1) / 1000, b * b * (c + 1) / 1e6, b * (c + 1) / 1000)
        for c in (64, 256, 1024)
        for b in (1, 2, 4, 8, 16)
    ]
    features += [StepFeatures(stash_tokens=c) for c in (64, 256)]
    model = fit_cost_model(points(truth, features, noise=0.02))
    assert_close(model, truth, 0.15, ("per_pass", "per_batched_pass", "per_decode"))
    one = StepFeatures(1, 1, 0, 0.065, 65e-6, 0.065)
    assert model.predict(one) == pytest.approx(truth.predict(one), rel=0.05)


def test_a_never_exercised_feature_gets_zero() -> None:
    model = fit_cost_model(points(TRUE, grid_features(with_stash=False), noise=0.01))
    assert model.per_stash == 0.0
    assert model.per_restore == 0.0
    assert model.meta["fit"]["unexercised"] == [
        "per_stash",
        "per_restore",
        "per_stream_read",
        "per_stream_kv",
        "per_extra_pass",
    ]
    assert "stash" not in model.meta["fit"]["errors"]
    assert_close(model, TRUE, 0.05, ("per_decode", "per_prefill"))


def test_a_feature_that_only_duplicates_another_gets_zero() -> None:
    # Decode-only batches at one context: attended pairs are proportional to decode tokens,
    # so their split cannot be known. The whole per-token cost goes to per_decode;
    # per_attended is 0 rather than an arbitrary share.
    features = [StepFeatures(b, b, 0, b * 0.1, b * b * 100 / 1e6) for b in (1, 2, 4, 8, 16)]
    model = fit_cost_model(points(TRUE, features))
    assert model.per_attended == 0.0
    per_token = TRUE.per_decode + 0.1 * TRUE.per_attended
    assert model.per_decode == pytest.approx(per_token)
    assert model.per_batch_kv == pytest.approx(TRUE.per_batch_kv)
    assert model.per_pass == pytest.approx(TRUE.per_pass)
    assert model.per_batched_pass == pytest.approx(TRUE.per_batched_pass)
    design = identifiable(np.array([f.as_row() for f in features]))
    assert design.unidentified == ("per_attended",)
    assert model.meta["fit"]["unidentified"] == ["per_attended"]


def test_fit_refuses_no_points_and_non_positive_times() -> None:
    with pytest.raises(ValueError, match="no samples"):
        fit_cost_model([])
    with pytest.raises(ValueError, match="above 0"):
        fit_cost_model([(StepFeatures(1, 1), 0.0)])


# ---- samples: repeats, warm-ups, the file ----


def test_fit_points_drop_warmups_and_take_each_points_median() -> None:
    f = StepFeatures(1, 1, 0, 0.1)
    g = StepFeatures(stash_tokens=10)
    samples = [
        Sample("d", f, 9.0, warmup=True),
        Sample("d", f, 0.020),
        Sample("d", f, 0.018),
        Sample("d", f, 0.500),  # a disturbed run
        Sample("s", g, 0.001),
    ]
    assert fit_points(samples) == [(f, 0.020), (g, 0.001)]
    model = fit_samples(samples, meta={"machine": "m"})
    assert model.meta["machine"] == "m"
    assert model.meta["samples"] == 4
    assert model.meta["fit"]["points"] == 2


def served_bin(label: str, steps: list[StepFeatures], seconds: list[float]) -> list[Sample]:
    return [Sample(label, f, t, served=True) for f, t in zip(steps, seconds, strict=True)]


def test_fit_points_pool_each_bin_of_served_steps_into_its_mean() -> None:
    decodes = [StepFeatures(2, 2, 0, 0.3, 0.0006, 0.3), StepFeatures(2, 2, 0, 0.5, 0.001, 0.5)]
    prefill = [StepFeatures(1, 0, 64, 2.1, 0.004, 0.064)]
    grid = StepFeatures(1, 1, 0, 0.1)
    samples = [
        *served_bin("served fcfs decode ≤2", decodes, [0.030, 0.050]),
        Sample("d", grid, 0.010),
        *served_bin("served fcfs prefill ≤1", prefill, [0.300]),
        Sample("d", grid, 0.012),
    ]
    mean_decode = StepFeatures(2, 2, 0, 0.4, 0.0008, 0.4)
    got = fit_points(samples)
    assert [f for f, _ in got] == [grid, pytest.approx(mean_decode), prefill[0]]
    assert [t for _, t in got] == pytest.approx([0.011, 0.040, 0.300])
    # A linear model prices the mean step as the mean of its steps' prices: the bin's point
    # is fitted at the bin's mean time, tail and all.
    assert TRUE.predict(got[1][0]) == pytest.approx(sum(map(TRUE.predict, decodes)) / 2)


def test_the_fit_reports_the_served_bins_error_apart() -> None:
    grid = [Sample("p", f, t) for f, t in points(TRUE, grid_features())]
    rng = random.Random(3)
    steps = [StepFeatures(1, 1, 0, c / 1000, (c + 1) / 1e6, c / 1000) for c in range(60, 90)]
    slow = [1.3 * TRUE.predict(f) * (1 + rng.gauss(0, 0.01)) for f in steps]  # 30 % over
    served = served_bin("served fcfs decode ≤1", steps, slow)
    model = fit_samples([*grid, *served])
    alone = fit_samples(grid)
    assert alone.meta["fit"].get("served") is None
    missed = fit_errors(alone, fit_points(served))["all"].mape
    assert missed == pytest.approx(100 * (1 - 1 / 1.3), abs=1)  # the grid's model: 23 % low
    error = model.meta["fit"]["served"]
    assert error["n"] == 1
    assert error["mape"] < missed - 2  # one point among the grid's 63: moved towards it


def test_samples_file_round_trip(tmp_path: Path) -> None:
    samples = [
        Sample("d", StepFeatures(1, 1, 0, 0.1), 0.02, 0.019, False, 100),
        Sample("s", StepFeatures(stash_tokens=5), 0.001, 0.0005, True, 5),
        Sample("served fcfs decode ≤1", StepFeatures(1, 1, 0, 0.1), 0.02, t=3.0, served=True),
    ]
    path = tmp_path / "s.json"
    save_samples(path, samples, {"machine": "m"})
    assert load_samples(path) == (samples, {"machine": "m"})


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("[", "cannot read samples"),
        ('{"schema": "quanta.cost_model/1"}', "not a samples file"),
        ('{"schema": "quanta.cost_samples/1", "samples": [{"point": "x"}]}', "bad sample"),
    ],
)
def test_bad_samples_file_says_what_is_wrong(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "s.json"
    path.write_text(content)
    with pytest.raises(ValueError, match=message):
        load_samples(path)
