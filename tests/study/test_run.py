"""The study's CPU pipeline end to end, tiny, on the SURROGATE table (a pipeline test: no result comes from it).

Every arm of one seed runs (the RL arms through the project's `run_rl` for two GRPO steps), the seed file is
resumable arm by arm, and the summary has the published shape: per arm and seed the held-out curves, CIs, the
contrasts paired by seed, the split and the table's provenance."""

from __future__ import annotations

import json

import pytest

from cudal1.study import run as run_module
from cudal1.study.arms import ARMS, Protocol
from cudal1.study.improver import ImproverSize
from cudal1.study.surrogate import surrogate_table
from cudal1.study.table import write_table

TINY = Protocol(exemplars=2, budget=8, round_size=4, samples=4, steps=2, tasks_per_step=2, generations=2,
                checkpoints=(2, 4, 8))


@pytest.fixture(scope="module")
def table_path(tmp_path_factory):
    path = tmp_path_factory.mktemp("table") / "table.json"
    write_table(path, surrogate_table())
    return path


def test_every_arm_runs_resumes_and_summarizes(table_path, tmp_path, monkeypatch):
    out = tmp_path / "study"
    run_module.run_study(out, table_path, [0], protocol=TINY, pretrain_examples=128,
                         size=ImproverSize(hidden=32, layers=1, heads=2, intermediate=64), allow_surrogate=True)
    seed = json.loads((out / "seeds" / "seed0.json").read_text())
    assert set(seed["arms"]) == set(ARMS)
    for arm, record in seed["arms"].items():
        assert len(record["held_out"]) == 14 and all(len(e["curve"]) == 3 for e in record["held_out"].values())
        assert ("training" in record) == arm.startswith("grpo")
    assert len(seed["arms"]["grpo-bucket"]["training"]["steps"]) == 2
    # random *exemplars* (a prompt style) are not random *proposals*: grpo-random samples its policy
    assert "distinct" in next(iter(seed["arms"]["grpo-random"]["one_shot"].values()))
    assert "distinct" not in next(iter(seed["arms"]["random-search"]["one_shot"].values()))
    assert all(e["samples"] == 6 and e["evaluations"] == 8 for e in seed["arms"]["random-search"]["held_out"].values())
    monkeypatch.setattr(run_module, "run_arm", lambda *a, **k: pytest.fail("a finished arm ran again"))
    run_module.run_study(out, table_path, [0], protocol=TINY, pretrain_examples=128, allow_surrogate=True)
    (table_path.parent / "spotcheck.json").write_text(json.dumps({"evaluated": 60, "spearman": 0.9, "rows": []}))
    summary = run_module.summarize(out, table_path)
    assert summary["table"]["spotcheck"]["spearman"] == 0.9
    assert summary["table_kind"] == "surrogate" and summary["seeds"] == [0] and len(summary["split"]["held_out"]) == 14
    assert set(summary["arms"]) == set(ARMS) and summary["arms"]["random-search"]["held_out_auc"]["n"] == 1
    assert "grpo-bucket - grpo-plain" in summary["contrasts"]
    assert summary["table"]["cells"]["tasks"]["study/swish_n26"]["cells"]["T256 V4 I2 G S0 M0"]["times_ms"]
    assert "| grpo-bucket |" in run_module.markdown_table(summary)


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
