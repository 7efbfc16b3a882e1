"""`scripts/bench_trusted_time.py`: where each bracket's time went, from an evaluation's recorded samples."""

from __future__ import annotations

import pytest

from tests.helpers.scripts import load_script


def _row(ms: float, bracket: float, model: float, stage: float | None) -> list:
    return [ms, ms, bracket, model, 150.0, None, None, "ref", stage, 260.0, 180.0]


def test_the_bracket_splits_into_staging_the_runners_part_and_the_end_probe_per_phase():
    bench = load_script("bench_trusted_time")
    timed = [[_row(0.04, 0.80, 0.39, 0.27), _row(0.04, 0.82, 0.41, 0.27), _row(0.05, 0.84, 0.41, 0.28)]]
    calibration = [[_row(0.04, 0.78, 0.36, 0.27)] * 3]
    parts = bench.bracket_parts({"ref": timed, "cand": timed, "calibration": {"ref": calibration, "cand": calibration}})
    assert set(parts) == {"calibration.ref", "calibration.cand", "timed.ref", "timed.cand"}
    timed_ref = parts["timed.ref"]
    assert timed_ref["reported"]["median_us"] == pytest.approx(40.0)
    assert timed_ref["staging"]["median_us"] == pytest.approx(270.0)
    assert timed_ref["runner"]["median_us"] == pytest.approx(360.0)  # go to done less the report: 350, 370, 360
    assert timed_ref["end"]["median_us"] == pytest.approx(140.0)  # bracket - staging - go to done: 140, 140, 150
    assert parts["calibration.cand"]["runner"] == {"median_us": pytest.approx(320.0), "iqr_us": 0.0}


def test_samples_recorded_before_the_staging_time_are_left_out():
    bench = load_script("bench_trusted_time")
    old = [[_row(0.04, 0.80, 0.39, None)]]
    assert bench.bracket_parts({"ref": old, "cand": old}) == {}


def test_each_honest_twin_is_printed_beside_its_calibration_null_and_whether_its_interval_holds_one(capsys):
    bench = load_script("bench_trusted_time")
    twin = {"case": "honest", "speedup": 0.836, "speedup_ci": [0.788, 0.884], "counted_ms": 0.010944,
            "calibration": {"clock": "gpu", "null": 0.97, "null_ci": [0.95, 0.99]},
            "clock": {"c_us": 294.1, "cand_c_us": 294.4}}
    forged = {"case": "forged 50 %", "speedup": 2.0}
    bench.print_twins({"sizes": {"20us": {"rows": [twin, forged]}}})
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and "forged" not in lines[1]
    cells = lines[1].split()
    assert cells[:5] == ["20us", "0.836", "[0.788,", "0.884]", "False"], cells
    assert "0.970" in lines[1] and "9.1," in lines[1] and "294.4" in lines[1]  # ref 0.836 x 10.944 us
