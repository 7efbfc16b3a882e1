"""Stage 3: contrastive GRPO through TRL's `GRPOTrainer`, rewarded by the hardened evaluator.

How contrastive prompts are built "at the time they are used" (the exemplar database changes during
training): the dataset holds only task ids (and a placeholder prompt). `ContrastiveGRPOTrainer` overrides
TRL's `_generate_and_score_completions(inputs)`, the one place where a generation batch is turned into
completions, and replaces each row's `prompt` with `ContrastivePromptBuilder.build(task, step)` just before
generation: exemplars sampled from the *current* database (bucket/island/random sampling), shown with their
scores. All rows of one task in one generation round get the same prompt (so a GRPO group shares its
prompt): the sampler's random generator is seeded from (seed, task id, global step), which also keeps the
processes of a multi-GPU run in step.

Rewards come from `KernelReward` (see `rewards.py`): every correct candidate enters the database, so the
next batch's prompts can show it. The database starts with stage 2's successes by default (`exemplar_seed`,
`exemplar_seed.py`), so the first prompts already show scored kernels. The candidates of one batch are
evaluated in parallel (`eval_threads`). Every completion, with its verdict and reward, goes to
`<output_dir>/completions.jsonl` (`log_completions`, see `completions.py`); the exemplar database is
`<output_dir>/exemplars.sqlite` unless `exemplar_db` is set.

Prompts reach the model whole, on every TRL that `trl>=0.20` admits: TRL 0.20-0.25 cut a prompt to
`max_prompt_length` tokens, 512 by default (0.20-0.23 keep the last ones, 0.24-0.25 cut on the tokenizer's
truncation side), which left a contrastive prompt (reference and exemplars, thousands of tokens) with its
last exemplar or without its instructions; 0.26-0.27 deprecate the setting (default None: no truncation) and
0.28 removed it. `grpo_args` sets it to None wherever it exists (the prompt builder keeps
prompts within `prompt_token_budget` instead), and the trainer checks every generation round that the
prompt tokens fed to the model are as many as the built prompt has, stopping with `PromptTruncatedError`
otherwise (`check_prompts_whole`); the summary records the longest prompt fed (`prompt_tokens_max`).
TRL 0.20-0.21 read `scale_rewards` as a boolean (any string, "none" included, was True); it is mapped.

The advantage: `KernelReward`'s smoothing normalizes each group (with a dead band) and clips it to
[-1.5, 1.5]; TRL is told not to scale again (`scale_rewards: none`), since its own division by the group's
std would undo both. Each row also carries the exemplars its prompt showed (`shown_exemplars`: their
normalised-source hashes and scores), so that the reward pays a copy of one as `exemplar_copy_reward` says.

Limits: TRL's loop is synchronous, so the evaluation of a batch overlaps with itself (parallel threads)
but not with the generation of the next batch. `_generate_and_score_completions` is a private TRL method
(stable from TRL 0.14 to 1.16, the version tested); a TRL release that renames it fails loudly at start.
With several processes, each adds its own successes to the shared database file, so two processes may
read it a few milliseconds apart.

Run: `cudal1 train rl --config rl.yaml --model runs/ss/final --output-dir runs/rl`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib
import importlib.util
import logging
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cudal1.core.errors import ConfigError, MissingDependencyError, PromptTruncatedError
from cudal1.core.forms import KERNEL, candidate_form
from cudal1.exemplars import ExemplarDB, make_sampler, normalized_hash
from cudal1.exemplars.db import score_context
from cudal1.llm.prompts import build_contrastive_prompt
from cudal1.tasks.task import Task
from cudal1.train.common import (
    EvaluateFn,
    RunRecorder,
    StageResult,
    check_evaluation_device,
    default_evaluator,
    is_main_process,
    make_training_args,
    open_store,
    process_rank,
    resolve_resume,
    resolve_tasks,
    time_budget_callback,
    world_size,
)
from cudal1.train.completions import CompletionLog
from cudal1.train.config import RLStageConfig
from cudal1.train.exemplar_seed import seed_exemplars
from cudal1.train.models import load_policy, lora_config, save_policy, save_trained
from cudal1.train.rewards import Judge, KernelReward, RewardConfig

logger = logging.getLogger(__name__)


class ContrastivePromptBuilder:
    """Builds CUDA-L1's contrastive prompt for a task from the exemplar database as it is now."""

    def __init__(self, exemplar_db: Any, *, sampler: str = "bucket", sampler_config: dict[str, Any] | None = None,
                 form: str = "load_inline", token_budget: int | None = 16384, tokenizer: Any = None, seed: int = 0):
        self.db = exemplar_db
        self.sampler = make_sampler(sampler, sampler_config)
        self.form = form
        self.token_budget = token_budget
        self.tokenizer = tokenizer
        self.seed = seed
        self.built = 0  # prompts built so far (for logging and tests)
        self.last_exemplars: dict[str, list[Any]] = {}  # task id -> the exemplars of its last prompt

    def build(self, task: Task, step: int = 0) -> list[dict[str, str]]:
        """The chat prompt for `task`, with exemplars drawn from the database's current contents; the exemplars
        it shows are kept in `last_exemplars[task.id]` (the reward needs them to know a copy of one)."""
        self.built += 1
        exemplars = self.exemplars(task, step)
        self.last_exemplars[task.id] = list(exemplars)
        return self.render(task, exemplars)

    def exemplars(self, task: Task, step: int) -> list[Any]:
        """The exemplars shown at `step`, drawn by the sampler from the database as it is now."""
        digest = hashlib.sha256(f"{self.seed}:{task.id}:{step}".encode()).hexdigest()
        if hasattr(self.sampler, "rng"):
            self.sampler.rng = random.Random(int(digest[:16], 16))
        pool = self.db.list(task.id) if self.db is not None else []
        # A kernel-form spec and a Python module are never shown for each other: neither answer could copy the other.
        pool = [e for e in pool if (candidate_form(e.code) == KERNEL) == (self.form == KERNEL)]
        return self.sampler.sample(pool, task_id=task.id) if pool else []

    def render(self, task: Task, exemplars: Sequence[Any]) -> list[dict[str, str]]:
        """The messages for `task` and its exemplars: CUDA-L1's contrastive prompt (a subclass may show other
        candidate formats, e.g. kernel recipes)."""
        return build_contrastive_prompt(task.source, exemplars, form=self.form, token_budget=self.token_budget,
                                        tokenizer=self.tokenizer)


def sampler_config(config: RLStageConfig) -> dict[str, Any]:
    """The exemplar sampler's settings from the stage config (`exemplar_sampler` names the sampler)."""
    if config.exemplar_sampler == "bucket":
        return {"n": config.exemplars_per_prompt, "bucket_width": config.bucket_width,
                "temperature": config.sampler_temperature, "scale": config.sampler_scale}
    if config.exemplar_sampler == "island":
        return {"n": config.exemplars_per_prompt, "num_islands": config.islands,
                "temperature": config.sampler_temperature, "migrate_every": config.island_migrate_every,
                "reset_every": config.island_reset_every, "scale": config.sampler_scale}
    return {"n": config.exemplars_per_prompt}


def placeholder_prompt(task: Task) -> list[dict[str, str]]:
    """What the dataset holds before the trainer builds the real prompt (never sent to the model)."""
    return [{"role": "user", "content": f"[contrastive prompt for {task.id} is built at generation time]"}]


def build_rl_dataset(tasks: Sequence[Task]) -> Any:
    """A `datasets.Dataset` with one row per task: `prompt` (placeholder) and `task_id`."""
    try:
        from datasets import Dataset
    except ImportError:
        raise MissingDependencyError("datasets", "train", "GRPO datasets") from None
    return Dataset.from_list([{"prompt": placeholder_prompt(t), "task_id": t.id} for t in tasks])


_TRAINER_CLASS: type | None = None


def contrastive_trainer_class() -> type:
    """`ContrastiveGRPOTrainer`, defined on first use so that importing this module does not import TRL."""
    global _TRAINER_CLASS
    if _TRAINER_CLASS is not None:
        return _TRAINER_CLASS
    try:
        from trl import GRPOTrainer
    except ImportError:
        raise MissingDependencyError("trl", "train", "GRPO training") from None
    if not hasattr(GRPOTrainer, "_generate_and_score_completions"):
        raise MissingDependencyError("trl (a version with GRPOTrainer._generate_and_score_completions, "
                                     "e.g. 0.14-1.16)", "train", "contrastive GRPO")

    class ContrastiveGRPOTrainer(GRPOTrainer):
        """GRPOTrainer whose prompts are rebuilt from the exemplar database just before each generation."""

        def __init__(self, *args: Any, prompt_builder: ContrastivePromptBuilder, tasks: Sequence[Task],
                     **kwargs: Any):
            super().__init__(*args, **kwargs)
            self.prompt_builder = prompt_builder
            self.tasks_by_id = {t.id: t for t in tasks}
            self.prompt_tokens_max = 0  # the longest prompt fed to the model (tokens)

        def _generate_and_score_completions(self, inputs: list[dict[str, Any]]) -> dict[str, Any]:
            step = int(self.state.global_step)
            built: dict[str, tuple[Any, list[dict[str, Any]]]] = {}
            rows = []
            for row in inputs:
                task_id = row["task_id"]
                if task_id not in built:  # one prompt per task per generation round: a group shares it
                    built[task_id] = built_prompt(self.prompt_builder, self.tasks_by_id[task_id], step)
                prompt, shown = built[task_id]
                rows.append({**row, "prompt": prompt, "shown_exemplars": shown})
            output = super()._generate_and_score_completions(rows)
            fed = check_prompts_whole([r["prompt"] for r in rows], output.get("prompt_mask"),
                                      self.processing_class, getattr(self, "chat_template_kwargs", None))
            self.prompt_tokens_max = max(self.prompt_tokens_max, max(fed, default=0))
            return output

    _TRAINER_CLASS = ContrastiveGRPOTrainer
    return ContrastiveGRPOTrainer


def built_prompt(builder: Any, task: Task, step: int) -> tuple[Any, list[dict[str, Any]]]:
    """(the prompt, the exemplars it shows as {"norm_hash", "score"}) from a prompt builder; a builder that does
    not say what it showed (no `last_exemplars`: a custom one) shows none."""
    prompt = builder.build(task, step)
    exemplars = getattr(builder, "last_exemplars", {}).get(task.id, [])
    return prompt, [{"norm_hash": str(e.meta.get("norm_hash") or normalized_hash(e.code)), "score": float(e.score)}
                    for e in exemplars]


def prompt_tokens(prompt: Any, tokenizer: Any, chat_template_kwargs: dict[str, Any] | None = None) -> int:
    """The tokens of a prompt as TRL tokenizes it: a chat prompt through the chat template (with the generation
    prompt), a string as it is."""
    if isinstance(prompt, str):
        return len(tokenizer(text=prompt)["input_ids"])
    text = tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True,
                                         **(chat_template_kwargs or {}))
    return len(tokenizer(text=text, add_special_tokens=False)["input_ids"])


#: Tokens by which a fed prompt may fall short of the built one before it counts as truncated (a special token
#: that one path adds and the other does not).
PROMPT_TOKEN_SLACK = 2


def check_prompts_whole(prompts: Sequence[Any], prompt_mask: Any, tokenizer: Any,
                        chat_template_kwargs: dict[str, Any] | None = None) -> list[int]:
    """The prompt tokens the trainer fed for each row (the mask's sums); `PromptTruncatedError` when one is
    shorter than its prompt (module docstring). Without a mask (a TRL that returns none) nothing is checked."""
    if prompt_mask is None:
        return []
    fed = [int(n) for n in prompt_mask.sum(dim=1).tolist()]
    lengths: dict[str, int] = {}
    for prompt, n in zip(prompts, fed, strict=True):
        key = prompt if isinstance(prompt, str) else repr(prompt)
        if key not in lengths:
            lengths[key] = prompt_tokens(prompt, tokenizer, chat_template_kwargs)
        if n + PROMPT_TOKEN_SLACK < lengths[key]:
            raise PromptTruncatedError(
                f"the trainer fed {n} of a prompt's {lengths[key]} tokens: the installed TRL truncates prompts "
                "(max_prompt_length); upgrade TRL (>= 0.26) or lower prompt_token_budget")
    return fed


def load_judge(spec: str) -> Judge | None:
    """A judge from 'module:factory' (the factory is called without arguments), or None for ''."""
    if not spec:
        return None
    module_name, _, attr = spec.partition(":")
    if not attr:
        raise ConfigError(f"judge must be 'module:factory', got {spec!r}")
    try:
        factory = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"cannot load judge {spec!r}: {exc}") from None
    judge = factory()
    if not isinstance(judge, Judge):
        raise ConfigError(f"judge {spec!r} has no check(task, source, result) method")
    return judge


def grpo_args(config: RLStageConfig, **extra: Any) -> Any:
    """TRL `GRPOConfig` for a stage config."""
    try:
        from trl import GRPOConfig
    except ImportError:
        raise MissingDependencyError("trl", "train", "GRPO training") from None
    fields = {f.name: f for f in dataclasses.fields(GRPOConfig)}
    values = {"num_generations": config.num_generations, "beta": config.beta, "epsilon": config.epsilon,
              "loss_type": config.loss_type, "scale_rewards": trl_scale_rewards(config.scale_rewards, fields),
              "num_iterations": config.num_iterations, "max_completion_length": config.max_completion_length,
              "mask_truncated_completions": config.mask_truncated_completions,
              "temperature": config.temperature, "top_p": config.top_p, "remove_unused_columns": False,
              "log_completions": False}
    if "max_prompt_length" in fields:  # TRL 0.20-0.25 keep the last 512 prompt tokens unless told (module doc)
        values["max_prompt_length"] = None
    if config.generation_batch_size:
        values["generation_batch_size"] = config.generation_batch_size
    values.update(vllm_args(config))
    values.update(extra)
    return make_training_args(GRPOConfig, config, **values)


def trl_scale_rewards(value: str, fields: dict[str, Any]) -> str | bool:
    """`scale_rewards` as the installed TRL reads it: TRL 0.20-0.21 take a boolean (group: True, none: False)."""
    field_ = fields.get("scale_rewards")
    if field_ is None or not isinstance(field_.default, bool):
        return value
    if value == "batch":
        raise ConfigError("scale_rewards=batch needs TRL >= 0.22 (this TRL scales per group or not at all)")
    return value == "group"


def vllm_available() -> bool:
    """Whether vLLM is importable here (its own dependency, not one of cudal1's extras)."""
    return importlib.util.find_spec("vllm") is not None


def vllm_args(config: RLStageConfig) -> dict[str, Any]:
    """TRL's vLLM settings for `config.vllm`: `auto` takes colocate where vLLM is installed and training runs
    on a GPU, else TRL's transformers generation; an explicit mode without vLLM is a clear error."""
    mode = config.vllm
    if mode == "auto":
        import torch

        mode = "colocate" if vllm_available() and not config.use_cpu and torch.cuda.is_available() else "transformers"
    if mode == "transformers":
        return {"use_vllm": False}
    if not vllm_available():
        raise ConfigError(f"vllm={mode} needs vLLM installed (pip install vllm, built for your torch); "
                          "or set vllm=transformers (TRL's own generation)")
    values: dict[str, Any] = {"use_vllm": True, "vllm_mode": mode}
    if mode == "colocate":
        values["vllm_gpu_memory_utilization"] = config.vllm_gpu_memory_utilization
    elif config.vllm_server_url:
        values["vllm_server_base_url"] = config.vllm_server_url
    return values


def _reference_path(model: Any, config: RLStageConfig, tokenizer: Any) -> None:
    """With beta > 0, TRL reloads the reference policy from `config._name_or_path`: make sure it exists. A
    local folder or the hub id the policy was loaded from is reloaded as it is (a 7B model is not copied)."""
    if config.beta <= 0 or config.use_lora:
        return
    name = getattr(model.config, "_name_or_path", "")
    hub_id = name == config.model and not name.startswith("scratch") and not Path(name).exists()
    if name and (Path(name).is_dir() or hub_id):
        return
    path = Path(config.output_dir) / "reference_policy"
    if is_main_process():
        save_policy(model, tokenizer, path)
    _wait_for_everyone()
    model.config._name_or_path = str(path)


def _wait_for_everyone() -> None:
    """A barrier across the processes of a multi-process run (a no-op alone)."""
    if world_size() > 1:
        from accelerate import PartialState

        PartialState().wait_for_everyone()


def run_score_context(config: RLStageConfig) -> str | None:
    """The score context (`exemplars.db.score_context`) of this run's evaluations when it is known before the
    first one: this machine's device and the evaluator's settings. Evaluated by a Ray pool or a reward server
    (another GPU, perhaps), None: the database then lists every context."""
    if config.workers not in ("", "local"):
        return None
    from cudal1.core.machine import describe_machine
    from cudal1.eval.config import resolve_device

    eval_config = config.eval_config()
    device = resolve_device(eval_config.device)
    return score_context({"environment": describe_machine(device),
                          "protocol": eval_config.resolved(device).protocol()})


def reward_config(config: RLStageConfig) -> RewardConfig:
    """How the stage's verdicts become rewards, from its config."""
    return RewardConfig(failure_rewards=config.failure_rewards, transform=config.reward_transform,
                        speedup_estimate=config.reward_speedup, bound=config.reward_bound,
                        log_floor=config.reward_log_floor, normalize=config.reward_normalize,
                        clip_k=config.reward_clip_k, scope=config.reward_scope, group_size=config.num_generations,
                        noise_floor=config.reward_noise_floor, copy_reward=config.exemplar_copy_reward,
                        copy_margin=config.exemplar_copy_margin,
                        judge_jump_factor=config.judge_jump_factor, judge_on_error=config.judge_on_error,
                        eval_threads=config.eval_threads)


def run_rl(config: RLStageConfig, *, model: Any = None, tokenizer: Any = None, tasks: Sequence[Task] | None = None,
           evaluator: EvaluateFn | None = None, judge: Judge | None = None, reward_funcs: list | None = None,
           callbacks: list | None = None, exemplar_db: Any = None,
           prompt_builder: ContrastivePromptBuilder | None = None) -> StageResult:
    """Stage 3 end to end: contrastive GRPO, final policy in `<output_dir>/final`, rewards in the summary.

    `evaluator` (default: the hardened evaluator with the config's settings), `reward_funcs` (default:
    one `KernelReward`) and `prompt_builder` (default: contrastive prompts from the exemplar database) can
    be replaced, e.g. by tests with a controlled reward or short prompts.
    """

    if evaluator is None and reward_funcs is None:
        check_evaluation_device(config)
    store = open_store(config.store)
    recorder = RunRecorder("grpo", config, store)
    tasks = resolve_tasks(config, tasks)
    if model is None or tokenizer is None:
        model, tokenizer = load_policy(config.model, config.tokenizer, seed=config.seed)
    args = grpo_args(config)  # first: its state also starts a multi-process run's process group
    _reference_path(model, config, tokenizer)
    db = exemplar_db or ExemplarDB(config.exemplar_db or Path(config.output_dir) / "exemplars.sqlite",
                                   max_per_task=config.max_exemplars_per_task, statistic=config.exemplar_statistic,
                                   context=run_score_context(config))
    if config.reward_normalize and config.scale_rewards != "none":
        logger.warning("scale_rewards=%s: TRL divides the smoothed rewards by their std again, which undoes the "
                       "clip to +-%g and the dead band (reward_noise_floor)", config.scale_rewards,
                       config.reward_clip_k)
    seeded = seed_exemplars(db, config, tasks, store)
    reward = made = None
    if reward_funcs is None:
        reward_cfg = reward_config(config)
        made = None if evaluator is not None else default_evaluator(config, store, recorder.run_id,
                                                                     label=f"grpo:{config.model}")
        evaluator = evaluator or made
        reward = KernelReward(tasks, evaluator, reward_cfg, exemplar_db=db,
                              judge=judge or load_judge(config.judge), model_name=config.model,
                              completion_log=CompletionLog.for_run(config, rank=process_rank()))
        reward_funcs = [reward]
    builder = prompt_builder or ContrastivePromptBuilder(
        db, sampler=config.exemplar_sampler, sampler_config=sampler_config(config), form=config.form,
        token_budget=config.prompt_token_budget, tokenizer=tokenizer, seed=config.seed)
    budget = time_budget_callback(config.time_budget_s)
    trainer = contrastive_trainer_class()(
        model=model, args=args, train_dataset=build_rl_dataset(tasks), processing_class=tokenizer,
        reward_funcs=reward_funcs, peft_config=lora_config(config), callbacks=[budget, *(callbacks or [])],
        prompt_builder=builder, tasks=tasks)
    try:
        trainer.train(resume_from_checkpoint=resolve_resume(config))
    finally:
        if made is not None:
            made.close()  # the pool or server client this stage started
    final = save_trained(trainer, tokenizer, Path(config.output_dir) / "final")
    history = list(trainer.state.log_history)
    rewards = [e["reward"] for e in history if "reward" in e]
    summary: dict[str, Any] = {"steps": trainer.state.global_step, "tasks": len(tasks),
                               # TRL's `reward` is after smoothing (about 0 whatever the policy does):
                               "smoothed_reward_first": rewards[0] if rewards else None,
                               "smoothed_reward_last": rewards[-1] if rewards else None,
                               "prompts_built": builder.built, "prompt_tokens_max": trainer.prompt_tokens_max,
                               "stopped_by_time_budget": budget.stopped_early,
                               "exemplars_seeded": seeded, "exemplars": {t.id: db.count(t.id) for t in tasks}}
    if reward is not None:
        raw = [b["raw_reward_mean"] for b in reward.history]
        summary.update(raw_reward_first=raw[0] if raw else None, raw_reward_last=raw[-1] if raw else None)
        summary["reward_batches"] = reward.history
        (Path(config.output_dir) / "reward_history.json").write_text(_json(reward.history))
    return recorder.finish(StageResult("rl", config.output_dir, str(final), history, summary))


def _json(value: Any) -> str:
    import json

    return json.dumps(value, indent=1, default=str)
