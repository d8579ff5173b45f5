"""quanta bench fidelity repeat: real runs of one workload against each other, on committed runs."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from app.lab.fidelity.repeat import compare_pair, main, runs_by_key

FIDELITY = Path("tests/data/fidelity-later")  # two runs of bench/results/fidelity, whole
EARLIER = Path("tests/data/fidelity-earlier")  # the same workload, run earlier that day


def two_sets(tmp_path: Path, key: str = "fcfs-medium") -> tuple[Path, Path]:
    a, b = tmp_path / "a", tmp_path / "b"
    for folder, source in ((a, EARLIER), (b, FIDELITY)):
        folder.mkdir()
        for kind in ("real", "probe"):
            shutil.copy(source / f"{kind}-{key}.json", folder)
    return a, b


def test_the_runs_of_a_workload_pair_up_oldest_first_whatever_the_folders_order(
    tmp_path: Path,
) -> None:
    a, b = two_sets(tmp_path)
    (b / "real-static-light.json").write_text((FIDELITY / "real-static-light.json").read_text())
    pairs = runs_by_key([b, a])
    assert list(pairs) == ["fcfs-medium"]  # static-light is in one folder only
    first, second = pairs["fcfs-medium"]
    assert first.path.parent == a and first.when < second.when
    row = compare_pair(first, second)
    ttft = row["figures"]["TTFT mean ms"]
    assert ttft["first"] == pytest.approx(625.4, abs=0.1)
    assert ttft["second"] == pytest.approx(559.2, abs=0.1)
    assert ttft["diff"] == pytest.approx(559.2 / 625.4 - 1, abs=1e-3)
    assert ttft["within"] is False  # -11 %: outside the 10 % target
    assert row["first"]["probe"] == pytest.approx(0.99, abs=0.01)


def test_runs_of_different_workloads_are_refused(tmp_path: Path) -> None:
    a, b = two_sets(tmp_path)
    path = b / "real-fcfs-medium.json"
    doc = json.loads(path.read_text())
    doc["config"]["workload"]["rate"] = 2.0
    path.write_text(json.dumps(doc))
    first, second = runs_by_key([a, b])["fcfs-medium"]
    with pytest.raises(ValueError, match="different workloads"):
        compare_pair(first, second)


def test_main_writes_the_table_and_the_count_into_the_first_folder(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    a, b = two_sets(tmp_path)
    main([a, b])
    doc = json.loads((a / "repeat.json").read_text())
    assert (doc["within"], doc["figures"]) == (1, 4)  # throughput only (see the table)
    text = (a / "repeat.md").read_text()
    assert "| fcfs | medium | 11:33 (0.99) → 13:19 (1.09) |" in text
    assert "1 of 4 figures within the target" in capsys.readouterr().out
