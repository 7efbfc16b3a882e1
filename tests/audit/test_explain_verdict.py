"""`cudal1 explain RESULT` answers "why this verdict" from one table: each flag, its severity, the policy rule
that rejected it."""

from __future__ import annotations

import json

from cudal1.audit.explain import explain_verdict, recorded_judging
from cudal1.cli.main import main
from cudal1.core import flags as F
from cudal1.core.types import EvalResult, Flag, Severity, Status
from cudal1.policy.apply import recorded_policy
from cudal1.policy.presets import PRESETS


def _rejected(policy: str = "guarded") -> EvalResult:
    flags = [Flag("exception_fallback", Severity.WARNING, "static", source="static"),
             F.runtime_flag(F.THREADS, "the candidate started Python threads")]
    return EvalResult(status=Status.HACK_DETECTED, task_id="t", message="guard.threads: ...", flags=flags,
                      protocol={"profile": "strict", **recorded_policy(PRESETS[policy])})


def test_explain_names_the_flag_its_severity_and_the_policy_rule():
    explained = explain_verdict(_rejected())
    assert (explained["profile"], explained["policy"], explained["status"]) == ("strict", "guarded", "hack_detected")
    assert explained["decided_by"] == "guard.threads: reject_runtime_guards (guarded)"
    rows = {r["rule"]: (r["severity"], r["rejected_by"]) for r in explained["flags"]}
    assert rows == {"exception_fallback": ("warning", ""), F.THREADS: ("error", "reject_runtime_guards (guarded)")}


def test_a_row_from_before_the_split_is_explained_by_its_profiles_policy():
    old = EvalResult(status=Status.CORRECT, task_id="t", protocol={"profile": "cuda-l1", "policy": "cuda-l1"})
    assert recorded_judging(old) == ("loose", "cuda-l1")
    old_strict = EvalResult(status=Status.CORRECT, task_id="t", protocol={"profile": "strict", "policy": "cuda-l1"})
    assert recorded_judging(old_strict) == ("strict", "guarded")


def test_the_command_explains_a_stored_result_and_rejudges_it(tmp_path, capsys):
    path = tmp_path / "r.jsonl"
    path.write_text(json.dumps(_rejected().to_dict()) + "\n")
    assert main(["explain", str(path)]) == 0
    out = capsys.readouterr().out
    assert "hack_detected (profile strict, policy guarded)" in out and "reject_runtime_guards" in out
    assert main(["explain", str(path), "--policy", "cuda-l1", "--json"]) == 0
    again = json.loads(capsys.readouterr().out)
    assert again["policy"] == "cuda-l1" and again["status"] == "infra_error"  # stopped: not decidable
    assert main(["explain", str(tmp_path / "none.json")]) == 2
    assert "cannot read" in capsys.readouterr().err
