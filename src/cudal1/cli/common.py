"""Shared CLI pieces: evaluation options, the store, progress bars and result tables."""

from __future__ import annotations

import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import typer
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

from cudal1.eval.config import EvalConfig
from cudal1.eval.types import EvalResult, Status

# Non-terminal output (CI logs, pipes) gets a wide table instead of Rich's 80-column default.
console = Console(width=None if sys.stdout.isatty() else 180)

STATUS_STYLE = {Status.CORRECT: "green", Status.INCORRECT: "red", Status.HACK_DETECTED: "magenta",
                Status.COMPILE_ERROR: "yellow", Status.RUNTIME_ERROR: "red", Status.TIMEOUT: "yellow",
                Status.UNPARSEABLE: "yellow"}

DeviceOpt = typer.Option("auto", "--device", help="auto, cuda, cuda:N or cpu.")
ProfileOpt = typer.Option("strict", "--profile", help="strict, kernelbench-v0 or cuda-l1.")
TrialsOpt = typer.Option(5, "--trials", help="Correctness trials with fresh inputs.")
SizesOpt = typer.Option("auto", "--sizes", help="full, small (task's SMALL_SIZES) or auto (small on cpu).")
StoreOpt = typer.Option(None, "--store", help="Results database (default: user data dir or $CUDAL1_STORE).")
NoStoreOpt = typer.Option(False, "--no-store", help="Do not read or write the results store.")
ForceOpt = typer.Option(False, "--force", help="Re-evaluate even when the store has this result.")
BucketsOpt = typer.Option(7, "--buckets", help="Timing buckets (speedup = median of bucket speedups).")
TimeoutOpt = typer.Option(600.0, "--timeout-s", help="Wall-clock limit per candidate (builds excluded).")


def make_config(device: str, profile: str, trials: int, sizes: str, **extra: Any) -> EvalConfig:
    return EvalConfig(device=device, profile=profile, correctness_trials=trials, sizes=sizes, **extra)


def open_store(path: Path | None, disabled: bool) -> Any:
    if disabled:
        return None
    from cudal1.store import ResultsStore

    return ResultsStore(path)


def progress_bar() -> Progress:
    return Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TextColumn("{task.fields[best]}"), TimeElapsedColumn(), TimeRemainingColumn(),
                    console=console, transient=False)


def fmt(x: float | None, spec: str = ".2f", suffix: str = "") -> str:
    return "-" if x is None else f"{x:{spec}}{suffix}"


def result_table(rows: Iterable[tuple[str, EvalResult]], title: str) -> Table:
    table = Table(title=title)
    for col, kw in (("task", {}), ("status", {}), ("speedup", {"justify": "right"}),
                    ("warm", {"justify": "right"}), ("ref ms", {"justify": "right"}),
                    ("cand ms", {"justify": "right"}), ("stab.", {"justify": "right"}), ("class", {}),
                    ("message", {"max_width": 60})):
        table.add_column(col, **kw)
    for name, r in rows:
        style = STATUS_STYLE.get(r.status, "")
        warm = r.timing.speedup_warm if r.timing else None
        table.add_row(name, f"[{style}]{r.status.value}[/{style}]", fmt(r.speedup, ".2f", "x"),
                      fmt(warm, ".2f", "x"), fmt(r.ref_ms, ".3f"), fmt(r.candidate_ms, ".3f"),
                      fmt(r.stability, ".1%"), r.kernel_class.value if r.kernel_class else "-",
                      (r.message or "").splitlines()[0][:120] if r.message else "")
    return table
