"""`scripts/probe_twin_offset.py`: its arms patch today's code (a patch that no longer applies fails here, not on
the GPU), and its figures read the recorded calls as the evaluator writes them."""

from __future__ import annotations

import pytest

from tests.helpers.scripts import load_script


@pytest.mark.parametrize("arm", ["plain", "base", "no_evidence", "keep_cache", "expandable"])
def test_every_arm_patches_todays_code_and_still_compiles(tmp_path, arm):
    probe = load_script("probe_twin_offset")
    src = probe.scratch_copy(arm, tmp_path)
    evaluation = (src / "cudal1" / "eval" / "evaluation.py").read_text()
    assert ("calibration_after_import" in evaluation) is (arm != "plain")  # plain: today's code as it is
    for path in src.rglob("*.py"):
        compile(path.read_text(), str(path), "exec")


def test_the_figures_pay_both_models_the_references_constant_and_split_calls_by_what_ran_before():
    probe = load_script("probe_twin_offset")
    row = lambda ms, after: [ms, ms, 1.0, 0.5, None, None, None, after, None, None, None]  # noqa: E731
    result = {"status": "correct", "speedup": 0.9, "timing": {"speedup_ci": [0.89, 0.91]},
              "protocol": {"clock": {"c_us": 300.0, "cand_c_us": 299.0, "cand_c_paid_us": 299.0},
                           "calibration": {"null": 1.0, "after_import": {"null": 0.9}},
                           "samples": {"ref": [[row(0.009, ""), row(0.011, "cand")]],
                                       "cand": [[row(0.011, ""), row(0.011, "ref")]]}}}
    f = probe.figures({"arm": "base", "size": "20us", "result": result})
    assert f["null_before"] == 1.0 and f["null_after_import"] == 0.9
    # The candidate paid 1 us less constant than the reference: with the reference's, each call is 1 us shorter.
    assert f["speedup_c_ref_both"] == pytest.approx(0.010 / 0.010)
    assert f["ref_us_by_after"] == {"": 9.0, "cand": 11.0} and f["cand_us_by_after"] == {"": 11.0, "ref": 11.0}
    assert "0.900 [0.890, 0.910]" in probe.show(f)
