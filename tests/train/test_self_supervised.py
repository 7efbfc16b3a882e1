"""Stage 2: one round with a scripted sampler, the real CPU evaluator and real fine-tuning; stopping rule."""

from __future__ import annotations

import json

import torch

from cudal1.exemplars import ExemplarDB
from cudal1.train.config import SelfSupervisedConfig, load_config
from cudal1.train.models import load_policy
from cudal1.train.self_supervised import RoundStats, run_self_supervised, should_stop
from tests.train.helpers import common_overrides, correct_code, wrong_code


class ScriptedSampler:
    """Per task: one correct candidate, the same one again (a duplicate), and one wrong candidate."""

    def __init__(self, tasks):
        self.by_source = {t.source: t for t in tasks}
        self.calls = 0

    def sample(self, prompts, n):
        self.calls += 1
        out = []
        for prompt in prompts:
            task = next(t for src, t in self.by_source.items() if src.strip() in prompt[-1]["content"])
            texts = [f"```python\n{correct_code(task)}\n```", f"```python\n{correct_code(task)}\n```",
                     f"```python\n{wrong_code(task)}\n```"]
            out.append(texts[:n])
        return out


def test_one_round_keeps_successes_and_fine_tunes(tmp_path, tiny_tasks, real_evaluator):
    tasks = tiny_tasks[:2]
    db_path = tmp_path / "ex.sqlite"
    cfg = load_config(SelfSupervisedConfig, None, common_overrides(
        tmp_path, rounds=1, samples_per_task=3, max_steps=2, max_length=4096, learning_rate=1e-3,
        exemplar_db=str(db_path)))
    model, tok = load_policy("scratch", seed=0)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    result = run_self_supervised(cfg, model=model, tokenizer=tok, tasks=tasks, sampler=ScriptedSampler(tasks),
                                 evaluator=real_evaluator)
    (stats,) = result.summary["rounds"]
    assert stats["samples"] == 6 and stats["correct"] == 4
    assert abs(stats["success_rate"] - 4 / 6) < 1e-9 and stats["task_success_rate"] == 1.0
    assert stats["kept"] == 2  # the duplicate is kept once
    assert stats["statuses"] == {"correct": 4, "incorrect": 2}
    assert stats["loss_first"] is not None and stats["loss_last"] is not None
    assert result.summary["stopped_because"] == "rounds"
    trained, _ = load_policy(result.final_model_dir)
    changed = [n for n, p in trained.named_parameters() if not torch.equal(before[n], p.detach())]
    assert changed
    assert {t.id: ExemplarDB(db_path).count(t.id) for t in tasks} == {t.id: 1 for t in tasks}
    rounds = json.loads((tmp_path / "run" / "rounds.json").read_text())
    assert rounds[0]["model_dir"].endswith("round_0/model")
    # every completion inspectable, with its verdict and whether it was kept
    lines = [json.loads(line) for line in (tmp_path / "run" / "completions.jsonl").read_text().splitlines()]
    assert len(lines) == 6 and {line["round"] for line in lines} == {0}
    assert sum(line["status"] == "correct" for line in lines) == 4
    assert sum(line["kept"] for line in lines) >= 2 and not any(line["kept"] for line in lines
                                                                if line["status"] != "correct")
    assert sum("prompt" in line for line in lines) == 2  # one prompt per task, written once


def test_resume_skips_finished_rounds(tmp_path, tiny_tasks):
    """A resumed run with all rounds done samples nothing and finishes at once."""
    run = tmp_path / "run"
    run.mkdir()
    model, tok = load_policy("scratch")
    model.save_pretrained(run / "round_0" / "model")
    tok.save_pretrained(run / "round_0" / "model")
    (run / "rounds.json").write_text(json.dumps([RoundStats(0, 6, 3, 0.5, 1, 0.5, 1.0, 1,
                                                            model_dir=str(run / "round_0" / "model")).__dict__]))
    cfg = load_config(SelfSupervisedConfig, None, common_overrides(tmp_path, rounds=1,
                                                                     resume_from_checkpoint="latest"))
    sampler = ScriptedSampler(tiny_tasks)
    result = run_self_supervised(cfg, tasks=tiny_tasks, sampler=sampler, evaluator=lambda t, s: None)
    assert sampler.calls == 0 and len(result.summary["rounds"]) == 1


def _stats(rate):
    return RoundStats(0, 10, int(rate * 10), rate, 1, 1.0, None, 1)


def test_stopping_rule():
    cfg = SelfSupervisedConfig(model="scratch", output_dir="x", rounds=10, target_success_rate=0.5, patience=2,
                               min_improvement=0.05)
    assert should_stop([_stats(0.1)], cfg) is None
    assert should_stop([_stats(0.1), _stats(0.6)], cfg) == "target_success_rate"
    assert should_stop([_stats(0.3), _stats(0.31), _stats(0.32)], cfg) == "patience"
    assert should_stop([_stats(0.1), _stats(0.2), _stats(0.3)], cfg) is None


def test_time_budget_stops_the_stage():
    import time

    cfg = SelfSupervisedConfig(model="scratch", output_dir="x", rounds=10)
    spent, ahead = time.monotonic() - 1, time.monotonic() + 60
    assert should_stop([], cfg, spent) == "time_budget"  # no round starts once the budget is gone
    assert should_stop([_stats(0.1)], cfg, spent) == "time_budget"
    assert should_stop([_stats(0.1)], cfg, ahead) is None
    assert should_stop([_stats(0.1)] * 10, cfg, spent) == "rounds"  # the configured limit is named first


def test_sampling_time_is_bounded_per_batch():
    import time

    from cudal1.train.self_supervised import SAMPLING_SHARE, _batch_time_s

    cfg = SelfSupervisedConfig(model="scratch", output_dir="x", generation_batch_size=4)
    assert _batch_time_s(cfg, 8, None) is None  # unbudgeted: no limit
    share = _batch_time_s(cfg, 8, time.monotonic() + 100)  # 2 batches share 40 % of 100 s
    assert abs(share - SAMPLING_SHARE * 100 / 2) < 1.0
    assert _batch_time_s(cfg, 8, time.monotonic() - 5) == 1.0  # never zero or negative
