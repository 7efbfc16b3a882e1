"""`scripts/compare_clocks.py`: one release sample under both clocks, side by side."""

from __future__ import annotations

import pytest

from tests.helpers.scripts import load_script


def test_the_table_sets_each_task_under_both_clocks_and_their_ratio(capsys):
    script = load_script("compare_clocks")
    out = {"host": {"wall_s": 79.4, "evaluated": 2, "candidates_per_hour": 90.7,
                    "rows": {"t/1": {"status": "correct", "speedup": 1.11},
                             "t/2": {"status": "hack_detected", "speedup": None}}},
           "gpu": {"wall_s": 73.5, "evaluated": 2, "candidates_per_hour": 98.0,
                   "rows": {"t/1": {"status": "correct", "speedup": 0.811, "ms_per_bracket": 2.5},
                            "t/2": {"status": "correct", "speedup": 1.037, "ms_per_bracket": 3.5}}}}
    script.table(out, ["host", "gpu"])
    lines = capsys.readouterr().out.splitlines()
    assert lines[1].split()[:6] == ["t/1", "correct", "1.110", "correct", "0.811", "0.731"]
    assert lines[2].split()[1] == "hack_detected" and lines[2].split()[-1] == "nan"
    assert "median 0.731" in lines[3] and "over 1 tasks" in lines[3]
    assert "one bracket" not in lines[4] and lines[5].endswith("one bracket 3.00 ms (median)")  # what it cost the host
    script.table(out, ["gpu", "host"])  # the ratio is GPU over host whichever ran first
    assert capsys.readouterr().out.splitlines()[1].split()[-1] == "0.731"


def test_a_bad_setting_is_one_line_before_any_evaluation(tmp_path, monkeypatch):
    script = load_script("compare_clocks")
    release = tmp_path / "r.jsonl"
    release.write_text("")
    monkeypatch.setattr("sys.argv", ["compare_clocks.py", str(tmp_path / "out"), "--release", str(release),
                                     "--set", "bogus=1"])
    with pytest.raises(SystemExit, match="bad --set 'bogus=1'"):
        script.main()
