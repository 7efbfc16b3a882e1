"""Stage 1 on a tiny random model with the byte tokenizer: real SFTTrainer steps, data shapes, resume."""

from __future__ import annotations

import json
import math
import re

import pytest
import torch

from cudal1.core.errors import ConfigError
from cudal1.train.config import SFTStageConfig, load_config
from cudal1.train.models import load_policy
from cudal1.train.sft import load_sft_records, run_sft, split_records
from tests.train.helpers import common_overrides, correct_code, write_jsonl


def _dataset(tmp_path, tasks):
    rows = [{"task_id": t.id, "code": correct_code(t)} for t in tasks]
    rows.append({"messages": [{"role": "user", "content": "make it fast"},
                              {"role": "assistant", "content": "```python\nclass ModelNew: pass\n```"}]})
    rows.append({"prompt": "speed up x+1", "completion": "```python\nclass ModelNew: pass\n```"})
    return write_jsonl(tmp_path / "sft.jsonl", rows)


def test_records_accept_the_three_row_shapes(tmp_path, tiny_tasks):
    records = load_sft_records(_dataset(tmp_path, tiny_tasks), tiny_tasks)
    assert len(records) == len(tiny_tasks) + 2
    first = records[0]
    assert first["prompt"][0]["role"] == "system" and tiny_tasks[0].source.strip() in first["prompt"][-1]["content"]
    answer = first["completion"][0]["content"]
    assert answer.startswith("```python\n") and "class ModelNew(" in answer
    train, held = split_records(records, 0.2)
    assert held and len(train) + len(held) == len(records)
    assert split_records(records, 0.2) == (train, held)


def test_bad_rows_name_their_line(tmp_path):
    path = write_jsonl(tmp_path / "bad.jsonl", [{"prompt": "p", "completion": "c"}, {"text": "?"}])
    with pytest.raises(ConfigError, match="bad.jsonl:2"):
        load_sft_records(path)


def test_sft_trains_every_parameter_and_logs_finite_losses(tmp_path, tiny_tasks):
    cfg = load_config(SFTStageConfig, None, common_overrides(
        tmp_path, dataset=str(_dataset(tmp_path, tiny_tasks)), max_steps=3, max_length=4096, eval_fraction=0.2,
        learning_rate=1e-3))
    model, tok = load_policy("scratch", seed=0)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    result = run_sft(cfg, model=model, tokenizer=tok, tasks=tiny_tasks)
    losses = [e["loss"] for e in result.log_history if "loss" in e]
    assert len(losses) == 3 and all(math.isfinite(v) for v in losses)
    assert result.summary["eval_loss"] is not None and math.isfinite(result.summary["eval_loss"])
    unchanged = [n for n, p in model.named_parameters() if torch.equal(before[n], p.detach())]
    assert unchanged == []
    run = tmp_path / "run"
    assert (run / "config.yaml").is_file() and (run / "final" / "config.json").is_file()
    assert json.loads((run / "summary.json").read_text())["steps"] == 3
    reloaded, _ = load_policy(result.final_model_dir)
    assert sum(p.numel() for p in reloaded.parameters()) == sum(p.numel() for p in model.parameters())


def test_policy_saved_after_gradient_checkpointing_samples_with_the_kv_cache(tmp_path, tiny_tasks):
    # Trainer turns use_cache off for gradient checkpointing; the saved policy must not keep it off, or
    # every sampled token re-reads the whole prompt (minutes per batch for 2K-token completions).
    cfg = load_config(SFTStageConfig, None, common_overrides(
        tmp_path, dataset=str(_dataset(tmp_path, tiny_tasks)), max_steps=1, max_length=4096,
        gradient_checkpointing=True))
    result = run_sft(cfg, tasks=tiny_tasks)
    assert json.loads((tmp_path / "run" / "final" / "config.json").read_text())["use_cache"] is True
    reloaded, _ = load_policy(result.final_model_dir)
    assert reloaded.config.use_cache is True


def test_sft_resumes_from_a_checkpoint(tmp_path, tiny_tasks):
    data = str(_dataset(tmp_path, tiny_tasks))
    first = load_config(SFTStageConfig, None, common_overrides(tmp_path, dataset=data, max_steps=2, save_steps=2,
                                                               max_length=128, eval_fraction=0.0))
    run_sft(first, tasks=tiny_tasks)
    assert (tmp_path / "run" / "checkpoint-2").is_dir()
    second = load_config(SFTStageConfig, None, common_overrides(tmp_path, dataset=data, max_steps=4, save_steps=2,
                                                                max_length=128, eval_fraction=0.0,
                                                                resume_from_checkpoint="latest"))
    result = run_sft(second, tasks=tiny_tasks)
    steps = [e["step"] for e in result.log_history if "loss" in e]
    assert result.summary["steps"] == 4 and steps[-2:] == [3, 4] and 1 not in steps[2:]


def test_a_missing_model_folder_is_a_one_line_error(tmp_path):
    # An absolute path that does not exist is no hub id either: the hub's own check rejects it offline.
    with pytest.raises(ConfigError, match="no such local folder"):
        load_policy(str(tmp_path / "no_such_checkpoint"))


def test_sft_trains_only_on_the_split_the_later_stages_read(tmp_path, tiny_tasks):
    """`--split train` dropped nothing and wrote no split file: held-out tasks leaked into stage 1."""
    from cudal1.train.common import resolve_tasks
    from cudal1.train.sft import records_of_split

    cfg = load_config(SFTStageConfig, None, common_overrides(
        tmp_path, dataset=str(_dataset(tmp_path, tiny_tasks)), split="train", test_fraction=0.5))
    records = load_sft_records(cfg.dataset, tiny_tasks)
    kept = records_of_split(records, cfg, tiny_tasks)
    split = json.loads((tmp_path / "run" / "splits.json").read_text())
    test_ids = set(split["test"])
    assert test_ids and not any(r["task_id"] in test_ids for r in kept)
    assert sum(1 for r in kept if not r["task_id"]) == 2  # rows without a task id cannot be placed: kept
    assert {t.id for t in resolve_tasks(cfg, tiny_tasks)} == set(split["train"])  # the same file, stage 3


def test_sft_can_teach_the_contrastive_format(tmp_path, tiny_tasks):
    """SFT taught only the plain prompt, while stage 3 prompts with scored exemplars."""
    task = tiny_tasks[0]
    codes = [correct_code(task) + f"\n# variant {i}\n" + "x = 1\n" * i for i in range(4)]
    scores = (1.0, 1.5, 2.0, 3.0)
    rows = [{"task_id": task.id, "code": code, "score": score} for code, score in zip(codes, scores, strict=True)]
    rows.append({"prompt": "speed up x+1", "completion": "```python\nclass ModelNew: pass\n```"})  # no score
    path = write_jsonl(tmp_path / "sft.jsonl", rows)
    plain = load_sft_records(path, tiny_tasks)
    assert all("Previous implementations" not in r["prompt"][-1]["content"] for r in plain)
    records = load_sft_records(path, tiny_tasks, contrastive_fraction=1.0, exemplars_per_prompt=2)
    by_score = {r.get("score"): r for r in records}
    best = by_score[3.0]["prompt"][-1]["content"]
    assert "## Previous implementations" in best and best.count("### Implementation") == 2
    shown = [float(x) for x in re.findall(r"speedup ([0-9.]+)x over the reference", best)]
    assert shown == sorted(shown) and all(v < 3.0 for v in shown)  # only slower ones, best last
    answer = by_score[3.0]["completion"][0]["content"]
    assert answer.startswith("## Performance Analysis") and "## Code\n```python\n" in answer
    assert "3.00x" in answer
    assert "None yet." in by_score[1.0]["prompt"][-1]["content"]  # nothing slower: the first round's prompt
    assert by_score[None]["prompt"] == [{"role": "user", "content": "speed up x+1"}]  # cannot be: unchanged
    half = load_sft_records(path, tiny_tasks, contrastive_fraction=0.5)
    assert half == load_sft_records(path, tiny_tasks, contrastive_fraction=0.5)  # stable choice
    with pytest.raises(ConfigError, match="contrastive_fraction"):
        load_config(SFTStageConfig, None, common_overrides(tmp_path, dataset=str(path), contrastive_fraction=2.0))
    # by default most scored examples teach the contrastive format (the study's share), not none of them
    default = load_config(SFTStageConfig, None, common_overrides(tmp_path, dataset=str(path))).contrastive_fraction
    by_default = load_sft_records(path, tiny_tasks, contrastive_fraction=default)
    assert default > 0.5 and sum("## Previous implementations" in r["prompt"][-1]["content"] for r in by_default) >= 2
