"""Stage 3 on every admitted TRL: whole prompts, TRL's settings, and what an exemplar copy earns.

- `grpo_args` on a GRPOConfig shaped like TRL 0.20-0.25's (max_prompt_length 512 by default, which keeps the
  last 512 prompt tokens; 0.20-0.21's boolean scale_rewards): no truncation, the scaling mapped, truncated
  completions masked;
- a real GRPO run through `cudal1 train rl` (TRL's GRPOTrainer, a tiny model built from a config, the byte
  tokenizer) with a contrastive prompt of 3,000+ tokens: the trainer feeds it whole, and a copy of an
  exemplar shown in it is paid as the configuration says;
- a trainer that truncates (TRL 0.20-0.25's behaviour, imitated) stops with `PromptTruncatedError`.
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from cudal1.core.errors import ConfigError, PromptTruncatedError
from cudal1.train.config import RLStageConfig, load_config
from tests.train.helpers import common_overrides, correct_code


@dataclasses.dataclass
class GRPOConfig020:
    """The GRPOConfig fields of TRL 0.20-0.21 that truncate prompts and scale advantages."""

    max_prompt_length: int | None = 512
    scale_rewards: bool = True
    mask_truncated_completions: bool = False


@dataclasses.dataclass
class GRPOConfig025:
    """The same fields in TRL 0.22-0.25 (scale_rewards became a string)."""

    max_prompt_length: int | None = 512
    scale_rewards: str = "group"
    mask_truncated_completions: bool = False


def test_grpo_args_on_trls_that_truncate_prompts(tmp_path, monkeypatch):
    import trl

    from cudal1.train.rl import grpo_args

    config = load_config(RLStageConfig, None, common_overrides(tmp_path, num_generations=2))
    assert config.scale_rewards == "none" and config.mask_truncated_completions
    for old, none in ((GRPOConfig020, False), (GRPOConfig025, "none")):
        monkeypatch.setattr(trl, "GRPOConfig", old)
        args = grpo_args(config)
        assert args.max_prompt_length is None and args.scale_rewards == none and args.mask_truncated_completions
    monkeypatch.setattr(trl, "GRPOConfig", GRPOConfig020)
    assert grpo_args(load_config(RLStageConfig, None, common_overrides(tmp_path, num_generations=2, scale_rewards="group"))
                     ).scale_rewards is True
    with pytest.raises(ConfigError, match="TRL >= 0.22"):
        grpo_args(load_config(RLStageConfig, None, common_overrides(tmp_path, num_generations=2, scale_rewards="batch")))


def _long_exemplar(task, tag: str) -> str:
    """A correct candidate of about 1,500 bytes (a distinct constant keeps the two exemplars apart)."""
    return correct_code(task) + f'\nNOTES_{tag} = """{(tag + " tuned the launch. ") * 80}"""\n'


def _seed_db(tmp_path, task, context):
    from cudal1.exemplars import ExemplarDB

    db = ExemplarDB(tmp_path / "seed.sqlite")
    db.add(task.id, _long_exemplar(task, "a"), 3.0, context=context)
    db.add(task.id, _long_exemplar(task, "b"), 1.5, context=context)
    return db


def test_a_3000_token_contrastive_prompt_reaches_the_trainer_whole_and_a_copy_earns_the_margin(
        tmp_path, tiny_tasks, monkeypatch, capsys):
    from cudal1.cli.main import main
    from cudal1.llm.extract import Extraction
    from cudal1.train import rewards as rewards_module
    from cudal1.train.models import load_policy
    from cudal1.train.rl import prompt_tokens, run_score_context

    task = tiny_tasks[0]
    settings = {"model": "scratch:max_positions=4096", "num_generations": 2, "per_device_train_batch_size": 2,
                "max_steps": 1, "max_completion_length": 8, "beta": 0.0, "max_tasks": 1, "eval_threads": 1,
                "exemplars_per_prompt": 2, "exemplar_copy_reward": "margin", "exemplar_copy_margin": 0.1,
                "exemplar_seed": str(tmp_path / "seed.sqlite"), "save_steps": 1000}
    values = common_overrides(tmp_path, **settings)
    _seed_db(tmp_path, task, run_score_context(load_config(RLStageConfig, None, values)))
    copied = _long_exemplar(task, "a")
    # A random policy writes no code: its answers are taken as a copy of the 3.0x exemplar its prompt shows.
    monkeypatch.setattr(rewards_module, "extract_completion", lambda text: Extraction(copied))
    argv = ["train", "rl", "--model", values.pop("model"), "-o", values.pop("output_dir"),
            "--source", values.pop("source")]
    for key, value in values.items():
        argv += ["--set", f"{key}={value}"]
    assert main(argv) == 0, capsys.readouterr().err
    run = tmp_path / "run"
    lines = [json.loads(line) for line in (run / "completions.jsonl").read_text().splitlines()]
    prompt = lines[0]["prompt"]
    assert "NOTES_a" in prompt[-1]["content"] and "NOTES_b" in prompt[-1]["content"]  # both exemplars shown
    _, tok = load_policy("scratch:max_positions=4096")
    built = prompt_tokens(prompt, tok)
    summary = json.loads((run / "summary.json").read_text())
    assert built >= 3000 and summary["prompt_tokens_max"] == built  # what the model was fed: all of it
    assert [line["exemplar_copy"] for line in lines] == [True, True] and {line["status"] for line in lines} == {
        "correct"}
    assert [line["reward"] for line in lines] == pytest.approx([2.7, 2.7])  # 3.0x less a 10 % margin
    assert summary["reward_batches"][0]["exemplar_copies"] == 2


def test_a_trainer_that_truncates_prompts_stops(tmp_path, tiny_tasks, monkeypatch):
    """TRL 0.20-0.25 kept the last 512 tokens of a prompt; imitated here on the installed TRL's tokenization,
    the run stops instead of training on prompts without their reference."""
    from trl import GRPOTrainer

    from cudal1.exemplars import ExemplarDB
    from cudal1.train.models import load_policy
    from cudal1.train.rl import ContrastivePromptBuilder, run_rl

    if not hasattr(GRPOTrainer, "_tokenize_prompts"):
        pytest.skip("this TRL tokenizes prompts elsewhere")
    original = GRPOTrainer._tokenize_prompts

    def keep_last_512(self, prompts):
        ids, images, fields = original(self, prompts)
        return [list(x)[-512:] for x in ids], images, fields

    monkeypatch.setattr(GRPOTrainer, "_tokenize_prompts", keep_last_512)
    task = tiny_tasks[0]
    db = ExemplarDB(tmp_path / "ex.sqlite")
    for tag, score in (("a", 3.0), ("b", 1.5)):
        db.add(task.id, _long_exemplar(task, tag), score)
    config = load_config(RLStageConfig, None, common_overrides(
        tmp_path, model="scratch:max_positions=4096", num_generations=2, max_steps=1, max_completion_length=4,
        beta=0.0, exemplars_per_prompt=2))
    model, tok = load_policy("scratch:max_positions=4096")
    with pytest.raises(PromptTruncatedError, match="fed 512 of a prompt's"):
        run_rl(config, model=model, tokenizer=tok, tasks=[task], exemplar_db=db, reward_funcs=[lambda **k: [0.0] * 2],
               prompt_builder=ContrastivePromptBuilder(db, sampler_config={"n": 2}, tokenizer=tok))


def test_a_kernel_form_prompt_shows_kernel_form_exemplars_only_and_the_others_none(tmp_path):
    """A spec and a module are never shown for each other: neither answer could copy the other."""
    from cudal1.exemplars import ExemplarDB
    from cudal1.kernel_form.examples import RELU_SPEC
    from cudal1.tasks.task import Task
    from cudal1.train.rl import ContrastivePromptBuilder

    db = ExemplarDB(tmp_path / "ex.sqlite")
    spec = json.dumps(RELU_SPEC)
    db.add("t", spec, 1.5)
    module_code = "import torch\n\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n        return x\n"
    db.add("t", module_code, 1.2)
    task = Task(id="t", source="class Model:\n    pass\n")
    kernel = ContrastivePromptBuilder(db, sampler_config={"n": 4}, form="kernel")
    assert [e.code for e in kernel.exemplars(task, 0)] == [spec]
    module = ContrastivePromptBuilder(db, sampler_config={"n": 4}, form="raw_cuda")
    assert [e.code for e in module.exemplars(task, 0)] == [module_code]


def test_the_stages_take_the_kernel_form(tmp_path):
    from cudal1.train.config import RLStageConfig

    assert RLStageConfig(model="scratch", output_dir=str(tmp_path), form="kernel").form == "kernel"
    with pytest.raises(ConfigError, match="form must be one of auto, load_inline, raw_cuda, torch, kernel"):
        RLStageConfig(model="scratch", output_dir=str(tmp_path), form="kernels")
