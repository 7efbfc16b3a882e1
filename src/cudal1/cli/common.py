"""Shared CLI pieces: evaluation options, the store, output paths, progress bars (verdicts.py: tables)."""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator
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

from cudal1.cli.options import Field, finite, opt, parse_sets
from cudal1.core.errors import SourceError
from cudal1.core.names import RENAMED_PROFILES
from cudal1.eval.config import ESTIMATORS, PROFILES, SANDBOX_MODES, EvalConfig, profile_choices
from cudal1.llm.prompts import FORM_CHOICES
from cudal1.tasks.task import MAX_SOURCE_BYTES, size_problem, source_problem

# Non-terminal output (CI logs, pipes) gets a wide table instead of Rich's 80-column default.
console = Console(width=None if sys.stdout.isatty() else 180)

def check_device(value: str) -> str:
    """`--device`: auto, cpu, cuda or cuda:N (checked here so that the error names the option)."""
    value = value.strip()
    index = value.partition(":")[2]
    if value in ("auto", "cpu", "cuda") or (value.startswith("cuda:") and index.isdigit()):
        return value
    raise typer.BadParameter(f"{value!r} is not auto, cpu, cuda or cuda:N")


def check_profile(value: str) -> str:
    """`--profile`: a correctness profile, or an old spelling (`core.names.RENAMED_PROFILES`) that the
    evaluator's config turns into its profile and policy."""
    name = value.strip()
    if name not in PROFILES and name not in RENAMED_PROFILES:
        raise typer.BadParameter(f"{value!r} is not one of {', '.join(PROFILES)} (deprecated: "
                                 f"{', '.join(RENAMED_PROFILES)})")
    return name


def choice(*values: str) -> Callable[[str], str]:
    """A callback accepting one of `values` (the error names the option and the values)."""
    def check(value: str) -> str:
        if value not in values:
            raise typer.BadParameter(f"{value!r} is not one of {', '.join(values)}")
        return value
    return check


def positive(value: float | None) -> float | None:
    """A callback for numbers that must be finite and > 0 (click's ranges cannot exclude their bound)."""
    if value is not None and not value > 0:
        raise typer.BadParameter(f"{value:g} is not > 0")
    return finite(value)


DeviceOpt = typer.Option("auto", "--device", help="auto, cuda, cuda:N or cpu.", callback=check_device)
ProfileOpt = typer.Option("strict", "--profile", callback=check_profile,
                          help=f"Correctness profile, how to measure: {profile_choices(typed=True)}. What "
                               "rejects: cudal1 eval --policy.")
TrialsOpt = typer.Option(5, "--trials", min=1, help="Correctness trials with fresh inputs.")
SizesOpt = typer.Option("auto", "--sizes", callback=choice("auto", "full", "small"),
                        help="full, small (task's SMALL_SIZES) or auto (small on cpu).")
StoreOpt = typer.Option(None, "--store", help="Results database (default: user data dir or $CUDAL1_STORE).")
NoStoreOpt = typer.Option(False, "--no-store", help="Do not read or write the results store.")
ForceOpt = typer.Option(False, "--force", help="Re-evaluate even when the store has this result.")
BucketsOpt = typer.Option(7, "--buckets", min=1, help="Timing buckets (their spread is the stability; the "
                                                       "speedup pools all calls, unless cudal1 eval --estimator "
                                                       "buckets).")
TimeoutOpt = typer.Option(600.0, "--timeout-s", callback=positive,
                          help="Wall-clock limit of one whole evaluation (build time excluded).")
SandboxOpt = typer.Option("auto", "--sandbox", callback=choice("auto", "required", "none"),
                          help="auto (the best OS sandbox of this host; strict refuses to run without one), "
                               "required, or none (run unsandboxed: an opt-out recorded in every result).")
FormOpt = typer.Option("auto", "--form", callback=choice(*FORM_CHOICES),
                       help="Candidate form asked for: auto (raw_cuda where candidates are evaluated on a "
                            "GPU, torch on a CPU, where CUDA kernels cannot run), raw_cuda (NVRTC, builds in "
                            "< 1 s), load_inline or torch (PyTorch only).")
WorkersOpt = typer.Option("", "--workers", help="Evaluate through an evaluator pool: local (one slot per "
                                                "GPU), ray:auto or ray://HOST:PORT, or a reward server's "
                                                "http(s)://HOST:PORT (default: this process).")


# The evaluation settings commands offer as options, generated from EvalConfig's fields (cli/options.py).
EVAL_OPTIONS = {spec.name: spec for spec in (
    opt("device", callback=check_device),
    opt("profile", callback=check_profile),
    opt("correctness_trials", "--trials", min=1),
    opt("sizes", callback=choice("auto", "full", "small")),
    opt("buckets", min=1),
    opt("timeout_s", callback=positive),
    opt("sandbox", callback=choice(*SANDBOX_MODES)),
    opt("policy"),
    opt("round_toward_one"),
    opt("estimator", callback=choice(*ESTIMATORS)),
    opt("bracket_work_ms", min=0.0),
    opt("runner_pairs", min=1),
)}


def eval_options(*names: str) -> list[Field]:
    """The `EVAL_OPTIONS` of `names`, in that order."""
    return [EVAL_OPTIONS[name] for name in names]


def add_id_column(table: Any, ids: Iterable[str], header: str = "task") -> None:
    """The column of task ids: never cut or wrapped (users copy them), the other columns give way."""
    table.add_column(header, no_wrap=True, min_width=max([len(header), *(len(i) for i in ids)]))


def read_source(path: Path, what: str) -> str:
    """The text of a user's Python file (or a kernel-form spec's JSON); `SourceError` (one line) when it is
    missing, a folder, not UTF-8, or over the size limit of a source (`MAX_SOURCE_BYTES`)."""
    if path.is_dir():
        raise SourceError(f"{what} {path} is a folder, not a file")
    if not path.is_file():
        raise SourceError(f"no such {what} file: {path}")
    try:
        size = path.stat().st_size
        if size > MAX_SOURCE_BYTES:  # before reading it: a file of GBs is refused as fast as one of MBs
            raise SourceError(f"{what} {path} cannot be evaluated: it is {size_problem(size)}")
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise SourceError(f"{what} {path} is not UTF-8 text (byte {exc.start}): is it a Python source?") from None
    except OSError as exc:
        raise SourceError(f"cannot read {what} {path}: {exc.strerror}") from None
    problem = source_problem(text)
    if problem:
        raise SourceError(f"{what} {path} cannot be evaluated: {problem}")
    return text


def open_existing_store(path: Path | None) -> Any:
    """The store a read-only command reports from; `SourceError` rather than creating an empty one."""
    from cudal1.store import ResultsStore, default_store_path

    where = path or default_store_path()
    if not where.is_file():
        raise SourceError(f"no results store at {where}: evaluate something first, or give --store PATH")
    return ResultsStore(where)


def output_folder(path: Path) -> Path:
    """An output folder, created now (before any long work) so that a file in the way, or a folder that
    cannot be made, is a one-line `SourceError` instead of a traceback at the end."""
    if path.exists() and not path.is_dir():
        raise SourceError(f"output folder {path} is a file, not a folder")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise SourceError(f"cannot create output folder {path}: {exc.strerror or exc}") from None
    return path


def check_output_folder(path: Path) -> Path:
    """An output folder to be made later (`writing_into`): `SourceError` now when a file is in the way or the
    folder it would go in cannot be written."""
    if path.exists() and not path.is_dir():
        raise SourceError(f"output folder {path} is a file, not a folder")
    existing = next(p for p in (path, *path.absolute().parents) if p.exists())
    if not existing.is_dir():
        raise SourceError(f"cannot create output folder {path}: {existing} is a file")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise SourceError(f"cannot create output folder {path}: {existing} is not writable")
    return path


@contextlib.contextmanager
def writing_into(path: Path) -> Iterator[Path]:
    """Make the output folder `path` for the block's writes; when the block fails, a folder it made is removed
    again if still empty, so that a failed command leaves no empty folder behind."""
    existed = path.exists()
    output_folder(path)
    try:
        yield path
    except BaseException:
        if not existed:
            with contextlib.suppress(OSError):
                path.rmdir()  # only an empty folder goes
        raise


def output_file(path: Path) -> Path:
    """An output file's path, its folder created now; `SourceError` when it names a folder or cannot be
    written there."""
    if path.is_dir():
        raise SourceError(f"output file {path} is a folder")
    output_folder(path.parent)
    return path


def eval_config(values: dict[str, Any], sets: Iterable[str] = (), option: str = "--set") -> EvalConfig:
    """The evaluation config of a command: its generated options' `values` (field -> value, `EVAL_OPTIONS`),
    then its `KEY=VALUE` settings (`sets`, the command's `option`) for any other field. An old profile
    spelling becomes its profile and policy in `EvalConfig` (with its one-line warning)."""
    return EvalConfig(**{**values, **parse_sets(EvalConfig, sets, option)})


def open_store(path: Path | None, disabled: bool) -> Any:
    """`--store PATH` / `--no-store`: the store to use, None without one; both at once is an error."""
    if disabled and path is not None:
        raise SourceError("give --store or --no-store, not both")
    if disabled:
        return None
    from cudal1.store import ResultsStore

    return ResultsStore(path)


class PlainProgress:
    """`rich.progress.Progress`'s calls that the commands use, as plain log lines on stderr: for output that is
    not a terminal (CI, nohup, a pipe), where a live bar would show nothing until the end. A line at most every
    `interval_s` while work advances, and the final state."""

    def __init__(self, interval_s: float = 10.0, stream: Any = None):
        self.interval_s = interval_s
        self.stream = stream
        self._jobs: dict[int, dict[str, Any]] = {}
        self._last = -float("inf")  # the first update always prints (monotonic time may start near 0)
        self._started = time.monotonic()

    def __enter__(self) -> PlainProgress:
        return self

    def __exit__(self, exc_type: object, *exc: object) -> None:
        for job in self._jobs.values():
            if exc_type is not None and not job["completed"] and job["printed"] is None:
                continue  # failed before any work: the error is the one line to read, no "0" above it
            self._print(job)

    def add_task(self, description: str, total: float | None = None, visible: bool = True, **fields: Any) -> int:
        self._jobs[len(self._jobs)] = {"description": description, "total": total, "completed": 0,
                                       "visible": visible, "fields": fields, "printed": None}
        return len(self._jobs) - 1

    def update(self, job_id: int, *, advance: float | None = None, completed: float | None = None,
               total: float | None = None, description: str | None = None, visible: bool | None = None,
               **fields: Any) -> None:
        job = self._jobs[job_id]
        job["completed"] = completed if completed is not None else job["completed"] + (advance or 0)
        for key, value in (("total", total), ("description", description), ("visible", visible)):
            if value is not None:
                job[key] = value
        job["fields"].update(fields)
        if time.monotonic() - self._last >= self.interval_s:
            self._print(job)

    def _print(self, job: dict[str, Any]) -> None:
        line = self._line(job)
        if not job["visible"] or line == job["printed"]:
            return
        job["printed"], self._last = line, time.monotonic()
        print(line, file=self.stream or sys.stderr, flush=True)

    def _line(self, job: dict[str, Any]) -> str:
        done = f"{job['completed']:g}" + (f"/{job['total']:g}" if job["total"] else "")
        best = str(job["fields"].get("best") or "")
        return f"[{time.monotonic() - self._started:6.0f} s] {job['description']}: {done}" + (f"  {best}" if best else "")


def progress_bar() -> Progress | PlainProgress:
    """A live bar on a terminal, periodic plain lines otherwise (`PlainProgress`)."""
    if not console.is_terminal:
        return PlainProgress()
    return Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TextColumn("{task.fields[best]}"), TimeElapsedColumn(), TimeRemainingColumn(),
                    console=console, transient=False)
