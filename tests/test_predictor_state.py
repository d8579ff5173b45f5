"""The server keeps the length predictor's state: where (a setting), loaded at start, saved at
stop, and an unreadable file set aside rather than a failed start."""

from __future__ import annotations

from pathlib import Path

from app.server.assemble import load_predictor, save_predictor
from app.server.settings import Settings
from quanta_core.predictor import LengthPredictor
from quanta_core.requests import GenerationRequest
from quanta_core.scheduler.choice import Choice


def test_the_state_lives_in_the_data_dir_unless_set(tmp_path: Path) -> None:
    assert Settings(data_dir=tmp_path).predictor_path() == tmp_path / "predictor.json"
    there = tmp_path / "elsewhere.json"
    assert Settings(data_dir=tmp_path, predictor_state=there).predictor_path() == there


def test_saved_at_stop_loaded_at_start(tmp_path: Path) -> None:
    path = tmp_path / "data" / "predictor.json"
    p = LengthPredictor()
    r = Choice.choices_of(GenerationRequest("r", (1, 2, 3), 50, tenant="t"), 0.0, 0)[0]
    for n in (5, 7, 9):
        p.observe(r, n)
    save_predictor(p, path)
    assert load_predictor(path).to_json() == p.to_json()


def test_an_unreadable_state_starts_empty(tmp_path: Path) -> None:
    path = tmp_path / "predictor.json"
    path.write_text("{not json")
    assert len(load_predictor(path)) == 0
    path.write_text('{"version": 99}')
    assert len(load_predictor(path)) == 0


def test_the_system_prompt_hash_keys_on_the_leading_system_messages() -> None:
    from app.openai.prompt_plan import system_prompt_hash

    a = [{"role": "system", "content": "Answer yes or no."}, {"role": "user", "content": "x"}]
    b = [{"role": "system", "content": "Answer yes or no."}, {"role": "user", "content": "y"}]
    c = [{"role": "system", "content": "Write an essay."}, {"role": "user", "content": "x"}]
    assert system_prompt_hash(a) == system_prompt_hash(b) != system_prompt_hash(c)
    assert system_prompt_hash([{"role": "user", "content": "x"}]) is None
