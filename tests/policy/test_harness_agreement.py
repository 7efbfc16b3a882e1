"""The harness cases (tests/fixtures/harnesses): each preset gives the verdict of the harness it implements,
except where a case documents a deliberate difference, and no honest case is rejected under any preset.
Runs scripts/harness_agreement.py's own functions on the real evaluator: the quick CPU cases in CI, the
compiling ones with `-m slow`, every case on a GPU with `-m gpu`."""

from __future__ import annotations

import json

import pytest

from tests.helpers.scripts import load_script

agreement = load_script("harness_agreement")
CASES = agreement.load_cases()


def check(judgements) -> None:
    summary = agreement.summarize(judgements)
    assert not summary["not_as_intended"], summary["not_as_intended"]
    assert not summary["honest_rejected"], summary["honest_rejected"]


def test_every_harness_has_cases_and_every_honest_case_is_checked_under_several_presets():
    by_harness = {h: [c for c in CASES if c.harness == h] for h in agreement.HARNESS_PRESET}
    assert all(len(cases) >= 2 for cases in by_harness.values()), {h: len(c) for h, c in by_harness.items()}
    honest = [c for c in CASES if c.expect[c.preset] == "accept" and not c.deliberate]
    assert len(honest) >= 10 and all(len(c.expect) >= 2 for c in honest)


def test_a_bad_manifest_gets_a_clear_error(tmp_path):
    (tmp_path / "m.yaml").write_text(
        "cases:\n  - {id: x, harness: KernelBench, file: nope.py, ref: nope.py, needs: gpu, "
        "expect: {kernelbench: maybe, strictest: reject}}\n")
    with pytest.raises(ValueError) as err:
        agreement.load_cases(tmp_path / "m.yaml")
    text = str(err.value)
    for part in ("unknown preset 'strictest'", "expected 'maybe'", "missing", "needs 'gpu'"):
        assert part in text, text


def test_quick_cpu_cases_are_judged_as_their_harness_judges_them():
    check(agreement.run_cases([c for c in CASES if c.needs == "cpu" and not c.slow], "cpu"))


@pytest.mark.slow
def test_compiling_cpu_cases_are_judged_as_their_harness_judges_them():
    check(agreement.run_cases([c for c in CASES if c.needs == "cpu" and c.slow], "cpu"))


@pytest.mark.gpu
@pytest.mark.timeout(1500)
def test_every_case_on_the_gpu_is_judged_as_its_harness_judges_it(tmp_path, capsys):
    assert agreement.main([str(tmp_path), "--device", "cuda"]) == 0
    print(capsys.readouterr().out)
    summary = json.loads((tmp_path / "agreement.json").read_text())["summary"]
    assert not summary["not_as_intended"] and not summary["honest_rejected"], summary
