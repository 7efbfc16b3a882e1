"""LoRA through the stages: each stage's adapters are merged into the policy it saves, so the next stage (and
sampling) loads a plain model that carries them; nothing a stage learned is dropped."""

from __future__ import annotations

import itertools
import json

import torch

from cudal1.llm.extract import Extraction
from cudal1.train import rewards as rewards_module
from cudal1.train.config import RLStageConfig, SFTStageConfig, load_config
from cudal1.train.models import load_policy
from cudal1.train.rl import run_rl
from cudal1.train.sft import run_sft
from tests.train.helpers import common_overrides, correct_code, write_jsonl, wrong_code


def _logits(model_dir: str) -> torch.Tensor:
    model, tok = load_policy(model_dir)
    ids = torch.tensor([tok.encode("class ModelNew(nn.Module):")])
    with torch.no_grad():
        return model(ids).logits


def test_lora_stages_chain_and_each_keeps_what_the_last_learned(tmp_path, tiny_tasks, real_evaluator, monkeypatch):
    rows = [{"task_id": t.id, "code": correct_code(t)} for t in tiny_tasks]
    sft_cfg = load_config(SFTStageConfig, None, common_overrides(
        tmp_path / "sft", dataset=str(write_jsonl(tmp_path / "sft.jsonl", rows)), max_steps=3, max_length=4096,
        learning_rate=5e-2, use_lora=True, lora_r=4, lora_alpha=8, lora_dropout=0.0))
    base, tok = load_policy("scratch", seed=0)
    base.save_pretrained(tmp_path / "base")
    tok.save_pretrained(tmp_path / "base")
    stage1 = run_sft(sft_cfg, model=base, tokenizer=tok, tasks=tiny_tasks)
    saved = tmp_path / "sft" / "run" / "final"
    assert not (saved / "adapter_config.json").exists(), "a stage saves its policy merged, not a bare adapter"
    assert json.loads((saved / "adapter" / "adapter_config.json").read_text())["r"] == 4  # kept for reference
    after_sft = _logits(stage1.final_model_dir)
    assert not torch.allclose(after_sft, _logits(str(tmp_path / "base"))), "stage 1's adapters were dropped"

    # A random policy writes no code: map its completions to a correct and a wrong candidate in turn, so that
    # the rewards differ within each group and GRPO has a gradient.
    turn = itertools.count()
    monkeypatch.setattr(rewards_module, "extract_completion", lambda text: Extraction(
        correct_code(tiny_tasks[0]) if next(turn) % 2 == 0 else wrong_code(tiny_tasks[0])))

    def rl(name: str, learning_rate: float):
        cfg = load_config(RLStageConfig, None, common_overrides(
            tmp_path / name, model=stage1.final_model_dir, num_generations=2, per_device_train_batch_size=2,
            max_steps=2, max_completion_length=8, learning_rate=learning_rate, beta=0.0, save_steps=1000,
            use_lora=True, lora_r=4, lora_alpha=8, lora_dropout=0.0))
        return _logits(run_rl(cfg, tasks=tiny_tasks[:1], evaluator=real_evaluator).final_model_dir)

    # With a vanishing learning rate stage 3 must save stage 1's policy (it once saved the base model's).
    assert torch.allclose(rl("rl0", 1e-12), after_sft, atol=1e-5)
    assert not torch.allclose(rl("rl", 5e-2), after_sft), "stage 3's own adapters were dropped"
