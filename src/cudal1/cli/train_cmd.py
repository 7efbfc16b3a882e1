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
from cudal1.cli.options import config_options, opt
from cudal1.train.config import RLStageConfig, SelfSupervisedConfig, SFTStageConfig

ConfigOpt = typer.Option(None, "--config", "-c", help="Stage YAML (see cudal1/configs/ or --print-config).")
SetOpt = typer.Option([], "--set", help="Override any config field: KEY=VALUE (repeatable).")
PrintOpt = typer.Option(False, "--print-config", help="Print the documented defaults as YAML and exit.")
# Generated from the stages' fields (cli/options.py); default None: a setting the YAML file gives stays.
COMMON_FIELDS = [opt("model", default=None), opt("output_dir", "--output-dir", "-o", default=None),
                 opt("source", default=None), opt("split", default=None),
                 opt("resume_from_checkpoint", "--resume", default=None)]


def _overrides(settings: dict[str, Any] | None, sets: list[str]) -> dict[str, Any]:
    """The options given (not None), then the `--set KEY=VALUE` overrides."""
    from cudal1.train.config import parse_overrides

    out = {k: v for k, v in (settings or {}).items() if v is not None}
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


@config_options(SFTStageConfig, [*COMMON_FIELDS, opt("dataset", default=None)], into="settings")
def sft_command(config: Path | None = ConfigOpt, sets: list[str] = SetOpt, print_config: bool = PrintOpt,
                settings: dict[str, Any] | None = None) -> None:
    """Stage 1: supervised fine-tuning (TRL SFTTrainer).

    Trains on correct candidates (the JSONL `cudal1 augment` writes).
    """
    _run("sft", config, _overrides(settings, sets), print_config)


@config_options(SelfSupervisedConfig, [*COMMON_FIELDS, opt("rounds", min=1, default=None),
                                       opt("samples_per_task", "--samples", min=1, default=None),
                                       opt("eval_sandbox", "--sandbox", default=None)], into="settings")
def self_supervised_command(config: Path | None = ConfigOpt, sets: list[str] = SetOpt,
                            print_config: bool = PrintOpt, settings: dict[str, Any] | None = None) -> None:
    """Stage 2: sample, evaluate, keep successes, fine-tune.

    Rounds of sample -> evaluate -> keep successes -> fine-tune.
    """
    _run("self_supervised", config, _overrides(settings, sets), print_config)


@config_options(RLStageConfig, [*COMMON_FIELDS, opt("exemplar_db", default=None),
                                opt("eval_sandbox", "--sandbox", default=None)], into="settings")
def rl_command(config: Path | None = ConfigOpt, sets: list[str] = SetOpt, print_config: bool = PrintOpt,
               settings: dict[str, Any] | None = None) -> None:
    """Stage 3: contrastive GRPO rewarded by the evaluator.

    Stage 3: contrastive GRPO (TRL GRPOTrainer) rewarded by the hardened evaluator.
    """
    _run("rl", config, _overrides(settings, sets), print_config)


def register(app: typer.Typer) -> None:
    """Add `cudal1 train sft|self-supervised|rl`."""
    train = typer.Typer(no_args_is_help=True, rich_markup_mode=None,
                        help="Train a policy: sft, self-supervised, rl (GRPO).")
    train.command("sft")(sft_command)
    train.command("self-supervised")(self_supervised_command)
    train.command("rl")(rl_command)
    app.add_typer(train, name="train")
