"""The study's policy: a small Llama that reads scored recipes and writes a better one, pre-trained on the CPU.

No pretrained code model can be had on these machines, so the study brings a policy that can learn to read
exemplars: a 2-layer, 128-wide Llama (about 0.35 M parameters) over the study's word-level vocabulary
(`prompting.py`), pre-trained with the project's stage-1 fine-tuning (`train.sft.fit_sft`, TRL's
`SFTTrainer`, loss on the answer only) on SYNTHETIC landscapes (`landscapes.py`): given a task's features
and k scored recipes, write one that beats them. The measured table is never seen in pre-training.

`sample` draws answers with transformers' `generate` (temperature 1, as stage 3 samples), parsed to recipes.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from experimental.contrastive_study.landscapes import improver_example
from experimental.contrastive_study.ops import visible_features
from experimental.contrastive_study.prompting import prompt_text
from experimental.contrastive_study.recipes import parse_recipe

logger = logging.getLogger(__name__)

MAX_NEW_TOKENS = 7  # six fields and the end of the answer


@dataclass(frozen=True)
class ImproverSize:
    """The policy's size (a Llama)."""

    hidden: int = 128
    layers: int = 2
    heads: int = 4
    intermediate: int = 256
    max_positions: int = 96


def build_improver(size: ImproverSize | None = None, seed: int = 0) -> tuple[Any, Any]:
    """A randomly initialised improver and the study's tokenizer."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from experimental.contrastive_study.prompting import make_tokenizer

    size = size or ImproverSize()
    tok = make_tokenizer()
    config = LlamaConfig(hidden_size=size.hidden, intermediate_size=size.intermediate, num_hidden_layers=size.layers,
                         num_attention_heads=size.heads, num_key_value_heads=size.heads, vocab_size=len(tok),
                         max_position_embeddings=size.max_positions, pad_token_id=tok.pad_token_id,
                         bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, tie_word_embeddings=True)
    torch.manual_seed(seed)
    return LlamaForCausalLM(config), tok


def pretrain_records(n: int, seed: int, k_choices: tuple[int, ...] | None = None,
                     feature_set: str = "full") -> list[dict[str, str]]:
    """`n` synthetic (prompt, answer) examples (see `landscapes.improver_example`; `k_choices`: the numbers of
    exemplars drawn from, default its own; `feature_set`: what the prompts show of a landscape's features,
    `ops.FEATURE_SETS`)."""
    rng = random.Random(seed)
    records = []
    for _ in range(n):
        land, shown, target = improver_example(rng, k_choices) if k_choices else improver_example(rng)
        records.append({"prompt": prompt_text(visible_features(land.features, feature_set), shown),
                        "completion": " " + target})
    return records


def pretrain(out_dir: Path, *, seed: int = 0, examples: int = 40000, epochs: float = 1.0, batch: int = 64,
             learning_rate: float = 2e-3, size: ImproverSize | None = None,
             k_choices: tuple[int, ...] | None = None, feature_set: str = "full") -> Path:
    """Pre-train an improver with the project's SFT stage; returns the saved policy's folder (reused when it
    exists: `out_dir/final`)."""
    from cudal1.train.config import SFTStageConfig, load_config
    from cudal1.train.models import save_policy
    from cudal1.train.sft import fit_sft

    final = out_dir / "final"
    if (final / "config.json").is_file():
        return final
    size = size or ImproverSize()
    model, tok = build_improver(size, seed)
    config = load_config(SFTStageConfig, None, {
        "model": "(study improver)", "dataset": "(synthetic landscapes)", "output_dir": str(out_dir), "use_cpu": True,
        "report_to": "none", "store": "none", "split": "all", "seed": seed, "learning_rate": learning_rate,
        "lr_scheduler_type": "cosine", "warmup_ratio": 0.02, "num_train_epochs": epochs,
        "per_device_train_batch_size": batch, "gradient_accumulation_steps": 1, "logging_steps": 50,
        "save_steps": 10**9, "eval_fraction": 0.0, "max_length": size.max_positions})
    trainer = fit_sft(model, tok, pretrain_records(examples, seed, k_choices, feature_set), [], config,
                      output_dir=str(out_dir),
                      max_length=size.max_positions, extra_args={"save_strategy": "no"})
    losses = [e["loss"] for e in trainer.state.log_history if "loss" in e]
    logger.info("improver pre-trained: %d steps, loss %.3f -> %.3f", trainer.state.global_step,
                losses[0] if losses else float("nan"), losses[-1] if losses else float("nan"))
    return save_policy(trainer.model, tok, final)


def sample(model: Any, tok: Any, prompts: Sequence[str], n: int, seed: int,
           temperature: float = 1.0) -> list[list[str | None]]:
    """`n` answers to each prompt (parsed recipes; None when an answer is not one), in prompt order."""
    import torch

    model.eval()
    batch = tok(list(prompts), return_tensors="pt", padding=True, padding_side="left", add_special_tokens=False)
    torch.manual_seed(seed)
    with torch.no_grad():
        out = model.generate(input_ids=batch.input_ids.repeat_interleave(n, 0),
                             attention_mask=batch.attention_mask.repeat_interleave(n, 0), do_sample=True,
                             temperature=temperature, top_p=1.0, top_k=0, max_new_tokens=MAX_NEW_TOKENS,
                             pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
    texts = tok.batch_decode(out[:, batch.input_ids.shape[1]:], skip_special_tokens=True)
    parsed = [parse_recipe(t) for t in texts]
    return [parsed[i * n:(i + 1) * n] for i in range(len(prompts))]


def exemplar_reading(model: Any, tok: Any, *, landscapes: int = 60, samples: int = 16, k: int = 4,
                     seed: int = 1234, feature_set: str = "full") -> dict[str, Any]:
    """Does the improver read exemplars? On fresh SYNTHETIC landscapes (never trained on), the mean fraction of
    the best of its answers given k scored exemplars (`true`), the same exemplars with their scores permuted
    among them (`shuffled`, shown in the permuted order), and of random recipes (`random`, the landscape's
    mean); with the paired differences per landscape."""
    import statistics

    from experimental.contrastive_study.landscapes import draw_exemplars, generate

    rng = random.Random(seed)
    lands, true_prompts, shuffled_prompts = [], [], []
    for _ in range(landscapes):
        land = generate(rng)
        shown = draw_exemplars(land, k, rng)
        scores = [s for _, s in shown]
        permuted = list(scores)
        while permuted == scores and len(set(scores)) > 1:
            rng.shuffle(permuted)
        shuffled = sorted(((r, s) for (r, _), s in zip(shown, permuted, strict=True)), key=lambda e: e[1])
        lands.append(land)
        features = visible_features(land.features, feature_set)
        true_prompts.append(prompt_text(features, shown))
        shuffled_prompts.append(prompt_text(features, shuffled))
    values: dict[str, list[float]] = {}
    for name, prompts in (("true", true_prompts), ("shuffled", shuffled_prompts)):
        answers = sample(model, tok, prompts, samples, seed)
        values[name] = [statistics.fmean(land.speedups.get(a or "", 0.0) / land.best for a in out)
                        for land, out in zip(lands, answers, strict=True)]
    values["random"] = [statistics.fmean(land.speedups.values()) / land.best for land in lands]
    out: dict[str, Any] = {name: round(statistics.fmean(v), 4) for name, v in values.items()}
    for a, b in (("true", "shuffled"), ("true", "random")):
        diffs = [x - y for x, y in zip(values[a], values[b], strict=True)]
        out[f"{a}_minus_{b}"] = {"mean": round(statistics.fmean(diffs), 4),
                                 "se": round(statistics.stdev(diffs) / len(diffs) ** 0.5, 4),
                                 "wins": sum(d > 0 for d in diffs), "landscapes": len(diffs)}
    return out
