"""Re-evaluate a published kernel collection (a CUDA-L1-style JSONL release) on this machine, resumably.

    from cudal1.audit import AuditConfig, run_audit
    outcome = run_audit(AuditConfig(release="h100.jsonl", profile="strict", chunk="2/5"), store)

Every selected candidate is evaluated through `evaluate_many`, batch by batch, and stored under the label
`audit:<release>:<profile>`; on a GPU the `load_inline` builds of every pending candidate run first, all in
parallel (a batch would otherwise wait for its own slowest build, once per batch). Resuming is the store's
job: an item whose evaluation key (task, candidate, protocol, machine) is already stored is not evaluated
again, whichever run stored it, so an interrupted run, a later chunk or another machine sharing the store
simply continues. Published scores are stored with each candidate (`meta["published"]`, and the release's
`published/<release>` meta entry) so `cudal1 report` shows them too.

`time_budget_s` stops starting new batches once the budget is spent (the GPU machine's calls are limited);
what is done is kept, and the report covers every selected item evaluated so far, not only this chunk.
Limits: one device per process; builds of a batch that is cut short are wasted only if the process dies.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cudal1.audit.rows import PUBLISHED_META_PREFIX, row_from_result, rows_from_store, stored_labels
from cudal1.audit.select import Item, chunk_items, parse_chunk, select_items
from cudal1.audit.summary import write_audit_outputs
from cudal1.baselines.runner import ensure_baselines, load_baselines, null_test_summary
from cudal1.baselines.sol import measure_peaks
from cudal1.core.baselines import baseline_kind_names
from cudal1.core.errors import ConfigError
from cudal1.core.machine import describe_machine
from cudal1.core.types import EvalResult
from cudal1.eval.config import (
    PROTOCOL_VERSION,
    EvalConfig,
    canonical_options,
    current_protocol,
    profile_choices,
    resolve_device,
)
from cudal1.eval.scheduler import evaluate_many, prebuild, runner_supply
from cudal1.metrics.rows import ResultRow
from cudal1.store.keys import canonical_json, key_environment
from cudal1.tasks.sources import load_release
from cudal1.tasks.task import Task

logger = logging.getLogger(__name__)

Evaluate = Callable[..., list[EvalResult | None]]


def _f(default: Any, help: str, **kw: Any) -> Any:
    return field(default=default, metadata={"help": help}, **kw)


@dataclass(frozen=True)
class AuditConfig:
    """What to audit and how."""

    release: str = _f("", "Path of the JSONL release (CUDA-L1 schema). Required.")
    profile: str = _f("strict", f"Correctness profile: {profile_choices()}.")
    levels: tuple[int, ...] = _f((), "Only these levels (empty: all).")
    sample_per_level: int | None = _f(None, "Keep K items per level, chosen with `seed` (None: all).")
    seed: int = _f(0, "Seed of the per-level sample.")
    limit: int | None = _f(None, "Keep the first N selected items.")
    chunk: str | None = _f(None, "Process only chunk I/N of the selection (round-robin), e.g. 2/5.")
    tasks: tuple[str, ...] = _f((), "Only these task ids (empty: every task of the selection).")
    baselines: tuple[str, ...] = _f((), "Baselines to measure for the chunk's tasks (e.g. eager, cuda_graph).")
    batch_size: int = _f(16, "Items per evaluate_many call (their builds run in parallel).")
    time_budget_s: float | None = _f(None, "Stop starting new batches after this many seconds.")
    force: bool = _f(False, "Re-evaluate items already in the store.")
    survive_fraction: float = _f(0.9, "A published speedup survives when ours >= this x published.")
    peaks: bool = _f(True, "Measure the device's peaks once (cached in the store per GPU name), so reports give "
                     "speed-of-light fractions.")
    eval_config: EvalConfig | None = _f(None, "Evaluation settings (device, trials, ...); profile is overridden.")
    environment: dict[str, Any] | None = _f(None, "Machine whose stored results are used (gpu_name, torch_version, "
                                            "cuda_version, device_type); default: this one. A report made "
                                            "elsewhere takes it from the store (`stored_measurement`).")

    def __post_init__(self) -> None:
        if not self.release:
            raise ConfigError("AuditConfig.release is required: the path of a JSONL release")
        canonical_options(self.profile)  # a clear error for an unknown profile (an old spelling is its label)
        if self.batch_size < 1:
            raise ConfigError("batch_size must be >= 1")
        if not self.survive_fraction > 0:
            raise ConfigError("survive_fraction must be > 0")
        parse_chunk(self.chunk)
        if self.eval_config is None:
            object.__setattr__(self, "eval_config", EvalConfig())

    @property
    def release_name(self) -> str:
        return Path(self.release).stem

    @property
    def label(self) -> str:
        return audit_label(self.release_name, self.profile)

    def resolved_eval(self) -> EvalConfig:
        """The evaluation config with this audit's profile and the device made concrete (the device type of
        `environment` when set: reporting needs no GPU)."""
        cfg = dataclasses.replace(self.eval_config, profile=self.profile, policy="")  # the profile's policy
        device = self.environment["device_type"] if self.environment else resolve_device(cfg.device)
        return cfg.resolved(device)

    def to_dict(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "eval_config"}
        out["eval_config"] = self.eval_config.to_dict()
        return out


def audit_label(release_name: str, profile: str) -> str:
    """Store label of an audit: `audit:<release>:<profile>`."""
    return f"audit:{release_name}:{profile}"


@dataclass
class AuditOutcome:
    """What one audit invocation did, and the rows of every selected item evaluated so far."""

    label: str
    selected: list[Item]
    chunk: list[Item]
    evaluated: int = 0  # evaluated in this invocation
    reused: int = 0  # chunk items already in the store
    skipped_for_time: int = 0  # chunk items left for a later run
    rows: list[ResultRow] = field(default_factory=list)
    run_id: str | None = None

    @property
    def pending(self) -> int:
        """Selected items (any chunk) without a stored result."""
        return len(self.selected) - len(self.rows)


def record_published(store: Any, items: list[Item], release_name: str) -> None:
    """Store tasks and candidates with their published scores (first write of a candidate wins)."""
    table = dict(store.get_meta(PUBLISHED_META_PREFIX + release_name) or {})
    for task, cand in items:
        store.put_task(task.id, task.source, level=task.level, origin=task.origin)
        store.put_candidate(cand.source, task_id=task.id, origin=cand.origin,
                            meta={"published": cand.published, "release": release_name})
        table[cand.hash] = cand.published
    store.put_meta(PUBLISHED_META_PREFIX + release_name, table)


def stored_result(store: Any, task: Task, source_hash: str, cfg: EvalConfig,
                  environment: dict[str, Any] | None = None,
                  limits: dict[str, float] | None = None) -> tuple[str, EvalResult | None]:
    """(key, stored result or None) of a candidate under `cfg` on `environment`'s machine (default: this one).
    With `limits` (deciding what to evaluate), a timeout obtained under smaller limits is not returned;
    without them (reporting), every stored result is."""
    return store.lookup(task.hash, source_hash, cfg.protocol(), _machine(cfg, environment), limits=limits)


def _machine(cfg: EvalConfig, environment: dict[str, Any] | None) -> dict[str, Any]:
    """`environment`, else this machine's for `cfg.device`: whose stored results an audit reads."""
    if environment is not None:
        return environment

    return describe_machine(cfg.device)


def stored_measurement(store: Any, label: str, gpu: str | None = None) -> tuple[dict[str, Any], dict[str, Any]]:
    """(machine, protocol) that measured the most candidates under `label` (optionally only on GPUs named
    `gpu`), among results this version can look up: what a report made on another machine, or with other
    options, shows. ConfigError when there is none."""
    fields = {f.name for f in dataclasses.fields(EvalConfig)} - {"device"}  # the device type comes with the machine
    candidates: dict[str, set[tuple[str, str]]] = {}
    for row in store.query_evaluations(label=label, gpu_name=gpu):
        result = row["result"]
        protocol = result.get("protocol") or {}
        if not current_protocol(protocol):
            continue  # measured under another protocol version: its keys never match this one's
        group = canonical_json([key_environment(result.get("environment") or {}),
                                {k: v for k, v in protocol.items() if k in fields}])
        candidates.setdefault(group, set()).add((row["task_hash"], row["candidate_hash"]))
    if not candidates:
        where = f" on {gpu!r}" if gpu else ""
        raise ConfigError(f"the store holds no results of protocol version {PROTOCOL_VERSION} under {label!r}"
                          f"{where}: nothing to report")
    environment, protocol = json.loads(max(candidates, key=lambda g: len(candidates[g])))
    if not environment.get("device_type"):
        raise ConfigError(f"the results under {label!r} do not record their device type: re-evaluate them")
    return environment, protocol


def machine_name(environment: dict[str, Any]) -> str:
    """GPU (or device type), torch and CUDA versions of a stored environment, in one phrase."""
    return (f"{environment.get('gpu_name')} (torch {environment.get('torch_version')}, "
            f"CUDA {environment.get('cuda_version')})")


def measured_on(environment: dict[str, Any]) -> str:
    """One line naming the machine a report's results come from."""
    return f"reporting results measured on {machine_name(environment)}"


def report_only_config(config: AuditConfig, store: Any, gpu: str | None = None) -> AuditConfig:
    """`config` set to evaluate and measure nothing and to read the results of the machine and protocol that
    produced most of them (`stored_measurement`): the report can be made anywhere, without a GPU, and
    without repeating the measuring run's options."""
    environment, protocol = stored_measurement(store, config.label, gpu)
    eval_config = dataclasses.replace(config.eval_config, **protocol)
    return dataclasses.replace(config, environment=environment, eval_config=eval_config, time_budget_s=0.0,
                               baselines=(), chunk=None)


def _ensure_labelled(store: Any, key: str, result: EvalResult, task: Task, label: str, run_id: str | None) -> None:
    """A result reused from another label is stored again under the audit label (same key)."""
    if not store.query_evaluations(key=key, label=label):
        store.put_evaluation(result, task_hash=task.hash, key=key, label=label, run_id=run_id)


def _default_evaluate(*args: Any, **kwargs: Any) -> list[EvalResult]:
    return evaluate_many(*args, **kwargs)


def run_audit(config: AuditConfig, store: Any, *, evaluate: Evaluate | None = None,
              on_result: Callable[[Task, EvalResult], None] | None = None,
              on_baseline: Callable[..., None] | None = None) -> AuditOutcome:
    """Evaluate the chunk's items not yet in the store, then measure baselines, then collect all rows.

    `evaluate` has `evaluate_many`'s signature (tests pass a fake). Raises `SourceError` for an unreadable
    release and `ConfigError` for bad options; never for what a candidate does.
    """
    if store is None:
        raise ConfigError("an audit needs a results store (it is how runs resume)")
    started = time.monotonic()
    evaluate = evaluate or _default_evaluate
    cfg = config.resolved_eval()
    selected = _selection(config)
    todo = chunk_items(selected, parse_chunk(config.chunk))
    outcome = AuditOutcome(label=config.label, selected=selected, chunk=todo)
    outcome.run_id = store.start_run("audit", config.to_dict())
    record_published(store, todo, config.release_name)
    pending: list[Item] = []
    for task, cand in todo:
        key, hit = stored_result(store, task, cand.hash, cfg, config.environment, limits=cfg.limits())
        if hit is None or config.force:
            pending.append((task, cand))
        else:
            outcome.reused += 1
            _ensure_labelled(store, key, hit, task, config.label, outcome.run_id)
    measuring_here = evaluate is _default_evaluate and config.environment is None
    if measuring_here and config.peaks:
        _ensure_peaks(cfg, store)
    gpu_run = measuring_here and cfg.device.startswith("cuda") and bool(pending)
    with _audit_runners(cfg, len(pending)) if gpu_run else contextlib.nullcontext() as runners:
        if gpu_run and not _out_of_time(config, started):
            _build_all(pending, cfg, runners, should_cancel=lambda: _out_of_time(config, started))
        extra = {"runners": runners} if runners is not None else {}
        for start in range(0, len(pending), config.batch_size):
            if _out_of_time(config, started):
                outcome.skipped_for_time = len(pending) - start
                break
            pairs = [(t, c.source) for t, c in pending[start:start + config.batch_size]]
            report = None if on_result is None else (lambda i, result, pairs=pairs: on_result(pairs[i][0], result))
            evaluate(pairs, cfg, store=store, force=config.force, label=config.label, run_id=outcome.run_id,
                     on_result=report, **extra)
            outcome.evaluated += len(pairs)
    if config.baselines and not _out_of_time(config, started):
        _measure_baselines(config, cfg, store, todo, started, on_baseline)
    outcome.rows = audit_rows(store, selected, cfg, config.label, config.environment)
    store.finish_run(outcome.run_id, {"evaluated": outcome.evaluated, "reused": outcome.reused,
                                      "skipped_for_time": outcome.skipped_for_time, "rows": len(outcome.rows)})
    return outcome


def collect_audit(config: AuditConfig, store: Any) -> AuditOutcome:
    """The selection of `config` (chunk ignored) and the rows of its items already in the store, with the
    baselines stored by then; evaluates, measures and writes nothing. What a report after several
    differently-selected runs (a sample, then everything) shows."""
    selected = _selection(config)
    outcome = AuditOutcome(label=config.label, selected=selected, chunk=[])
    outcome.rows = audit_rows(store, selected, config.resolved_eval(), config.label, config.environment)
    return outcome


def asked_by_runs(store: Any, config: AuditConfig) -> dict[str, set[str]] | None:
    """Baseline kind -> ids of the tasks that the store's audit runs of `config`'s release and profile asked
    it for (each run's selection and chunk taken again from `config`'s release file), so a report counts each
    kind over its own tasks. None when no such run asked for a baseline."""
    asked: dict[str, set[str]] = {}
    pairs = None
    for run in store.list_runs("audit"):
        recorded = (store.get_run(run["run_id"]) or {}).get("config") or {}
        baselines = recorded.get("baselines") or []
        same = (Path(str(recorded.get("release", ""))).stem == config.release_name
                and recorded.get("profile") == config.profile)
        if not same or not baselines:
            continue
        pairs = pairs if pairs is not None else load_release(Path(config.release))
        chosen = select_items(pairs, levels=tuple(recorded.get("levels") or ()), seed=int(recorded.get("seed", 0)),
                              sample_per_level=recorded.get("sample_per_level"), limit=recorded.get("limit"))
        ids = {task.id for task, _ in chunk_items(chosen, parse_chunk(recorded.get("chunk")))}
        for kind in baselines:
            asked.setdefault(kind, set()).update(ids)
    return asked or None


def _selection(config: AuditConfig) -> list[Item]:
    return select_items(load_release(Path(config.release)), levels=config.levels,
                        sample_per_level=config.sample_per_level, seed=config.seed, limit=config.limit,
                        task_ids=config.tasks)


def _audit_runners(cfg: EvalConfig, n: int) -> Any:
    """One supply of warm runners for every batch of the audit (a supply per batch waited ~9 s for its
    first runner each time, once the builds were done ahead)."""

    return runner_supply(cfg.device, n)


def _build_all(pending: list[Item], cfg: EvalConfig, runners: Any, should_cancel: Callable[[], bool]) -> None:
    """Build every pending `load_inline` candidate in one parallel pass (the batches then find them built:
    a batch waited for its own slowest build, once per batch), with the first runners starting meanwhile;
    the GPU is idle during the pass, so builds made lazily in `forward` are triggered there too.
    A failure here costs only time: each candidate then builds in its own evaluation."""

    runners.fill()
    try:
        prebuild([(t, c.source) for t, c in pending], cfg, should_cancel=should_cancel, warm_lazy=True)
    except Exception:  # noqa: BLE001 - see the docstring
        logger.warning("the audit's build pass failed; candidates build when evaluated", exc_info=True)


def _ensure_peaks(cfg: EvalConfig, store: Any) -> None:
    """The device's peaks in the store (measured once per GPU name); a failed probe only costs the report
    its speed-of-light fractions."""

    try:
        measure_peaks(cfg.device, store)
    except Exception:  # noqa: BLE001 - see the docstring
        logger.warning("peak probe failed: the report will have no speed-of-light fractions", exc_info=True)


def _out_of_time(config: AuditConfig, started: float) -> bool:
    return config.time_budget_s is not None and time.monotonic() - started > config.time_budget_s


def _measure_baselines(config: AuditConfig, cfg: EvalConfig, store: Any, items: list[Item], started: float,
                       on_baseline: Callable[..., None] | None) -> None:
    tasks = list({t.hash: t for t, _ in items}.values())
    ensure_baselines(tasks, config.baselines, cfg, store=store, on_result=on_baseline,
                     should_stop=lambda: _out_of_time(config, started))


def audit_rows(store: Any, items: list[Item], cfg: EvalConfig, label: str,
               environment: dict[str, Any] | None = None) -> list[ResultRow]:
    """Rows of the items with a stored result under `cfg` on `environment`'s machine (default: this one), in
    selection order."""
    rows = []
    for task, cand in items:
        _, result = stored_result(store, task, cand.hash, cfg, environment)
        if result is not None:
            rows.append(row_from_result(result, task, label=label, published=cand.published, store=store))
    return rows


def report_audit(outcome: AuditOutcome, config: AuditConfig, store: Any, out_dir: str | Path, *,
                 plots: bool = True, compare_profiles: bool = True,
                 asked: Mapping[str, Collection[str]] | None = None) -> dict[str, Path]:
    """Write the audit's report (see `write_audit_outputs`); the other profiles' stored runs of the same
    release are added as extra labels, so strict and cuda-l1 verdicts appear side by side. `asked` (baseline
    kind -> the task ids it was asked for) makes the coverage section count each baseline over its own tasks
    (e.g. the CUDA graph for every task, torch.compile for a sample)."""

    rows = list(outcome.rows)
    others = []
    if compare_profiles:
        others = [lb for lb in stored_labels(store) if lb.startswith(f"audit:{config.release_name}:")
                  and lb != outcome.label]
        selected_ids = {t.id for t, _ in outcome.selected}
        rows += [row for row in rows_from_store(store, others) if row.task_id in selected_ids]
    cfg = config.resolved_eval()
    machine = _machine(cfg, config.environment)
    meta = {"release": config.release, "profile": config.profile, "device": cfg.device,
            "machine": machine_name(machine),
            "selected": len(outcome.selected), "evaluated so far": len(outcome.rows),
            "pending": outcome.pending, "compared with": ", ".join(others) or "-",
            "protocol": cfg.protocol()}
    extra = {"config": config.to_dict(), "pending": outcome.pending, "label": outcome.label}
    coverage = baseline_coverage(store, [t for t, _ in outcome.selected], cfg, machine, asked=asked)
    return write_audit_outputs(rows, out_dir, title=f"Audit of {config.release_name} ({config.profile})",
                               meta=meta, fraction=config.survive_fraction, plots=plots, extra=extra,
                               coverage=coverage)


def baseline_coverage(store: Any, tasks: list[Task], cfg: EvalConfig,
                      environment: dict[str, Any] | None = None,
                      asked: Mapping[str, Collection[str]] | None = None) -> dict[str, Any]:
    """Which baselines the store holds for `tasks` under `cfg` on `environment`'s machine (default: this
    one): per kind, tasks measured / failed / not measured, and each failure's reason. Eager is left out:
    every evaluation times the reference beside its candidate. With `asked` (kind -> task ids), each kind
    counts only the tasks it was asked for, and says how many that is ("asked"). `null_test`: the measured
    speedups of the eager baseline (the reference timed against itself), the protocol's bias and noise.
    `per_task`: task id -> kind -> the stored baseline (eager included), what `cudal1 baseline` prints."""

    environment = _machine(cfg, environment)
    unique = list({t.hash: t for t in tasks}.values())
    kinds = {kind: {"measured": 0, "failed": 0, "not_measured": 0} for kind in baseline_kind_names()
             if kind != "eager"}
    if asked is not None:
        for kind, counts in kinds.items():
            counts["asked"] = sum(t.id in asked.get(kind, ()) for t in unique)
    failures = []
    null_test = []
    per_task: dict[str, dict[str, dict[str, Any]]] = {}
    for task in unique:
        records = load_baselines(store, task.hash, environment, cfg.protocol())
        if records:
            per_task[task.id] = {kind: {k: v for k, v in record.to_dict().items() if k in _PER_TASK_FIELDS}
                                 for kind, record in records.items()}
        if "eager" in records:
            null_test.append(records["eager"])
        for kind, counts in kinds.items():
            if asked is not None and task.id not in asked.get(kind, ()):
                continue
            record = records.get(kind)
            if record is None:
                counts["not_measured"] += 1
            elif record.ok:
                counts["measured"] += 1
            else:
                counts["failed"] += 1
                failures.append({"task_id": task.id, "baseline": kind, "reason": record.reason})
    return {"tasks": len(unique), "kinds": kinds, "failures": failures,
            "null_test": sorted(r.measured_speedup for r in null_test if r.ok and r.measured_speedup),
            "null_test_summary": null_test_summary(null_test), "per_task": per_task}


#: What an audit's outputs keep of each baseline record.
_PER_TASK_FIELDS = ("status", "ms", "speedup_vs_eager", "ref_ms", "measured_speedup", "reason")
