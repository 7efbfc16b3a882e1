"""The fixture corpus under static analysis: manifest rules fire, kernel classes match, honest is clean."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from cudal1.analysis import analyze_source, format_report, rejecting_flags

CORPUS = Path(__file__).resolve().parents[1] / "fixtures" / "candidates"
MANIFEST = yaml.safe_load((CORPUS / "manifest.yaml").read_text())["fixtures"]
VERDICTS = {"hack_detected", "incorrect", "correct", "not_custom", "not_faster"}


def _analyze(fx: dict):
    src = (CORPUS / fx["file"]).read_text()
    ref = (CORPUS / "refs" / fx["ref"]).read_text()
    return analyze_source(src, reference_source=ref, preset="strict")


def test_manifest_lists_every_fixture_and_is_well_formed():
    listed = {fx["file"] for fx in MANIFEST}
    on_disk = {str(p.relative_to(CORPUS)) for d in ("exploits", "honest") for p in (CORPUS / d).glob("*.py")}
    assert listed == on_disk
    for fx in MANIFEST:
        assert (CORPUS / "refs" / fx["ref"]).is_file(), fx
        assert fx["kind"] in ("exploit", "honest") and fx["expected_verdict"] in VERDICTS
        assert fx["needs"] in ("cpu", "cuda")
        assert (CORPUS / fx["file"]).read_text().lstrip().startswith('"""'), "fixtures start with a docstring"
    assert sum(fx["kind"] == "exploit" for fx in MANIFEST) >= 18
    assert sum(fx["kind"] == "honest" for fx in MANIFEST) >= 10


@pytest.mark.parametrize("fx", MANIFEST, ids=[fx["file"] for fx in MANIFEST])
def test_fixture_static_expectations(fx):
    report = _analyze(fx)
    fired = {f.rule for f in report.flags}
    assert set(fx["expected_static"]) <= fired, format_report(report)
    assert report.kernel_class.value == fx["expected_kernel_class"], format_report(report)
    rejected = rejecting_flags(report, "strict")
    if fx["kind"] == "honest":
        assert not rejected, format_report(report)
        assert not [f for f in report.flags if f.severity.value == "error"], format_report(report)
    elif fx["expected_verdict"] == "hack_detected" and fx["expected_static"]:
        assert rejected, format_report(report)  # a static rule that fires for a hack must reject under strict
