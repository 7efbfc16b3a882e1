"""Every changed verdict between two audits of a release, with the protocol change that explains it."""

from __future__ import annotations

import json

from cudal1.audit.explain import PROTOCOL_CHANGES, explain_changes
from cudal1.cli.main import main


def _audit(label: str, rows: dict[str, tuple[str, list[str]]]) -> dict:
    return {"label": label, "meta": {"profile": "strict", "protocol": {"version": "3"}},
            "tasks": [{"task_id": t, "label": label, "status": s, "flags": f, "speedup": 1.0 if s == "correct" else None,
                       "survives": None} for t, (s, f) in rows.items()]}


EARLIER = _audit("audit:h100:strict", {
    "t1": ("compile_error", ["exception_fallback", "unbuildable_extension"]),
    "t2": ("hack_detected", ["algorithm_flags"]),
    "t3": ("correct", []), "t4": ("correct", []), "t5": ("correct", []),
    "t6": ("incorrect", []), "t7": ("correct", []), "t8": ("correct", ["exception_fallback"]),
})
NEW = _audit("audit:h100:strict", {
    "t1": ("correct", ["exception_fallback", "unbuildable_extension", "runtime.custom_build_failed"]),
    "t2": ("correct", ["algorithm_flags", "guard.algorithm_flags"]),
    "t3": ("hack_detected", ["guard.reduced_precision"]),
    "t4": ("incorrect", ["runtime.beyond_distribution"]),
    "t5": ("infra_error", ["reference_error"]),
    "t6": ("correct", []), "t7": ("compile_error", []), "t8": ("correct", ["exception_fallback"]),
})


def test_each_change_is_explained_by_the_change_whose_rules_it_shows():
    explained = explain_changes(EARLIER, NEW)
    by_task = {c["task_id"]: c for c in explained["changes"]}
    assert "t8" not in by_task  # unchanged
    assert by_task["t1"]["changes"] == [c.name for c in PROTOCOL_CHANGES if "own code catches" in c.name]
    assert by_task["t1"]["evidence"] == "+runtime.custom_build_failed"
    assert "keep float32" in by_task["t2"]["changes"][0]
    assert by_task["t3"]["changes"][0].startswith("p6")
    assert by_task["t4"]["changes"][0].startswith("p4: extra trials")
    assert "reference" in by_task["t5"]["changes"][0]
    assert by_task["t6"]["changes"] == [c.name for c in PROTOCOL_CHANGES if "near zero" in c.name]
    assert by_task["t7"]["changes"] == [] and explained["by_change"]["unexplained"] == 1


def test_audit_compare_explains_on_request(tmp_path, capsys):
    earlier, new = tmp_path / "a.json", tmp_path / "b.json"
    earlier.write_text(json.dumps(EARLIER))
    new.write_text(json.dumps(NEW))
    out = tmp_path / "cmp.json"
    assert main(["audit-compare", str(earlier), str(new), "--explain", "--json", str(out)]) == 1  # not reproduced
    printed = capsys.readouterr().out
    assert "t7: correct -> compile_error: unexplained (same flags)" in " ".join(printed.split())
    assert json.loads(out.read_text())["explained"]["by_change"]["unexplained"] == 1
