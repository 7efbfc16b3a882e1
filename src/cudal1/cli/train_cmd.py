"""`cudal1 train sft|self-supervised|rl`: load a stage's YAML, apply overrides, run the stage.

Every option is a field of the stage's dataclass config (`cudal1/train/config.py`): the common ones have
flags, and any field can be set with `--set KEY=VALUE` (repeatable). `--print-config` prints the
documented defaults as YAML, the same text as `cudal1/configs/<stage>.yaml`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer

from cudal1.cli.common import console

ConfigOpt = typer.Option(None, "--config", "-c", help="Stage YAML (see cudal1/configs/ or --print-config).")
ModelOpt = typer.Option(None, "--model", help="Model path or hub id, or scratch (a random tiny Llama; sized "
                                              "by e.g. scratch:hidden=64,layers=4).")
OutOpt = typer.Option(None, "--output-dir", "-o", help="Run directory.")
SourceOpt = typer.Option(None, "--source", help="Task source (builtin, folder, hf:NAME, jsonl:PATH).")
SplitOpt = typer.Option(None, "--split", help="train, test or all.")
ResumeOpt = typer.Option(None, "--resume", help="Checkpoint directory, or 'latest'.")
SetOpt = typer.Option([], "--set", help="Override any config field: KEY=VALUE (repeatable).")
PrintOpt = typer.Option(False, "--print-config", help="Print the documented defaults as YAML and exit.")
SandboxOpt = typer.Option(None, "--sandbox", help="Evaluator OS sandbox: auto, required or none (eval_sandbox).")


def _overrides(model: str | None, output_dir: str | None, source: str | None, split: str | None,
               resume: str | None, sets: list[str], **extra: Any) -> dict[str, Any]:
    from cudal1.train.config import parse_overrides

    values = {"model": model, "output_dir": output_dir, "source": source, "split": split,
              "resume_from_checkpoint": resume, **extra}
    out = {k: v for k, v in values.items() if v is not None}
    out.update(parse_overrides(sets))
    return out


def _run(stage: str, config_path: Path | None, overrides: dict[str, Any], print_config: bool) -> None:
    from cudal1.train.config import STAGES, load_config, reference_yaml

    cls = STAGES[stage]
    if print_config:
        typer.echo(reference_yaml(cls))  # plain text: a console would wrap long comments into invalid YAML
        return
    config = load_config(cls, config_path, overrides)
    if stage == "sft":
        from cudal1.train.sft import run_sft as run
    elif stage == "self_supervised":
        from cudal1.train.self_supervised import run_self_supervised as run
    else:
        from cudal1.train.rl import run_rl as run
    result = run(config)
    console.print(f"[bold]{stage}[/bold] finished: final model in {result.final_model_dir}")
    console.print(json.dumps({k: v for k, v in result.summary.items() if k != "reward_batches"},
                             indent=1, default=str), markup=False, highlight=False)


def sft_command(config: Path | None = ConfigOpt, model: str | None = ModelOpt, output_dir: str | None = OutOpt,
                dataset: str | None = typer.Option(None, "--dataset", help="JSONL exported by `cudal1 augment`."),
                source: str | None = SourceOpt, split: str | None = SplitOpt, resume: str | None = ResumeOpt,
                sets: list[str] = SetOpt, print_config: bool = PrintOpt) -> None:
    """Stage 1: supervised fine-tuning (TRL SFTTrainer).

    Trains on correct candidates (the JSONL `cudal1 augment` writes).
    """
    _run("sft", config, _overrides(model, output_dir, source, split, resume, sets, dataset=dataset), print_config)


def self_supervised_command(config: Path | None = ConfigOpt, model: str | None = ModelOpt,
                            output_dir: str | None = OutOpt, source: str | None = SourceOpt,
                            split: str | None = SplitOpt, resume: str | None = ResumeOpt,
                            rounds: int | None = typer.Option(None, "--rounds", min=1,
                                                              help="Maximum rounds."),
                            samples: int | None = typer.Option(None, "--samples", min=1,
                                                               help="Samples per task per round."),
                            sandbox: str | None = SandboxOpt, sets: list[str] = SetOpt,
                            print_config: bool = PrintOpt) -> None:
    """Stage 2: sample, evaluate, keep successes, fine-tune.

    Rounds of sample -> evaluate -> keep successes -> fine-tune.
    """
    _run("self_supervised", config, _overrides(model, output_dir, source, split, resume, sets, rounds=rounds,
                                               samples_per_task=samples, eval_sandbox=sandbox), print_config)


def rl_command(config: Path | None = ConfigOpt, model: str | None = ModelOpt, output_dir: str | None = OutOpt,
               source: str | None = SourceOpt, split: str | None = SplitOpt, resume: str | None = ResumeOpt,
               exemplar_db: str | None = typer.Option(None, "--exemplar-db", help="Exemplar database (SQLite)."),
               sandbox: str | None = SandboxOpt, sets: list[str] = SetOpt,
               print_config: bool = PrintOpt) -> None:
    """Stage 3: contrastive GRPO rewarded by the evaluator.

    Stage 3: contrastive GRPO (TRL GRPOTrainer) rewarded by the hardened evaluator.
    """
    _run("rl", config, _overrides(model, output_dir, source, split, resume, sets, exemplar_db=exemplar_db,
                                  eval_sandbox=sandbox), print_config)


def register(app: typer.Typer) -> None:
    """Add `cudal1 train sft|self-supervised|rl`."""
    train = typer.Typer(no_args_is_help=True, rich_markup_mode=None,
                        help="Train a policy: sft, self-supervised, rl (GRPO).")
    train.command("sft")(sft_command)
    train.command("self-supervised")(self_supervised_command)
    train.command("rl")(rl_command)
    app.add_typer(train, name="train")
