"""Typed configs of the three training stages, their YAML form and the CLI's `KEY=VALUE` overrides.

One `@dataclass` per stage (`SFTStageConfig`, `SelfSupervisedConfig`, `RLStageConfig`), all sharing
`CommonTrainConfig` (model, run directory, task split, optimisation, memory switches, logging, evaluator).
Each field's `metadata["help"]` is the one source of its documentation: `reference_yaml(cls)` renders the
documented defaults that ship as `cudal1/configs/<stage>.yaml`, and a test checks those files are current.

Loading: `load_config(cls, yaml_path, overrides)` reads the YAML (unknown keys are an error), applies the
overrides (`["learning_rate=1e-5", "use_lora=true"]`, values parsed as YAML scalars/lists), and builds the
dataclass, whose `__post_init__` raises `ConfigError` naming what to set for impossible combinations.
Required inputs that vary per run (`model`, `output_dir`) have no usable default.
"""

from __future__ import annotations

import dataclasses
import math
import os
import typing
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import yaml

from cudal1.core.errors import ConfigError
from cudal1.core.ranges import check_ranges
from cudal1.core.rewards import CORRECT_UNMEASURED, DEFAULT_NOISE_FLOOR, REWARD_TRANSFORMS, SPEEDUP_ESTIMATES
from cudal1.core.types import Status
from cudal1.eval.config import SANDBOX_MODES, EvalConfig, profile_choices, resolve_device
from cudal1.llm.prompts import FORM_CHOICES, resolve_form
from cudal1.policy.presets import policy_choices
from cudal1.service.evaluator import is_evaluator_spec

C = TypeVar("C")

SPLITS = ("train", "test", "all")
REPORT_TARGETS = ("tensorboard", "wandb", "none")


def _f(default: Any, help: str) -> Any:
    if isinstance(default, (list, dict)):
        return field(default_factory=lambda: type(default)(default), metadata={"help": help})
    return field(default=default, metadata={"help": help})


@dataclass
class CommonTrainConfig:
    """Fields every stage shares. Stage configs extend it."""

    model: str = _f("", "REQUIRED. Model to train: a local path or hub id, or 'scratch[:hidden=H,layers=L,heads=A,"
                        "intermediate=I,max_positions=P]' for a randomly initialised Llama with the byte tokenizer.")
    tokenizer: str = _f("", "Tokenizer path or id; empty: the model's own; 'byte': cudal1's byte-level tokenizer.")
    output_dir: str = _f("", "REQUIRED. Run directory: checkpoints, config.yaml, logs, TensorBoard events.")
    source: str = _f("builtin", "Task source (builtin, a KernelBench folder, hf:NAME, jsonl:PATH, FILE.py).")
    split: str = _f("train", "Which tasks to use: train, test or all (see splits_file).")
    splits_file: str = _f("", "JSON file of the train/test split; empty: <output_dir>/splits.json, created if "
                              "missing (deterministic from split_seed and test_fraction, stratified by level).")
    test_fraction: float = _f(0.2, "Fraction of each level's tasks held out for testing (new split files).")
    split_seed: int = _f(0, "Seed of the task split hash (new split files).")
    max_tasks: int = _f(0, "Use at most this many tasks of the split (0: all); for smoke runs.")
    form: str = _f("auto", "Candidate form asked for in prompts: auto (raw_cuda where rewards are "
                           "evaluated on a GPU or by workers, torch where on this machine's CPU; config.yaml "
                           "records the form it became), raw_cuda (NVRTC, builds in < 1 s), load_inline, "
                           "torch (PyTorch only) or kernel (CUDA source plus a JSON launch spec, no host "
                           "code; rewards need a GPU). augment and optimize resolve auto alike, so SFT data "
                           "and RL prompts agree.")
    learning_rate: float = _f(1e-5, "Peak learning rate (AdamW).")
    lr_scheduler_type: str = _f("cosine", "Learning-rate schedule (transformers names: linear, cosine, constant).")
    warmup_ratio: float = _f(0.03, "Fraction of steps spent warming the learning rate up.")
    weight_decay: float = _f(0.0, "AdamW weight decay.")
    max_grad_norm: float = _f(1.0, "Gradient clipping norm.")
    num_train_epochs: float = _f(1.0, "Epochs over the stage's data (ignored when max_steps > 0).")
    max_steps: int = _f(-1, "Optimizer steps; -1: from num_train_epochs.")
    per_device_train_batch_size: int = _f(1, "Sequences per device per micro-batch.")
    gradient_accumulation_steps: int = _f(8, "Micro-batches per optimizer step.")
    seed: int = _f(42, "Seed of data order, sampling and initialisation.")
    bf16: bool = _f(False, "Train in bfloat16 mixed precision (recommended on H100/H200).")
    use_lora: bool = _f(False, "Train LoRA adapters (peft) instead of all weights: far less GPU memory.")
    lora_r: int = _f(16, "LoRA rank (use_lora).")
    lora_alpha: int = _f(32, "LoRA scaling alpha (use_lora).")
    lora_dropout: float = _f(0.05, "LoRA dropout (use_lora).")
    lora_target_modules: list = _f(["all-linear"], "Modules that get adapters (peft names; 'all-linear').")
    gradient_checkpointing: bool = _f(False, "Recompute activations in the backward pass: less memory, ~30% slower.")
    use_cpu: bool = _f(False, "Train on the CPU even when a GPU is visible (tests, debugging).")
    logging_steps: int = _f(1, "Log metrics every this many optimizer steps.")
    save_steps: int = _f(50, "Save a checkpoint every this many optimizer steps.")
    save_total_limit: int = _f(3, "Keep at most this many checkpoints (oldest deleted).")
    report_to: str = _f("tensorboard", "Metric sinks: tensorboard, wandb, 'tensorboard,wandb' or none.")
    resume_from_checkpoint: str = _f("", "Resume: a checkpoint directory, 'latest' (newest in output_dir) or empty.")
    time_budget_s: float = _f(0.0, "Stop the stage cleanly after this many seconds (0: no limit).")
    store: str = _f("", "Results store path; empty: the default store; 'none': do not use one.")
    eval_device: str = _f("auto", "Evaluator device: auto, cuda, cuda:N or cpu.")
    eval_profile: str = _f("strict", f"Evaluator correctness profile: {profile_choices(typed=True)}.")
    eval_trials: int = _f(5, "Evaluator correctness trials, each with fresh random inputs and a new seed.")
    eval_sizes: str = _f("auto", "Evaluator problem sizes: full, small or auto (small on cpu).")
    eval_timeout_s: float = _f(600.0, "Evaluator wall-clock limit of one whole evaluation (build time excluded).")
    eval_sandbox: str = _f("auto", "Evaluator OS sandbox: auto (the best of this host; the strict profile refuses "
                                   "to run without one), required, or none (an opt-out recorded in every result).")
    eval_buckets: int = _f(7, "Evaluator timing buckets (speedup = median of bucket speedups).")
    eval_policy: str = _f("", f"Verdict policy of the rewards: {policy_choices()}; empty: the profile's; a "
                              "violation earns the policy's violation_reward, else failure_rewards.hack_detected.")
    # `threads`, not `workers`: the calling threads of one evaluator; `workers` below names its pool.
    eval_threads: int = _f(4, "Candidates evaluated in parallel (each in its own isolated process).")
    workers: str = _f("", "Where rewards are evaluated: empty (this process; one timed evaluation per device at "
                          "a time), local (a pool: one slot per GPU), ray:auto or ray://HOST:PORT (a Ray pool), "
                          "or http(s)://HOST:PORT (a reward server; token from $CUDAL1_SERVER_TOKEN).")

    #: Numeric ranges (core.ranges), merged along the class hierarchy; every float must also be finite.
    RANGES: ClassVar[dict[str, str]] = {
        "test_fraction": "[0, 1)", "max_tasks": ">= 0", "learning_rate": "> 0", "warmup_ratio": "[0, 1]",
        "weight_decay": ">= 0", "max_grad_norm": ">= 0", "num_train_epochs": ">= 0", "seed": "[0, 4294967295]",
        "per_device_train_batch_size": ">= 1", "gradient_accumulation_steps": ">= 1", "lora_dropout": "[0, 1)",
        "logging_steps": ">= 1", "save_steps": ">= 1", "save_total_limit": ">= 1", "time_budget_s": ">= 0",
        "eval_trials": ">= 1", "eval_timeout_s": "> 0", "eval_buckets": ">= 1", "eval_threads": ">= 1"}

    def __post_init__(self) -> None:
        self._check_common()

    def ranges(self) -> dict[str, str]:
        """This stage's numeric ranges: its class's `RANGES` over its bases'."""
        return {k: v for cls in reversed(type(self).__mro__) for k, v in vars(cls).get("RANGES", {}).items()}

    def _check_common(self) -> None:
        check_ranges(self, self.ranges())
        if not self.model:
            raise ConfigError("set model: a path, a hub id or 'scratch' (e.g. --model scratch)")
        if not self.output_dir:
            raise ConfigError("set output_dir: the run directory (e.g. --output-dir runs/sft)")
        if Path(self.output_dir).exists() and not Path(self.output_dir).is_dir():
            raise ConfigError(f"output_dir {self.output_dir} is a file, not a folder: give a run directory")
        if self.split not in SPLITS:
            raise ConfigError(f"split must be one of {', '.join(SPLITS)}, not {self.split!r}")
        if not 0.0 <= self.test_fraction < 1.0:
            raise ConfigError(f"test_fraction must be in [0, 1), got {self.test_fraction}")
        if self.form not in FORM_CHOICES:
            raise ConfigError(f"form must be one of {', '.join(FORM_CHOICES)}, not {self.form!r}")
        if self.use_lora and self.lora_r <= 0:
            raise ConfigError(f"use_lora needs lora_r >= 1 (got {self.lora_r}); or set use_lora=false")
        if self.use_lora and self.lora_alpha <= 0:
            raise ConfigError(f"use_lora needs lora_alpha >= 1 (got {self.lora_alpha})")
        if self.learning_rate <= 0:
            raise ConfigError(f"learning_rate must be > 0, got {self.learning_rate}")
        if self.per_device_train_batch_size < 1 or self.gradient_accumulation_steps < 1:
            raise ConfigError("per_device_train_batch_size and gradient_accumulation_steps must be >= 1")
        if self.max_steps == 0 or self.max_steps < -1:
            raise ConfigError(f"max_steps must be -1 (use num_train_epochs) or >= 1, got {self.max_steps}")
        if self.max_steps == -1 and self.num_train_epochs <= 0:
            raise ConfigError("with max_steps=-1 set num_train_epochs > 0")
        targets = [t.strip() for t in self.report_to.split(",") if t.strip()]
        if not targets or any(t not in REPORT_TARGETS for t in targets) or ("none" in targets and len(targets) > 1):
            raise ConfigError(f"report_to must be tensorboard, wandb, both comma-separated, or none; "
                              f"got {self.report_to!r}")
        if self.eval_sandbox not in SANDBOX_MODES:
            raise ConfigError(f"eval_sandbox must be one of {', '.join(SANDBOX_MODES)}, not {self.eval_sandbox!r}")
        if self.eval_threads < 1:
            raise ConfigError(f"eval_threads must be >= 1, got {self.eval_threads}")
        if self.time_budget_s < 0:
            raise ConfigError("time_budget_s must be >= 0 (0: no limit)")
        self.eval_config()  # fail early on bad evaluator settings
        if not is_evaluator_spec(self.workers):
            raise ConfigError(f"workers must be empty, local, ray:auto, ray://HOST:PORT or http(s)://HOST:PORT, "
                              f"not {self.workers!r}")
        if self.form == "auto":  # the form that runs where the rewards are computed (so in config.yaml)
            self.form = resolve_form("auto", self._evaluation_device())

    def _evaluation_device(self) -> str:
        """Where candidates are evaluated: `remote` for a Ray pool or a reward server, else this machine's
        evaluator device (a local pool's slots run on it too)."""
        if self.workers and self.workers != "local":
            return "remote"
        return resolve_device("auto") if self.eval_device == "auto" else self.eval_device

    def eval_config(self) -> EvalConfig:
        """The evaluator settings of this run as an `EvalConfig`. In a multi-process run (accelerate, torchrun)
        an unnumbered GPU device means the rank's own GPU (`LOCAL_RANK`), so that the ranks do not all time
        their candidates on GPU 0."""
        return EvalConfig(device=rank_device(self.eval_device), profile=self.eval_profile,
                          correctness_trials=self.eval_trials,
                          sizes=self.eval_sizes, timeout_s=self.eval_timeout_s, buckets=self.eval_buckets,
                          policy=self.eval_policy, sandbox=self.eval_sandbox)

    @property
    def report_targets(self) -> list[str]:
        """`report_to` as the list transformers expects (["none"] when disabled)."""
        return [t.strip() for t in self.report_to.split(",") if t.strip()]

    def to_dict(self) -> dict[str, Any]:
        """Plain dict of every field (the resolved config written into the run directory)."""
        return dataclasses.asdict(self)


def rank_device(device: str) -> str:
    """`device` for this process: `cuda` (or `auto` on a GPU machine) becomes `cuda:LOCAL_RANK` when a launcher
    set LOCAL_RANK; a numbered device or the CPU stays as it is."""
    rank = os.environ.get("LOCAL_RANK", "")
    if not rank.isdigit() or device not in ("cuda", "auto"):
        return device
    if device == "auto" and resolve_device("auto") == "cpu":
        return device
    return f"cuda:{rank}"


@dataclass
class SFTStageConfig(CommonTrainConfig):
    """Stage 1: supervised fine-tuning on executable, correct candidates (the `cudal1 augment` export)."""

    dataset: str = _f("", "REQUIRED. JSONL of training examples: rows with `messages`, or `prompt` + `completion`, "
                          "or `task_id` + `code` (prompt built from the task's reference).")
    eval_fraction: float = _f(0.05, "Fraction of examples held out for the evaluation loss (by hash of the row).")
    eval_steps: int = _f(50, "Compute the evaluation loss every this many steps (0: only at the end).")
    max_length: int = _f(8192, "Longest tokenized example (prompt + completion); longer ones are truncated.")
    completion_only_loss: bool = _f(True, "Compute the loss on the completion only (not on the prompt).")
    packing: bool = _f(False, "Pack several examples into one sequence.")
    num_train_epochs: float = _f(3.0, "Epochs over the data (ignored when max_steps > 0).")
    learning_rate: float = _f(2e-5, "Peak learning rate (AdamW).")
    contrastive_fraction: float = _f(0.875, "Share of the examples with a score (the augment export's speedup) "
                                            "shown with stage 3's contrastive prompt: lower-scored examples of the "
                                            "same task as exemplars, the answer in three sections. The default is the "
                                            "contrastive study's: its policy learns from 7 of 8 examples in that "
                                            "format and then reads the scores it is shown (docs/log.md, 2026-12-07). "
                                            "0: plain prompts only.")
    exemplars_per_prompt: int = _f(2, "Contrastive examples: exemplars shown per prompt (the paper: N = 2).")

    RANGES: ClassVar[dict[str, str]] = {"eval_fraction": "[0, 1)", "eval_steps": ">= 0", "max_length": ">= 16",
                                        "contrastive_fraction": "[0, 1]", "exemplars_per_prompt": ">= 1"}

    def __post_init__(self) -> None:
        self._check_common()
        if not 0.0 <= self.contrastive_fraction <= 1.0 or self.exemplars_per_prompt < 1:
            raise ConfigError("need contrastive_fraction in [0, 1] and exemplars_per_prompt >= 1")
        if not self.dataset:
            raise ConfigError("set dataset: the JSONL that `cudal1 augment` exported (e.g. --dataset sft.jsonl)")
        if not 0.0 <= self.eval_fraction < 1.0:
            raise ConfigError(f"eval_fraction must be in [0, 1), got {self.eval_fraction}")
        if self.max_length < 16:
            raise ConfigError(f"max_length must be >= 16, got {self.max_length}")


def _check_sampling(temperature: float, top_p: float, greedy_ok: bool) -> None:
    """Sampling settings a stage would otherwise reject only after the stages before it have run (GRPO
    divides the logits by the temperature: no greedy decoding there)."""
    if temperature < 0 or (temperature == 0 and not greedy_ok):
        raise ConfigError(f"temperature must be {'>= 0' if greedy_ok else '> 0'}, got {temperature}")
    if not 0.0 < top_p <= 1.0:
        raise ConfigError(f"top_p must be in (0, 1], got {top_p}")


@dataclass
class SelfSupervisedConfig(CommonTrainConfig):
    """Stage 2: rounds of sample -> evaluate -> keep successes -> fine-tune (REINFORCE with a 0/1 reward)."""

    rounds: int = _f(3, "Maximum number of rounds.")
    samples_per_task: int = _f(8, "Completions sampled per task per round.")
    temperature: float = _f(1.0, "Sampling temperature.")
    top_p: float = _f(1.0, "Nucleus sampling mass.")
    max_new_tokens: int = _f(4096, "Longest completion sampled.")
    generation_batch_size: int = _f(8, "Prompts per generation batch.")
    max_kept_per_task: int = _f(2, "Successes kept per task per round (fastest first), like the paper's 2 per model.")
    accumulate: bool = _f(False, "Fine-tune each round on the successes of all rounds so far (not only this one).")
    target_success_rate: float = _f(0.0, "Stop when a round's sample success rate reaches this (0: never).")
    patience: int = _f(0, "Stop after this many rounds without the success rate improving by min_improvement "
                          "(0: never).")
    min_improvement: float = _f(0.01, "Improvement of the success rate that resets the patience counter.")
    exemplar_db: str = _f("auto", "Add every correct candidate, with each evaluation's speedup, to this exemplar "
                                  "database: auto is <output_dir>/exemplars.sqlite, which stage 3 started from this "
                                  "stage's policy (<output_dir>/final) seeds its own database from; none: don't.")
    log_completions: bool = _f(True, "Write every sampled completion, with its verdict and whether it was "
                                     "kept, to <output_dir>/completions.jsonl (one JSON line each; see "
                                     "cudal1/train/completions.py); false: write none.")
    max_length: int = _f(8192, "Longest tokenized fine-tuning example.")
    learning_rate: float = _f(1e-5, "Peak learning rate of each round's fine-tuning.")

    RANGES: ClassVar[dict[str, str]] = {
        "rounds": ">= 1", "samples_per_task": ">= 1", "temperature": ">= 0", "top_p": "(0, 1]",
        "max_new_tokens": ">= 1", "generation_batch_size": ">= 1", "max_kept_per_task": ">= 1",
        "target_success_rate": "[0, 1]", "patience": ">= 0", "min_improvement": ">= 0", "max_length": ">= 16"}

    def __post_init__(self) -> None:
        self._check_common()
        if self.rounds < 1 or self.samples_per_task < 1 or self.max_kept_per_task < 1:
            raise ConfigError("rounds, samples_per_task and max_kept_per_task must be >= 1")
        if self.max_new_tokens < 1 or self.generation_batch_size < 1:
            raise ConfigError("max_new_tokens and generation_batch_size must be >= 1")
        if not 0.0 <= self.target_success_rate <= 1.0:
            raise ConfigError(f"target_success_rate must be in [0, 1], got {self.target_success_rate}")
        _check_sampling(self.temperature, self.top_p, greedy_ok=True)
        if self.patience < 0:
            raise ConfigError("patience must be >= 0 (0: never stop early)")


#: Raw reward of each failure status, and of a correct candidate without a usable (finite) speedup.
DEFAULT_FAILURE_REWARDS = {**{s.value: 0.0 for s in Status if s.is_verdict and s is not Status.CORRECT},
                           CORRECT_UNMEASURED: 0.0}


#: How stage 3 generates (`RLStageConfig.vllm`).
VLLM_MODES = ("auto", "colocate", "server", "transformers")


@dataclass
class RLStageConfig(CommonTrainConfig):
    """Stage 3: contrastive GRPO (TRL `GRPOTrainer`) with rewards from the hardened evaluator."""

    num_generations: int = _f(8, "Group size G: completions per prompt. Not published; our default.")
    generation_batch_size: int = _f(0, "Completions generated per generation round (a multiple of "
                                       "num_generations); 0: per_device_train_batch_size x gradient_accumulation_steps.")
    beta: float = _f(0.01, "KL weight to the reference (initial) policy. Not published; our default.")
    epsilon: float = _f(0.2, "PPO-style clip of the probability ratio (1 +/- epsilon).")
    loss_type: str = _f("grpo", "TRL loss aggregation: grpo (the paper's), dapo, dr_grpo, bnpo.")
    scale_rewards: str = _f("none", "TRL's advantage scaling after the reward smoothing: none (the default: TRL "
                                    "only subtracts the group mean, so the smoothing's clip and dead band hold), "
                                    "group (divide again by the group's std: undoes them; measured in docs/log.md, "
                                    "2026-12-07) or batch.")
    mask_truncated_completions: bool = _f(True, "Leave completions cut at max_completion_length out of the loss "
                                                "(TRL's mask_truncated_completions): an answer cut short is no "
                                                "evidence against what it was writing.")
    num_iterations: int = _f(1, "Optimisation passes over each generated batch (mu).")
    max_completion_length: int = _f(4096, "Longest completion (analysis + design + code need thousands).")
    temperature: float = _f(1.0, "Sampling temperature during training.")
    top_p: float = _f(1.0, "Nucleus sampling mass during training.")
    learning_rate: float = _f(1e-6, "Peak learning rate. Not published; our default.")
    max_steps: int = _f(200, "GRPO optimizer steps.")
    failure_rewards: dict = _f(DEFAULT_FAILURE_REWARDS, "Raw reward of each failure status (correct candidates earn "
                                                       "their speedup). The paper: 0 for every failure.")
    reward_transform: str = _f("speedup", "Raw reward -> reward before smoothing: speedup (as it is, the paper's), "
                                          "log (ln of max(raw, reward_log_floor): relative gains count the same at "
                                          "every speed) or bounded (clipped to [0, reward_bound], Dr.Kernel's).")
    reward_speedup: str = _f("point", "Speedup a correct candidate earns: point (the evaluator's) or lower (the "
                                      "low end of its 95 % interval: a gain the measurement's spread cannot "
                                      "tell from noise earns about 1x).")
    reward_bound: float = _f(3.0, "reward_transform=bounded: the cap on a reward (Dr.Kernel: 3).")
    reward_log_floor: float = _f(0.1, "reward_transform=log: rewards below this (a failure's 0) are taken as this.")
    reward_normalize: bool = _f(True, "Reward smoothing: normalize rewards (mean/std), then clip them to "
                                      "[-reward_clip_k, reward_clip_k]; off: rewards pass unnormalized and unclipped.")
    reward_clip_k: float = _f(1.5, "Reward smoothing: clip normalized rewards to [-k, k] (the paper: k = 1.5); not "
                                   "applied without reward_normalize.")
    reward_noise_floor: float = _f(DEFAULT_NOISE_FLOOR, "Reward smoothing's dead band: a group is divided by max(std, "
                                                        "this x its mean reward) (reward_transform=log: by max(std, "
                                                        "this)), so candidates within measurement noise of each other "
                                                        "get small advantages, not +-1; 0: plain standardisation. "
                                                        "The default is measured (docs/log.md, 2026-12-07).")
    exemplar_copy_reward: str = _f("margin", "What a correct copy of an exemplar shown in its prompt (same "
                                             "normalised source, norm_hash) earns: margin (the exemplar's score less "
                                             "exemplar_copy_margin of it), zero, or full (as evaluated: copying pays "
                                             "what the exemplar did). Copies are flagged in completions.jsonl "
                                             "(exemplar_copy) and the metrics (kernel/exemplar_copies).")
    exemplar_copy_margin: float = _f(0.05, "exemplar_copy_reward=margin: the share of the exemplar's score a copy does "
                                           "not earn.")
    reward_scope: str = _f("group", "Normalization scope of the smoothing: group (each prompt's num_generations "
                                    "completions on their own, so one task's large speedups do not compress "
                                    "another's) or batch.")
    exemplar_db: str = _f("", "Exemplar database (SQLite); empty: <output_dir>/exemplars.sqlite.")
    exemplar_seed: str = _f("auto", "Exemplars the database starts with, for tasks it has none of: auto is the "
                                    "exemplars.sqlite beside the model's folder (stage 2 writes <output_dir>/final "
                                    "and <output_dir>/exemplars.sqlite) when there is one; a path: that database; "
                                    "none: start empty (the first prompts then say 'None yet').")
    exemplar_seed_store: bool = _f(False, "Also seed each task, where the database has none of it, from the results "
                                          "store's correct candidates of that task version (each scored by the "
                                          "median of its stored evaluations).")
    exemplar_sampler: str = _f("bucket", "Exemplar selection for contrastive prompts: bucket, island or random.")
    log_completions: bool = _f(True, "Write every sampled completion, with its verdict and reward, to "
                                     "<output_dir>/completions.jsonl (one JSON line each; see "
                                     "cudal1/train/completions.py); false: write none.")
    exemplars_per_prompt: int = _f(2, "Exemplars shown per prompt (the paper: N = 2).")
    sampler_scale: str = _f("log", "Units the samplers read scores, bucket_width and sampler_temperature in: log "
                                   "(ln of the speedup: relative, a 10 % gain weighs the same at 1x and at 10x) or "
                                   "linear (speedup units, as the paper writes them).")
    bucket_width: float = _f(0.1, "Score bucket width of the bucket sampler, in sampler_scale units (log: 0.1 is a "
                                  "10.5 % bucket). Not published.")
    sampler_temperature: float = _f(0.7, "Softmax temperature tau over bucket means (bucket sampler) or over "
                                         "scores within an island (island sampler), in sampler_scale units (log: "
                                         "0.7, about ln 2: a bucket twice as fast weighs e = 2.7 times more). "
                                         "Not published.")
    islands: int = _f(4, "Island sampler: number of islands K (a code's island is its hash modulo K).")
    island_migrate_every: int = _f(16, "Island sampler: every M new codes the best of a random island is copied "
                                       "into the worst one; 0: no migration.")
    island_reset_every: int = _f(0, "Island sampler: every R new codes the worst half of the islands is reseeded "
                                    "from the survivors (FunSearch's reset); 0: no resets.")
    max_exemplars_per_task: int = _f(256, "Exemplar database size per task; lowest scores evicted first.")
    exemplar_statistic: str = _f("median", "An exemplar's score from every evaluation of its source: median (robust "
                                           "to evaluation noise), mean, or max (a winner's curse: scores drift up "
                                           "each time a source is evaluated again).")
    prompt_token_budget: int = _f(16384, "Prompt token budget; exemplars are trimmed to fit.")
    vllm: str = _f("auto", "Generation through vLLM (TRL's use_vllm): auto (colocate where vllm is installed and a "
                           "GPU is used, else the transformers path), colocate, server (a `trl vllm-serve` at "
                           "vllm_server_url) or transformers (no vLLM).")
    vllm_server_url: str = _f("", "vllm=server: base URL of the `trl vllm-serve` server; empty: TRL's default "
                                  "(http://127.0.0.1:8000).")
    vllm_gpu_memory_utilization: float = _f(0.3, "vllm=colocate: share of the GPU's memory vLLM takes beside training.")
    judge: str = _f("", "LLM judge for suspicious reward jumps (an import path 'module:factory'); empty: none.")
    judge_jump_factor: float = _f(3.0, "Ask the judge when a speedup exceeds this factor x the task's best so far "
                                       "(the paper re-checks results above 3x).")
    judge_on_error: str = _f("closed", "When the judge raises or gives no verdict: closed (the candidate is flagged, "
                                       "kept out of the exemplar database and paid at most the task's best verified "
                                       "speedup, or INFRA_ERROR's reward when there is none) or open (keep the "
                                       "evaluator's verdict).")

    RANGES: ClassVar[dict[str, str]] = {
        "num_generations": ">= 2", "generation_batch_size": ">= 0", "beta": ">= 0", "epsilon": "> 0",
        "num_iterations": ">= 1", "max_completion_length": ">= 1", "temperature": "> 0", "top_p": "(0, 1]",
        "reward_bound": "> 0", "reward_log_floor": "> 0", "reward_clip_k": "> 0", "exemplars_per_prompt": ">= 1",
        "bucket_width": "> 0", "sampler_temperature": "> 0", "islands": ">= 1", "island_migrate_every": ">= 0",
        "island_reset_every": ">= 0", "max_exemplars_per_task": ">= 1", "prompt_token_budget": ">= 1",
        "vllm_gpu_memory_utilization": "(0, 1)", "judge_jump_factor": "> 1"}

    def __post_init__(self) -> None:
        self._check_common()
        if self.num_generations < 2:
            raise ConfigError(f"num_generations must be >= 2 (GRPO needs a group), got {self.num_generations}")
        _check_sampling(self.temperature, self.top_p, greedy_ok=False)
        gen = self.generation_batch_size or self.per_device_train_batch_size * self.gradient_accumulation_steps
        if gen % self.num_generations != 0:
            raise ConfigError(f"the generation batch ({gen} completions) must be a multiple of num_generations "
                              f"({self.num_generations}): set generation_batch_size or gradient_accumulation_steps")
        if self.generation_batch_size and self.generation_batch_size % self.per_device_train_batch_size != 0:
            raise ConfigError("generation_batch_size must be a multiple of per_device_train_batch_size")
        if self.reward_clip_k <= 0:
            raise ConfigError(f"reward_clip_k must be > 0, got {self.reward_clip_k}")
        if self.reward_scope not in ("batch", "group"):
            raise ConfigError(f"reward_scope must be batch or group, not {self.reward_scope!r}")
        if self.reward_speedup not in SPEEDUP_ESTIMATES:
            raise ConfigError(f"reward_speedup must be one of {', '.join(SPEEDUP_ESTIMATES)}, "
                              f"not {self.reward_speedup!r}")
        if self.reward_transform not in REWARD_TRANSFORMS:
            raise ConfigError(f"reward_transform must be one of {', '.join(REWARD_TRANSFORMS)}, "
                              f"not {self.reward_transform!r}")
        if self.reward_bound <= 0 or self.reward_log_floor <= 0:
            raise ConfigError("reward_bound and reward_log_floor must be > 0")
        if self.beta < 0 or self.epsilon <= 0:
            raise ConfigError("need beta >= 0 and epsilon > 0")
        if self.loss_type not in ("grpo", "dapo", "dr_grpo", "bnpo"):
            raise ConfigError(f"loss_type must be grpo, dapo, dr_grpo or bnpo, not {self.loss_type!r}")
        if self.scale_rewards not in ("group", "batch", "none"):
            raise ConfigError(f"scale_rewards must be group, batch or none, not {self.scale_rewards!r}")
        if self.vllm not in VLLM_MODES:
            raise ConfigError(f"vllm must be one of {', '.join(VLLM_MODES)}, not {self.vllm!r}")
        if not 0 < self.vllm_gpu_memory_utilization < 1:
            raise ConfigError(f"vllm_gpu_memory_utilization must be in (0, 1), got {self.vllm_gpu_memory_utilization}")
        unknown = set(self.failure_rewards) - set(DEFAULT_FAILURE_REWARDS)
        if unknown:
            raise ConfigError(f"failure_rewards has unknown statuses {sorted(unknown)}; "
                              f"known: {sorted(DEFAULT_FAILURE_REWARDS)}")
        bad = {k: v for k, v in self.failure_rewards.items()
               if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v)}
        if bad:
            raise ConfigError(f"failure_rewards must map statuses to finite numbers; got {bad}")
        self.failure_rewards = {**DEFAULT_FAILURE_REWARDS, **{k: float(v) for k, v in self.failure_rewards.items()}}
        if self.exemplar_sampler not in ("bucket", "island", "random"):
            raise ConfigError(f"exemplar_sampler must be bucket, island or random, not {self.exemplar_sampler!r}")
        if self.exemplar_statistic not in ("median", "mean", "max"):
            raise ConfigError(f"exemplar_statistic must be median, mean or max, not {self.exemplar_statistic!r}")
        if self.exemplar_copy_reward not in ("margin", "zero", "full"):
            raise ConfigError(f"exemplar_copy_reward must be margin, zero or full, not {self.exemplar_copy_reward!r}")
        if not 0.0 <= self.exemplar_copy_margin <= 1.0:
            raise ConfigError(f"exemplar_copy_margin must be in [0, 1], got {self.exemplar_copy_margin}")
        if self.reward_noise_floor < 0:
            raise ConfigError(f"reward_noise_floor must be >= 0 (0: no dead band), got {self.reward_noise_floor}")
        if self.sampler_scale not in ("log", "linear"):
            raise ConfigError(f"sampler_scale must be log or linear, not {self.sampler_scale!r}")
        if self.exemplars_per_prompt < 1 or self.bucket_width <= 0 or self.sampler_temperature <= 0:
            raise ConfigError("need exemplars_per_prompt >= 1, bucket_width > 0 and sampler_temperature > 0")
        if self.islands < 1 or self.island_migrate_every < 0 or self.island_reset_every < 0:
            raise ConfigError("need islands >= 1, island_migrate_every >= 0 and island_reset_every >= 0")
        if self.judge_on_error not in ("closed", "open"):
            raise ConfigError(f"judge_on_error must be closed or open, not {self.judge_on_error!r}")
        if self.judge_jump_factor <= 1.0:
            raise ConfigError(f"judge_jump_factor must be > 1, got {self.judge_jump_factor}")
        if self.max_steps < 1:
            raise ConfigError("max_steps must be >= 1 for GRPO (its data is an endless stream of task prompts)")

    @property
    def resolved_generation_batch_size(self) -> int:
        return self.generation_batch_size or self.per_device_train_batch_size * self.gradient_accumulation_steps


STAGES: dict[str, type] = {"sft": SFTStageConfig, "self_supervised": SelfSupervisedConfig, "rl": RLStageConfig}


def _coerce(name: str, value: Any, annotation: Any) -> Any:
    """Check/convert a YAML or CLI value to a field's declared type; `ConfigError` names the field."""
    kind = annotation if isinstance(annotation, type) else None
    if kind is None:
        return value
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if kind in (float, int) and isinstance(value, str):  # YAML 1.1 reads 3e-5 (no dot) as a string
        try:
            return kind(value)
        except ValueError:
            raise ConfigError(f"{name} must be {kind.__name__}, got {value!r}") from None
    if kind is list and isinstance(value, str):
        return [v.strip() for v in value.split(",") if v.strip()]
    if kind is str and isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise ConfigError(f"{name} must be {kind.__name__}, got {value!r}")
    return value


def parse_overrides(items: list[str] | None) -> dict[str, Any]:
    """`["a=1", "b=x,y"]` -> {"a": 1, "b": "x,y"}; values parsed as YAML scalars (true, 1e-5, [1, 2])."""
    out: dict[str, Any] = {}
    for item in items or []:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"override {item!r} is not KEY=VALUE")
        try:
            out[key.strip().replace("-", "_")] = yaml.safe_load(raw) if raw.strip() else ""
        except yaml.YAMLError:
            out[key.strip().replace("-", "_")] = raw
    return out


def build_config(cls: type[C], values: dict[str, Any]) -> C:
    """Build `cls` from a dict, rejecting unknown keys and wrongly typed values."""
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(values) - set(fields))
    if unknown:
        raise ConfigError(f"unknown {cls.__name__} settings: {', '.join(unknown)} "
                          f"(see `cudal1 train <stage> --print-config`)")
    hints = typing.get_type_hints(cls)
    coerced = {k: _coerce(k, v, hints.get(k, fields[k].type)) for k, v in values.items() if v is not None}
    return cls(**coerced)


#: Settings renamed since they were first written (old key -> new key): older YAML files and overrides
#: still load, with a warning.
RENAMED_SETTINGS = {"eval_workers": "eval_threads"}


def renamed_settings(values: dict[str, Any]) -> dict[str, Any]:
    """`values` with every renamed key under its new name, warning once per key; `ConfigError` when both the
    old and the new name are given."""
    out = dict(values)
    for old, new in RENAMED_SETTINGS.items():
        if old not in out:
            continue
        if new in out:
            raise ConfigError(f"{old} and {new} are the same setting ({old} is its old name): give only {new}")
        # FutureWarning, not DeprecationWarning: the reader is the user of a command, and Python hides
        # DeprecationWarning outside __main__.
        warnings.warn(f"the setting {old} is now called {new}; {old} will stop working in a later release",
                      FutureWarning, stacklevel=3)
        out[new] = out.pop(old)
    return out


def load_config(cls: type[C], path: str | Path | None = None, overrides: list[str] | dict[str, Any] | None = None) -> C:
    """YAML file (optional) + overrides (CLI `KEY=VALUE` strings or a dict) -> a validated config."""
    values: dict[str, Any] = {}
    if path:
        try:
            loaded = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
            raise ConfigError(f"cannot read config {path}: {' '.join(str(exc).split())}") from None
        if loaded is None:  # it used to train on the defaults without a word
            raise ConfigError(f"config {path} is empty (no settings): give it settings (--print-config lists them), "
                              "or leave --config out to train on the defaults")
        if not isinstance(loaded, dict):
            raise ConfigError(f"config {path} must be a mapping of settings, not a {type(loaded).__name__}")
        values.update(loaded)
    values.update(overrides if isinstance(overrides, dict) else parse_overrides(overrides))
    return build_config(cls, renamed_settings(values))


def reference_yaml(cls: type) -> str:
    """The documented defaults of a stage config as YAML, each field preceded by its help as a comment."""
    lines = [f"# {cls.__name__}: {(cls.__doc__ or '').strip().splitlines()[0]}",
             "# Generated from cudal1/train/config.py (reference_yaml); edit the dataclass, not this file.", ""]
    for f in dataclasses.fields(cls):
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        lines.append(f"# {f.metadata.get('help', '')}")
        if isinstance(default, (list, dict)):
            flow = yaml.safe_dump(default, default_flow_style=True, sort_keys=False, width=1000)
            lines.append(f"{f.name}: {flow.strip()}")
        else:
            lines.append(yaml.safe_dump({f.name: default}, default_flow_style=False, width=1000).rstrip())
    return "\n".join(lines) + "\n"


def write_resolved_config(config: Any, run_dir: str | Path) -> Path:
    """Write the fully resolved config into `run_dir/config.yaml` and return the path."""
    path = Path(run_dir) / "config.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {"stage": type(config).__name__, **dataclasses.asdict(config)}
    path.write_text(yaml.safe_dump(data, sort_keys=False, width=1000))
    return path
