"""Stage 3: contrastive GRPO through TRL on a tiny random model (CPU).

- real generation + the real reward (real CPU evaluator): rewards flow, loss finite, the exemplar database
  fills during training and a success of step 1 shows up in the contrastive prompt of step 2;
- a controlled reward raises the policy's probability of the rewarded first token;
- resume from a checkpoint continues the step count.
"""

from __future__ import annotations

import itertools
import json
import math

import pytest
import torch

from cudal1.exemplars import ExemplarDB
from cudal1.llm.extract import Extraction
from cudal1.train import rewards as rewards_module
from cudal1.train.config import RLStageConfig, load_config
from cudal1.train.models import load_policy
from cudal1.train.rl import ContrastivePromptBuilder, run_rl
from tests.train.helpers import common_overrides, correct_code, wrong_code


class RecordingBuilder(ContrastivePromptBuilder):
    """The real contrastive prompt builder, remembering what it built at which step."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.prompts: list[tuple[int, str]] = []

    def build(self, task, step=0):
        messages = super().build(task, step)
        self.prompts.append((step, messages[-1]["content"]))
        return messages


class ShortPrompt:
    """A short fixed prompt, so that controlled-reward runs take seconds on a CPU."""

    built = 0

    def build(self, task, step=0):
        self.built += 1
        return [{"role": "user", "content": f"speed up {task.name}"}]


def _task(tasks, name):
    return next(t for t in tasks if t.name == name)


def test_grpo_with_real_generation_and_the_real_evaluator(tmp_path, tiny_tasks, real_evaluator, monkeypatch):
    task = _task(tiny_tasks, "scale_add")
    turn = itertools.count()
    # A random policy writes no code; map its completions to a known correct / wrong candidate in turn, so
    # that the real evaluator judges real candidates inside the GRPO loop.
    monkeypatch.setattr(rewards_module, "extract_completion",
                        lambda text: Extraction(correct_code(task) if next(turn) % 2 == 0 else wrong_code(task)))
    db = ExemplarDB(tmp_path / "ex.sqlite")
    cfg = load_config(RLStageConfig, None, common_overrides(
        tmp_path, num_generations=2, per_device_train_batch_size=2, max_steps=2, max_completion_length=8,
        learning_rate=1e-3, beta=0.0, save_steps=1000))
    model, tok = load_policy("scratch", seed=0)
    builder = RecordingBuilder(db, token_budget=None)
    result = run_rl(cfg, model=model, tokenizer=tok, tasks=[task], evaluator=real_evaluator, exemplar_db=db,
                    prompt_builder=builder)
    batches = result.summary["reward_batches"]
    assert [b["statuses"] for b in batches] == [{"correct": 1, "incorrect": 1}] * 2
    assert result.summary["raw_reward_last"] == batches[-1]["raw_reward_mean"] > 0  # the raw speedups, logged
    losses = [e["loss"] for e in result.log_history if "loss" in e]
    assert len(losses) == 2 and all(math.isfinite(v) for v in losses)
    rewards = [e["reward"] for e in result.log_history if "reward" in e]
    assert rewards and all(math.isfinite(r) for r in rewards)
    assert db.count(task.id) == 1
    by_step = dict(builder.prompts)
    assert "None yet." in by_step[0]  # empty database at the first generation
    assert "### Implementation 1 (speedup" in by_step[1] and "class ModelNew(" in by_step[1]
    assert (tmp_path / "run" / "reward_history.json").is_file()
    # every completion inspectable, with its verdict and reward; each prompt written once
    lines = [json.loads(line) for line in (tmp_path / "run" / "completions.jsonl").read_text().splitlines()]
    assert len(lines) == 4 and [line["step"] for line in lines] == [0, 0, 1, 1]
    assert sorted(line["status"] for line in lines) == ["correct", "correct", "incorrect", "incorrect"]
    assert all(line["stage"] == "grpo" and line["task_id"] == task.id for line in lines)
    assert all("completion" in line for line in lines)
    assert all(line["reward"] > 0 for line in lines if line["status"] == "correct")
    assert {"reward_smoothed", "speedup", "message", "code_found"} <= set(lines[0])
    assert "prompt" in lines[0] and "prompt" not in lines[1]  # a group shares its prompt: written once
    assert lines[0]["prompt_sha256"] == lines[1]["prompt_sha256"] != lines[2]["prompt_sha256"]


def _p_rewarded(model, tok, prompt):
    text = tok.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
    ids = tok(text, return_tensors="pt", add_special_tokens=False)["input_ids"]  # (1, T)
    with torch.no_grad():
        logits = model(input_ids=ids).logits[0, -1]  # (V,)
    return torch.softmax(logits.float(), -1)[:128].sum().item()


def _ascii_first_reward(completion_ids, **kwargs):
    """Pays 1 when the first completion token is an ASCII byte (ids 0-127), else 0."""
    return [1.0 if ids and ids[0] < 128 else 0.0 for ids in completion_ids]


def _controlled_config(tmp_path, **extra):
    return load_config(RLStageConfig, None, common_overrides(
        tmp_path, num_generations=8, per_device_train_batch_size=8, max_completion_length=2, beta=0.0,
        **{"learning_rate": 2e-2, "max_steps": 10, "save_steps": 1000, **extra}))


def test_controlled_reward_raises_the_rewarded_probability(tmp_path, tiny_tasks):
    task = tiny_tasks[0]
    model, tok = load_policy("scratch", seed=0)
    prompt = ShortPrompt().build(task)
    before = _p_rewarded(model, tok, prompt)
    # the reward reads the first token of answers cut at 2: here they are trained on although cut short
    run_rl(_controlled_config(tmp_path, mask_truncated_completions=False), model=model, tokenizer=tok, tasks=[task],
           reward_funcs=[_ascii_first_reward], prompt_builder=ShortPrompt())
    after = _p_rewarded(model, tok, prompt)
    assert after > before + 0.1, (before, after)


def test_truncated_completions_are_masked_by_default(tmp_path, tiny_tasks):
    """Answers cut at max_completion_length (a random policy never ends one in 2 tokens) are no evidence:
    with stage 3's default they leave the loss, and the same controlled reward moves nothing."""
    task = tiny_tasks[0]
    model, tok = load_policy("scratch", seed=0)
    prompt = ShortPrompt().build(task)
    before = _p_rewarded(model, tok, prompt)
    config = _controlled_config(tmp_path)
    assert config.mask_truncated_completions
    run_rl(config, model=model, tokenizer=tok, tasks=[task], reward_funcs=[_ascii_first_reward],
           prompt_builder=ShortPrompt())
    assert _p_rewarded(model, tok, prompt) == pytest.approx(before, abs=1e-3)


def test_grpo_resumes_from_a_checkpoint(tmp_path, tiny_tasks):
    task = tiny_tasks[0]
    first = run_rl(_controlled_config(tmp_path, max_steps=2, save_steps=2), tasks=[task],
                   reward_funcs=[_ascii_first_reward], prompt_builder=ShortPrompt())
    assert first.summary["steps"] == 2 and (tmp_path / "run" / "checkpoint-2").is_dir()
    builder = ShortPrompt()
    second = run_rl(_controlled_config(tmp_path, max_steps=4, save_steps=2, resume_from_checkpoint="latest"),
                    tasks=[task], reward_funcs=[_ascii_first_reward], prompt_builder=builder)
    steps = [e["step"] for e in second.log_history if "loss" in e]
    assert second.summary["steps"] == 4 and steps == [1, 2, 3, 4]  # history restored from the checkpoint
    assert builder.built == 2  # only steps 3 and 4 generated anew
