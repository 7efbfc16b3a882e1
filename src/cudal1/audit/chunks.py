"""An audit advanced one chunk per GPU run: plan what is left, evaluate it within a time budget, record it.

    from cudal1.audit.chunks import ChunkConfig, run_chunk
    outcome = run_chunk(ChunkConfig(release="h100", out_dir="out/", budget_s=400))

What is done is read from the committed chunk records (`records/chunks/*.jsonl`, see `records.py`), never
from a store, so any later run on any machine continues where the last stopped, as long as the records it
returned were ingested (copied there) first. An evaluation is keyed by content: the task's source hash and the
candidate's, under the evidence profile and the current protocol version. Every CUDA-L1 release shares its
reference code, and two thirds of the published candidates repeat between releases, so an item evaluated for
one release is done for every release that publishes the same candidate for the same task; baselines
(eager's null test, torch.compile, CUDA graphs) are done per task and card (GPU name, torch and CUDA
versions, baseline protocol) for every release at once.

A chunk is the next pending items of one release, in release order, as many as the cost model says fit the
budget (builds of `load_inline` candidates in parallel waves, then the evaluations one by one, then the
baselines its tasks lack on this card); the budget is enforced again while running (no batch, build or
baseline is started after it), and every line is written as it is measured. With nothing left to evaluate,
a chunk measures the baselines the release's tasks still lack on this card.

Limits: two runs of the same release that start before either's records are ingested plan the same items.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import json
import logging
import math
import secrets
import tempfile
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cudal1.audit.records import (
    Chunk,
    ChunkWriter,
    card_state,
    code_hash,
    file_hash,
    git_commit,
    read_chunk,
    read_chunks,
)
from cudal1.audit.run import AuditConfig, run_audit
from cudal1.audit.select import Item, select_items
from cudal1.audit.views import EVIDENCE_PROFILE
from cudal1.baselines.runner import baseline_protocol_version, ensure_baselines
from cudal1.baselines.variants import parse_kinds
from cudal1.baselines.warm import COMPILE_KINDS
from cudal1.core.errors import ConfigError, SourceError
from cudal1.core.machine import describe_machine
from cudal1.core.types import EvalResult, Status
from cudal1.eval.config import PROTOCOL_VERSION, EvalConfig, resolve_device
from cudal1.eval.pipeline import uses_load_inline
from cudal1.store.keys import environment_key
from cudal1.tasks.sources import load_release
from cudal1.tasks.task import Task

logger = logging.getLogger(__name__)

#: Where an audit of every release lives, relative to the repository's root.
DEFAULT_AUDIT_DIR = "docs/audit/cuda-l1-releases"
#: Where release names (`h100` for `h100.jsonl`) are looked up: the current folder unless `--data-dir` says
#: otherwise (the releases are not committed: 17 MB of other people's code).
DEFAULT_DATA_DIR = "."
CHUNKS_DIR = "chunks"
DEFAULT_BASELINES = ("cuda_graph", "eager", "torch_compile")
# Rationale: no verdict and no survival count needs eager's null test or torch.compile, and torch.compile
# costs a chunk about as much as three evaluations per task (its compile): they are measured once a release has
# no evaluation left, so that the chunks before it hold as many evaluations as they can.
DEFERRED_BASELINES = frozenset({"eager"}) | COMPILE_KINDS


def _f(default: Any, help: str, **kw: Any) -> Any:
    return field(default=default, metadata={"help": help}, **kw)


@dataclass(frozen=True)
class CostModel:
    """What a chunk's parts cost on one GPU with 16 cores (seconds), to size a chunk before running it.

    Rationale (docs/log.md): a cache-miss `load_inline` build takes 60-90 s (median 89.8 s plain, 60.6 s with
    the build levers, 16 at a time on 16 cores); an evaluation took a mean 6.1 s (protocol 3, correct ones)
    and 2-4 s since protocol 9, and the evidence pass adds strict's extra trials: 6 s; a CUDA graph baseline
    3.4 s; runners start in ~9 s and the first evaluation waited 3-10 s for the device helper. torch.compile's
    cold compile was estimated at tens of seconds per task, done in parallel first (half the cores)."""

    fixed_s: float = _f(60.0, "Start of a run: imports, the first runners, the device helper, the card's state.")
    eval_s: float = _f(6.0, "One evaluation, its build done (replaced by the records' mean when they hold 10+).")
    build_wave_s: float = _f(90.0, "One wave of parallel cache-miss load_inline builds.")
    build_slots: int = _f(16, "Builds per wave (the cores).")
    baseline_s: float = _f(5.0, "One baseline that compiles nothing (eager's null test, a CUDA graph).")
    compile_baseline_s: float = _f(15.0, "One torch.compile baseline's timed evaluation, its caches warm.")
    compile_warm_s: float = _f(120.0, "The parallel warm-up of torch.compile's caches, once per chunk.")

    def estimate_s(self, items: Sequence[Item], baselines: Sequence[tuple[Task, str]]) -> float:
        builds = sum(uses_load_inline(c.source) for _, c in items)
        waves = math.ceil(builds / max(1, self.build_slots))
        compiled = [k for _, k in baselines if k.startswith("torch_compile")]
        return (self.fixed_s + waves * self.build_wave_s + len(items) * self.eval_s
                + (len(baselines) - len(compiled)) * self.baseline_s
                + len(compiled) * self.compile_baseline_s + (self.compile_warm_s if compiled else 0.0))


@dataclass(frozen=True)
class ChunkConfig:
    """One chunk of an audit: which release, where its record goes, how long it may take."""

    release: str = _f("", "Release name (h100, a100, l40, h20, 3090: a file NAME.jsonl in data_dir) or a JSONL "
                          "path. Required.")
    out_dir: str = _f("", "Folder the chunk record is written to (one JSONL file). Required.")
    audit_dir: str = _f(DEFAULT_AUDIT_DIR, "The audit folder whose chunks/ records say what is done.")
    data_dir: str = _f(DEFAULT_DATA_DIR, "Where release names are looked up.")
    budget_s: float = _f(400.0, "Wall-clock budget of the chunk (seconds): planned to fit, enforced while running.")
    baselines: tuple[str, ...] = _f(DEFAULT_BASELINES, "Baselines each task needs, measured once per task and card.")
    device: str = _f("cuda", "cuda, cuda:N, or cpu (checks of the chunking on a machine without a GPU).")
    batch_size: int = _f(4, "Evaluations per batch (the budget is checked between batches; builds run ahead).")
    max_items: int | None = _f(None, "At most this many evaluations in the chunk (None: as many as fit).")
    tasks: tuple[str, ...] = _f((), "Only these task ids of the release (empty: all).")
    redo: bool = _f(False, "Evaluate the chosen tasks even when done (a re-check; the record says so).")
    commit: str | None = _f(None, "The code's commit, when the run's folder is not a git checkout.")
    eval_config: EvalConfig | None = _f(None, "Evaluation settings; the profile is always the evidence pass's.")
    costs: CostModel | None = _f(None, "Cost model that sizes the chunk (None: CostModel's defaults).")

    def __post_init__(self) -> None:
        if not self.release:
            raise ConfigError("ChunkConfig.release is required: a release name or a JSONL path")
        if not self.out_dir:
            raise ConfigError("ChunkConfig.out_dir is required: the folder the chunk record goes to")
        if not self.budget_s > 0:
            raise ConfigError(f"budget_s must be > 0, not {self.budget_s!r}")
        if self.batch_size < 1:
            raise ConfigError("batch_size must be >= 1")
        if self.max_items is not None and self.max_items < 1:
            raise ConfigError("max_items must be >= 1 (or None)")
        object.__setattr__(self, "baselines", tuple(parse_kinds(list(self.baselines))) if self.baselines else ())
        cfg = self.eval_config or EvalConfig()
        object.__setattr__(self, "eval_config", dataclasses.replace(cfg, profile=EVIDENCE_PROFILE,
                                                                    device=self.device))
        if self.costs is None:
            object.__setattr__(self, "costs", CostModel())

    def release_path(self) -> Path:
        return resolve_release(self.release, self.data_dir)


def resolve_release(release: str | Path, data_dir: str | Path = DEFAULT_DATA_DIR) -> Path:
    """A release's file: `release` itself when it is a file, else `data_dir/<release>.jsonl`."""
    path = Path(release)
    if path.is_file():
        return path
    named = Path(data_dir) / f"{Path(release).name.removesuffix('.jsonl')}.jsonl"
    if named.is_file():
        return named
    raise SourceError(f"no release {release!r}: neither a file nor {named}")


# --------------------------------------------------------------------------- what is done


def evaluation_key(task_hash: str, candidate_hash: str) -> tuple[str, str]:
    return task_hash, candidate_hash


def current(line: Mapping[str, Any]) -> bool:
    """Whether a result line was measured under the evidence profile of this protocol version."""
    return line.get("profile") == EVIDENCE_PROFILE and str(line.get("protocol_version")) == PROTOCOL_VERSION


def settled(lines: Sequence[Mapping[str, Any]]) -> bool:
    """Whether an item's result lines settle it: a verdict, a failing reference, or two failed evaluations."""
    for line in lines:
        if line.get("status") != Status.INFRA_ERROR.value:
            return True
        if any(f.get("rule") == "reference_error" for f in line.get("flags") or []):
            return True
    return len(lines) >= 2


def done_keys(chunks: Sequence[Chunk]) -> set[tuple[str, str]]:
    """Items settled under the current protocol by any chunk (of any release, on any card; re-checks count)."""
    lines: dict[tuple[str, str], list[Mapping[str, Any]]] = {}
    for chunk in chunks:
        for line in chunk.results:
            if current(line):
                lines.setdefault(evaluation_key(line["task_hash"], line["candidate_hash"]), []).append(line)
    return {key for key, found in lines.items() if settled(found)}


def evaluated_here(chunks: Sequence[Chunk], card: str) -> set[tuple[str, str]]:
    """Items with a current result from a chunk on `card`."""
    return {evaluation_key(line["task_hash"], line["candidate_hash"]) for chunk in chunks
            if card_key(chunk.header) == card for line in chunk.results if current(line)}


def card_key(header: Mapping[str, Any]) -> str:
    """The machine a baseline belongs to: GPU name, torch and CUDA versions, device type, baseline protocol."""
    return f"{environment_key(header.get('environment') or {})}|{header.get('baseline_protocol', '')}"


def baselines_done(chunks: Sequence[Chunk], card: str) -> set[tuple[str, str]]:
    """(task hash, kind) of the baselines measured (or failed) on `card` by any chunk."""
    return {(line["task_hash"], line["name"]) for chunk in chunks if card_key(chunk.header) == card
            for line in chunk.baselines}


@dataclass
class Plan:
    """What a chunk will do: the items to evaluate and the (task, kind) baselines to measure."""

    items: list[Item]
    baselines: list[tuple[Task, str]]
    pending: int  # items of the release not done before this chunk
    estimate_s: float

    @property
    def empty(self) -> bool:
        return not self.items and not self.baselines


def plan_chunk(items: Sequence[Item], done: set[tuple[str, str]], have: set[tuple[str, str]],
               kinds: Sequence[str], budget_s: float, costs: CostModel, *, max_items: int | None = None,
               redo: bool = False, deferred: Collection[str] = DEFERRED_BASELINES,
               here: set[tuple[str, str]] | None = None) -> Plan:
    """The next chunk: pending items in release order while the estimate fits `budget_s` (at least one), the
    baselines their tasks lack but the `deferred` kinds; with none pending, the baselines the release's tasks
    lack (as many as fit), for the tasks whose item was evaluated on this card (`here`: their keys; None:
    every task), since a baseline serves the speedups measured on its own card only."""
    pending = [(t, c) for t, c in items if redo or evaluation_key(t.hash, c.hash) not in done]
    chosen: list[Item] = []
    needed: list[tuple[Task, str]] = []
    seen_tasks: set[str] = set()

    def lacking(task: Task, now: Sequence[str] = kinds) -> list[tuple[Task, str]]:
        if task.hash in seen_tasks:
            return []
        return [(task, k) for k in now if (task.hash, k) not in have]

    for item in pending:
        extra = lacking(item[0], [k for k in kinds if k not in deferred])
        if chosen and costs.estimate_s([*chosen, item], [*needed, *extra]) > budget_s:
            break
        if max_items is not None and len(chosen) >= max_items:
            break
        chosen.append(item)
        needed += extra
        seen_tasks.add(item[0].hash)
    if not chosen:
        for task, cand in items:
            if here is not None and evaluation_key(task.hash, cand.hash) not in here:
                continue
            extra = lacking(task)
            if extra and needed and costs.estimate_s([], [*needed, *extra]) > budget_s:
                break
            needed += extra
            seen_tasks.add(task.hash)
    return Plan(items=chosen, baselines=needed, pending=len(pending), estimate_s=costs.estimate_s(chosen, needed))


def describe_plan(plan: Plan) -> str:
    """The plan in a few lines: what it evaluates and measures, and its estimated time."""
    kinds: dict[str, int] = {}
    for _, kind in plan.baselines:
        kinds[kind] = kinds.get(kind, 0) + 1
    ids = [t.id for t, _ in plan.items]
    shown = ", ".join(ids[:12]) + (f" and {len(ids) - 12} more" if len(ids) > 12 else "")
    return (f"{len(ids)} evaluation(s) of {plan.pending} pending: {shown or '-'}\n"
            f"baselines: {', '.join(f'{k} x{n}' for k, n in kinds.items()) or '-'}\n"
            f"estimated {plan.estimate_s:.0f} s")


def measured_costs(chunks: Sequence[Chunk], costs: CostModel) -> CostModel:
    """The cost model with `eval_s` from the records' evaluations (their mean duration, builds done ahead),
    once they hold ten or more."""
    durations = [float(line["duration_s"]) for chunk in chunks for line in chunk.results
                 if current(line) and line.get("duration_s")]
    if len(durations) < 10:
        return costs
    return dataclasses.replace(costs, eval_s=sum(durations) / len(durations))


# --------------------------------------------------------------------------- running a chunk


@dataclass
class ChunkOutcome:
    """What a chunk did: its record's path, the plan, what was measured, and what is left."""

    path: Path
    plan: Plan
    evaluated: int = 0
    baselines: int = 0
    left: list[str] = field(default_factory=list)  # planned task ids not evaluated (out of time)
    elapsed_s: float = 0.0


def chunk_header(config: ChunkConfig, release: Path, plan: Plan, cfg: EvalConfig, machine: dict[str, Any],
                 repo_root: Path) -> dict[str, Any]:
    """What a chunk states about itself (the record's first line)."""
    strict = dataclasses.replace(cfg, profile="strict")
    return {
        "release": release.stem, "release_sha256": file_hash(release), "purpose": "recheck" if config.redo else "audit",
        "started_utc": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "budget_s": config.budget_s, "estimate_s": round(plan.estimate_s, 1),
        "planned": [t.id for t, _ in plan.items], "baselines_planned": [[t.id, k] for t, k in plan.baselines],
        "pending_before": plan.pending, "environment": machine, "card": card_state(cfg.device),
        "protocol": cfg.protocol(), "baseline_protocol": baseline_protocol_version(strict.protocol()),
        "commit": config.commit or git_commit(repo_root), "code_sha256": code_hash(),
    }


def plan_next(config: ChunkConfig, machine: dict[str, Any] | None = None) -> Plan:
    """What the next chunk of `config.release` would do on this machine (or on `machine`, a
    `describe_machine` dict), from the committed records: nothing is run or written."""
    release = config.release_path()
    items = select_items(load_release(release), task_ids=config.tasks)
    if config.tasks and not items:
        raise ConfigError(f"none of the tasks {', '.join(config.tasks[:3])} has a candidate in {release.name}")
    chunks = read_chunks(Path(config.audit_dir) / CHUNKS_DIR)
    cfg = config.eval_config.resolved(resolve_device(config.device) if machine is None else machine["device_type"])
    machine = machine or describe_machine(cfg.device)
    strict = dataclasses.replace(cfg, profile="strict")
    card = card_key({"environment": machine, "baseline_protocol": baseline_protocol_version(strict.protocol())})
    return plan_chunk(items, done_keys(chunks), baselines_done(chunks, card), config.baselines, config.budget_s,
                      measured_costs(chunks, config.costs), max_items=config.max_items, redo=config.redo,
                      here=evaluated_here(chunks, card))


def run_chunk(config: ChunkConfig, *, evaluate: Callable[..., list[EvalResult | None]] | None = None,
              measure: Callable[..., Any] | None = None, repo_root: str | Path = ".") -> ChunkOutcome:
    """Plan and run the next chunk of `config.release`; write its record into `config.out_dir`.

    `evaluate` (`evaluate_many`'s signature) and `measure` (`ensure_baselines`') are for tests. Raises
    `SourceError`/`ConfigError` for bad input (one line); never for what a candidate does.
    """
    started = time.monotonic()
    release = config.release_path()
    cfg = config.eval_config.resolved(resolve_device(config.device))
    machine = describe_machine(cfg.device)
    strict = dataclasses.replace(cfg, profile="strict")
    plan = plan_next(config, machine)
    stamp = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    path = Path(config.out_dir) / f"{release.stem}-{stamp}-{secrets.token_hex(3)}.jsonl"  # two runs in a second
    outcome = ChunkOutcome(path=path, plan=plan)
    header = chunk_header(config, release, plan, cfg, machine, Path(repo_root))
    with ChunkWriter(path, header) as writer:
        if plan.items:
            outcome.evaluated = _evaluate(config, release, plan, writer, started, evaluate)
        left_s = config.budget_s - (time.monotonic() - started)
        if plan.baselines and left_s > 0:
            outcome.baselines = _baselines(plan, strict, writer, started, config.budget_s, measure)
        done = set(_written_tasks(path))
        outcome.left = [t.id for t, _ in plan.items if t.id not in done]
        writer.end(card_after=card_state(cfg.device), evaluated=outcome.evaluated, baselines=outcome.baselines,
                   left=outcome.left)
        outcome.elapsed_s = writer.elapsed_s()
    return outcome


def _evaluate(config: ChunkConfig, release: Path, plan: Plan, writer: ChunkWriter, started: float,
              evaluate: Callable[..., list[EvalResult | None]] | None) -> int:
    """The plan's items through `run_audit` (builds in parallel first, batches within the budget), on a store
    of its own that is thrown away: what counts is the record."""
    count = 0
    hashes = {t.id: (t.hash, c.hash) for t, c in plan.items}

    def on_result(task: Task, result: EvalResult) -> None:
        nonlocal count
        task_hash, candidate_hash = hashes[task.id]
        writer.result(result, task_id=task.id, task_hash=task_hash, candidate_hash=candidate_hash)
        count += 1

    from cudal1.store import ResultsStore

    with tempfile.TemporaryDirectory(prefix="cudal1-chunk-") as scratch, ResultsStore(Path(scratch) / "s.sqlite") as store:
        audit = AuditConfig(release=str(release), profile=EVIDENCE_PROFILE, tasks=tuple(hashes), peaks=False,
                            batch_size=config.batch_size, force=config.redo, eval_config=config.eval_config,
                            time_budget_s=max(1.0, config.budget_s - (time.monotonic() - started)))
        run_audit(audit, store, evaluate=evaluate, on_result=on_result)
    return count


def _baselines(plan: Plan, cfg: EvalConfig, writer: ChunkWriter, started: float, budget_s: float,
               measure: Callable[..., Any] | None) -> int:
    """The plan's baselines, checked under strict's tolerances: one `ensure_baselines` call per set of kinds
    the tasks lack (usually one: the quick kinds for every task first, then the compiled ones)."""
    count = 0
    kinds_of: dict[str, list[str]] = {}
    tasks: dict[str, Task] = {}
    for task, kind in plan.baselines:
        kinds_of.setdefault(task.hash, []).append(kind)
        tasks[task.hash] = task
    groups: dict[tuple[str, ...], list[Task]] = {}
    for task_hash, kinds in kinds_of.items():
        groups.setdefault(tuple(kinds), []).append(tasks[task_hash])

    def on_result(task: Task, kind: str, record: Any) -> None:
        nonlocal count
        writer.baseline(record)
        count += 1

    measure = measure or ensure_baselines
    for kinds, group in groups.items():
        if time.monotonic() - started > budget_s:
            break
        measure(group, list(kinds), cfg, store=None, on_result=on_result,
                should_stop=lambda: time.monotonic() - started > budget_s)
    return count


def _written_tasks(path: Path) -> list[str]:
    return [line["task_id"] for line in read_chunk(path).results]



# --------------------------------------------------------------------------- ingesting returned records


def ingest_chunks(sources: Sequence[str | Path], audit_dir: str | Path = DEFAULT_AUDIT_DIR,
                  repo_root: str | Path = ".") -> list[Path]:
    """Copy chunk records (files, or folders holding them) into `audit_dir/chunks/`; return the new ones.

    Each is read first (`SourceError` for one that is not a chunk record, or one whose release file differs from
    the one the static records were made from). A record whose run did not know its commit (a run folder that
    is no git checkout) gets this checkout's commit when its code hash is this checkout's. A record already
    there with the same content is skipped; another with the same name is an error."""
    from cudal1.audit.static_half import read_static

    files: list[Path] = []
    for source in map(Path, sources):
        if source.is_dir():
            files += sorted(source.rglob("*.jsonl"))
        elif source.is_file():
            files.append(source)
        else:
            raise SourceError(f"no chunk record at {source}")
    if not files:
        raise SourceError("no chunk records (*.jsonl) found in " + ", ".join(map(str, sources)))
    known = {name: next((x for x in lines if x.get("kind") == "release"), {})
             for name, lines in read_static(audit_dir).items()}
    target_dir = Path(audit_dir) / CHUNKS_DIR
    added = []
    for path in files:
        chunk = read_chunk(path)
        expected = known.get(chunk.release, {}).get("release_sha256")
        if expected and chunk.header.get("release_sha256") != expected:
            raise SourceError(f"{path} measured another version of release {chunk.release!r} than the static "
                              "records were made from (its file's hash differs)")
        text = _with_commit(path.read_text(encoding="utf-8"), chunk, Path(repo_root))
        target = target_dir / path.name
        if target.exists():
            if target.read_text(encoding="utf-8") == text:
                continue
            raise SourceError(f"{target} exists with other content: a chunk record is never overwritten")
        target_dir.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
        added.append(target)
    return added


def _with_commit(text: str, chunk: Chunk, repo_root: Path) -> str:
    """The record's text, its header given this checkout's commit when it had none and the code is the same."""
    if chunk.header.get("commit") or chunk.header.get("code_sha256") != code_hash():
        return text
    commit = git_commit(repo_root)
    if commit is None:
        return text
    first, _, rest = text.partition("\n")
    return json.dumps({**json.loads(first), "commit": commit, "commit_from": "ingest (same code hash)"}) + "\n" + rest


__all__ = ["DEFAULT_AUDIT_DIR", "DEFAULT_DATA_DIR", "ChunkConfig", "ChunkOutcome", "CostModel", "Plan",
           "baselines_done", "card_key", "describe_plan", "done_keys", "evaluated_here", "ingest_chunks",
           "measured_costs", "plan_chunk", "plan_next", "resolve_release", "run_chunk"]
