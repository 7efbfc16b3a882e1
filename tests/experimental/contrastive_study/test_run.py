"""The study's CPU pipeline end to end, tiny, on the SURROGATE table (a pipeline test: no result comes from it).

Every arm of two seeds runs (the RL arms through the project's `run_rl` for two GRPO steps), each seed from
its own pre-training, every arm spending exactly the same distinct evaluations per held-out task; the seed
file is resumable arm by arm, and the summary has the published shape: per arm and seed the held-out curves
and log-regret, CIs, the primary contrast and the corrected family, the perturbation, the provenance of both
halves."""

from __future__ import annotations

import json

import pytest

from experimental.contrastive_study import run as run_module
from experimental.contrastive_study.arms import ARMS, Protocol
from experimental.contrastive_study.improver import ImproverSize
from experimental.contrastive_study.surrogate import surrogate_table
from experimental.contrastive_study.table import write_table

TINY = Protocol(exemplars=2, budget=8, round_size=4, samples=4, steps=2, tasks_per_step=2, generations=2,
                checkpoints=(2, 4, 8), search_repeats=2, pretrain_seeds=2, pretrain_examples=128)
SMALL = ImproverSize(hidden=32, layers=1, heads=2, intermediate=64)


@pytest.fixture(scope="module")
def table_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("table") / "table.json"
    write_table(path, surrogate_table())
    return path


def test_every_arm_runs_resumes_and_summarizes(table_path, tmp_path, monkeypatch):
    out = tmp_path / "study"
    run_module.run_study(out, table_path, [0, 1], protocol=TINY, size=SMALL, allow_surrogate=True)
    assert (out / "pretrain" / "p0" / "final").is_dir() and (out / "pretrain" / "p1" / "final").is_dir()
    for s in (0, 1):
        seed = json.loads((out / "seeds" / f"seed{s}.json").read_text())
        assert set(seed["arms"]) == set(ARMS) and seed["pretrain_seed"] == s
        for arm, record in seed["arms"].items():
            assert len(record["held_out"]) == 2 and all(len(r) == 14 for r in record["held_out"])
            runs = [e for repeat in record["held_out"] for e in repeat.values()]
            assert all(e["evaluations"] == 8 and len(e["curve"]) == 3 for e in runs), arm  # equal budgets
            assert ("training" in record) == arm.startswith("grpo")
            if ARMS[arm][1] not in ("uniform", "lookup"):
                assert "permuted_scores" in next(iter(record["one_shot"].values()))
    seed = json.loads((out / "seeds" / "seed0.json").read_text())
    assert len(seed["arms"]["grpo-refine"]["training"]["steps"]) == 2
    assert all(e["samples"] == 6 for e in seed["arms"]["random-search"]["held_out"][0].values())
    monkeypatch.setattr(run_module, "run_arm", lambda *a, **k: pytest.fail("a finished arm ran again"))
    run_module.run_study(out, table_path, [0, 1], protocol=TINY, size=SMALL, allow_surrogate=True)
    with pytest.raises(ValueError, match="another protocol"):
        run_module.run_study(out, table_path, [0], protocol=Protocol(), allow_surrogate=True)
    (table_path.parent / "spotcheck.json").write_text(json.dumps({"evaluated": 60, "spearman": 0.9, "rows": []}))
    summary = run_module.summarize(out, table_path)
    assert summary["table"]["spotcheck"] == {"evaluated": 60, "spearman": 0.9} and "cells" not in summary["table"]
    assert summary["table_kind"] == "surrogate" and summary["seeds"] == [0, 1] and len(summary["split"]["held_out"]) == 14
    assert set(summary["arms"]) == set(ARMS) and summary["arms"]["lookup"]["held_out_log_regret"]["n"] == 2
    primary = summary["contrasts"]["grpo-bucket - grpo-plain"]
    assert primary["role"] == "primary" and primary["held_out_log_regret"]["p"] is not None
    assert primary["by_pretraining"]["seeds"] == {"0": 1, "1": 1} and primary["by_pretraining"]["over_pretrainings"]["n"] == 2
    assert all("p_holm" in c["held_out_log_regret"] for c in summary["contrasts"].values() if c["role"] == "secondary")
    assert "Holm" in summary["multiplicity"] and summary["perturbation"]["fields"] == 3
    found = summary["answers"]
    assert found["primary"]["contrast"] == "grpo-bucket - grpo-plain" and found["primary"]["half_width"] >= 0
    assert 0 < found["lookup"]["held_out_fraction_of_best"] <= 1 and "grpo-bucket" in found["mechanism"]
    assert found["budget"]["distinct_evaluations_per_held_out_task"] == 8
    cpu = summary["provenance"]["cpu_half"][0]
    assert {"git_commit", "source_sha256", "versions", "host", "date"} <= set(cpu) and cpu["versions"]["trl"]
    assert "NOT measured" in summary["provenance"]["gpu_half"]["method"]
    assert "| grpo-refine |" in run_module.markdown_table(summary) and "| lookup |" in run_module.markdown_table(summary)


def test_a_surrogate_or_partial_table_is_refused(table_path, tmp_path):
    with pytest.raises(ValueError, match="surrogate table"):
        run_module.run_study(tmp_path, table_path, [0])
    data = surrogate_table()
    data["kind"] = "measured"
    del data["tasks"]["study/gelu_n26"]["cells"]["T64 V1 I1 O S0 M0"]
    partial = tmp_path / "partial.json"
    write_table(partial, data)
    with pytest.raises(ValueError, match="1 recipes not measured"):
        run_module.run_study(tmp_path, partial, [0])
