"""Measure, cache and apply baselines: every speedup cudal1 reports can be read against each of them.

`measure_baseline(task, kind, config, store=...)` evaluates the generated baseline candidate
(`cudal1.baselines.variants`) through `evaluate_candidate`, i.e. in an isolated runner with the evaluator's
paired protocol against eager, with static analysis skipped (the code is ours) and, for `tf32`, the looser
profile. The baseline's time is the candidate time of that evaluation and its speedup vs eager the measured
speedup. The outcome is cached with `ResultsStore.put_baseline` under

    (task source hash, kind, environment_key(GPU name, torch, CUDA, device type), baseline protocol version)

where the protocol version is `PROTOCOL_VERSION` and `WRAPPER_VERSION` plus the problem sizes and a short
hash of the protocol fields that change what a time means (L2 flush, input rotation), not those that only
change its precision (buckets, iterations, trials) or the verdict (profile). Failures (capture illegal, compile error, a
CUDA-only kind on CPU) are cached too, with `status="failed"` and a one-line `reason`, so reports can name
them; the `ms` column then holds 0.0 (it cannot be NULL) and must be ignored.

`attach_baselines(result, task, store)` fills `result.baselines[name]` = result.speedup / speedup_vs_eager
of each cached, successful baseline (eager itself is the result's own `speedup`). This ratio of ratios uses
two paired measurements (candidate vs eager, baseline vs eager), each robust to clock and load drift
between runs, instead of dividing absolute times taken at different moments; it assumes eager's time is
the same in both runs, which the paired protocol makes the common reference.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from cudal1.baselines.variants import baseline_source, eval_profile, parse_kinds
from cudal1.baselines.warm import COMPILE_KINDS, warm_compile_caches
from cudal1.core.baselines import cuda_only_kinds
from cudal1.core.machine import describe_machine
from cudal1.core.types import EvalResult, Status
from cudal1.eval.config import PROTOCOL_VERSION, EvalConfig, resolve_device
from cudal1.eval.pipeline import evaluate_candidate
from cudal1.eval.scheduler import runner_supply
from cudal1.store.keys import environment_key
from cudal1.tasks.task import Task

logger = logging.getLogger(__name__)

#: Store label of the evaluations behind baselines: `baseline:<kind>`.
LABEL_PREFIX = "baseline:"

# Rationale: these protocol fields change what a measured time means (cold vs warm cache, fp32 numerics); the others only change how precisely it is measured or what
# counts as correct.
MEANING_KEYS: tuple[str, ...] = ("flush_l2", "exact_fp32")

OK, FAILED = "ok", "failed"


#: Bumped whenever a generated baseline wrapper changes what it times (2: bound CUDA graphs, no output clones;
#: 4: a CUDA graph bound to input addresses that come back, so the evaluator's slots are read without a copy;
#: its copying path returns clones).
WRAPPER_VERSION = 4


def baseline_protocol_version(protocol: dict[str, Any]) -> str:
    """The protocol version baselines are cached under, from an `EvalConfig.protocol()`-style dict."""
    version = protocol.get("version", PROTOCOL_VERSION)
    sizes = protocol.get("sizes", "full")
    meaning = json.dumps({k: protocol.get(k) for k in MEANING_KEYS}, sort_keys=True)
    return f"{version}.w{WRAPPER_VERSION}-{sizes}-{hashlib.sha256(meaning.encode()).hexdigest()[:8]}"


@dataclass(frozen=True)
class BaselineRecord:
    """One baseline of one task on one machine: its time and speedup vs eager, or why it failed."""

    task_id: str
    task_hash: str
    name: str
    status: str  # "ok" | "failed"
    ms: float | None = None  # median per-call time (cold cache), None when failed
    speedup_vs_eager: float | None = None  # paired measurement vs eager; 1.0 for eager by definition
    ref_ms: float | None = None  # eager's time in the same measurement
    reason: str = ""  # one line when failed
    profile: str = ""  # correctness profile it was checked under
    eval_status: str = ""  # the evaluator's verdict
    measured_speedup: float | None = None  # the raw paired ratio (eager: the protocol's noise)
    cached: bool = False

    @property
    def ok(self) -> bool:
        return self.status == OK

    def to_extra(self) -> dict[str, Any]:
        """The `extra` JSON stored with the baseline row."""
        return {"task_id": self.task_id, "status": self.status, "speedup_vs_eager": self.speedup_vs_eager,
                "ref_ms": self.ref_ms, "reason": self.reason, "profile": self.profile,
                "eval_status": self.eval_status, "measured_speedup": self.measured_speedup}

    @classmethod
    def from_store(cls, task_hash: str, name: str, row: dict[str, Any]) -> BaselineRecord:
        """Rebuild from a `ResultsStore.list_baselines` entry."""
        extra = row.get("extra") or {}
        ok = extra.get("status", OK) == OK
        return cls(task_id=extra.get("task_id", ""), task_hash=task_hash, name=name,
                   status=OK if ok else FAILED, ms=row.get("ms") if ok else None,
                   speedup_vs_eager=extra.get("speedup_vs_eager"), ref_ms=extra.get("ref_ms"),
                   reason=extra.get("reason", ""), profile=extra.get("profile", ""),
                   eval_status=extra.get("eval_status", ""), measured_speedup=extra.get("measured_speedup"),
                   cached=True)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready dict."""
        return dataclasses.asdict(self)


def baseline_config(config: EvalConfig, kind: str) -> EvalConfig:
    """The evaluation config of a baseline: static analysis off, the kind's profile, device resolved, and the
    caller's fp32 numerics kept (a looser profile must not also change how eager itself computes)."""
    resolved = config.resolved(resolve_device(config.device))
    # A torch.compile baseline compiles inside its first call: on a cold cache that is a build (it can take
    # minutes), not a hung candidate, so its steps get the build's limit as their floor.
    floor = max(resolved.phase_floor_s, resolved.build_timeout_s) if kind in COMPILE_KINDS else resolved.phase_floor_s
    profile = eval_profile(kind, resolved.profile)
    policy = resolved.policy if profile == resolved.profile else ""  # a kind's own profile: that profile's policy
    return dataclasses.replace(resolved, profile=profile, policy=policy, skip_static=True,
                               exact_fp32=resolved.uses_exact_fp32, phase_floor_s=floor)


def _cache_coordinates(cfg: EvalConfig) -> tuple[str, str]:
    return environment_key(describe_machine(cfg.device)), baseline_protocol_version(cfg.protocol())


def _stored_baseline(store: Any, task: Task, kind: str, cfg: EvalConfig) -> dict[str, Any] | None:
    """The cached row of `kind` for `task` on this machine under the baseline config `cfg`, or None."""
    return store.get_baseline(task.hash, kind, *_cache_coordinates(cfg))


def record_from_result(task: Task, kind: str, result: EvalResult, profile: str) -> BaselineRecord:
    """Turn the evaluation of a baseline candidate into its record (failed unless correct and timed)."""
    if result.status is Status.CORRECT and result.timing is not None:
        measured = result.timing.speedup
        return BaselineRecord(task.id, task.hash, kind, OK, ms=result.timing.candidate_ms,
                              speedup_vs_eager=1.0 if kind == "eager" else measured,
                              ref_ms=result.timing.ref_ms, profile=profile, eval_status=result.status.value,
                              measured_speedup=measured)
    reason = (result.message or result.status.value).strip().splitlines()
    return BaselineRecord(task.id, task.hash, kind, FAILED, reason=f"{result.status.value}: {reason[0][:300]}"
                          if reason else result.status.value, profile=profile, eval_status=result.status.value)


def measure_baseline(task: Task, kind: str, config: EvalConfig | None = None, *, store: Any = None,
                     force: bool = False, runners: Any = None) -> BaselineRecord:
    """Time one baseline of `task` (or return it from the cache) and cache the outcome.

    `runners` is a `RunnerSupply` shared by a series of measurements (see `ensure_baselines`). Never
    raises for what the baseline does at run time: failures come back as a record with `status="failed"`
    and the reason.
    """
    cfg = baseline_config(config or EvalConfig(), kind)
    if store is not None and not force:
        hit = _stored_baseline(store, task, kind, cfg)
        if hit is not None:
            return BaselineRecord.from_store(task.hash, kind, hit)
    if kind in cuda_only_kinds() and not cfg.device.startswith("cuda"):
        record = BaselineRecord(task.id, task.hash, kind, FAILED, reason=f"{kind} needs a CUDA device",
                                profile=cfg.profile)
    else:
        # No output clones: the evaluator checks each output before the next call, and a clone would add a
        # device copy to the graph kinds that the reference does not pay.
        source = baseline_source(task, kind, cfg.sizes, clone_outputs=False)
        result = evaluate_baseline_source(task, source, cfg, store=store, force=force, kind=kind, runners=runners)
        record = record_from_result(task, kind, result, cfg.profile)
    if store is not None:
        store.put_baseline(task.hash, kind, *_cache_coordinates(cfg), record.ms or 0.0, extra=record.to_extra())
    if not record.ok:
        logger.info("baseline %s of %s failed: %s", kind, task.id, record.reason)
    return record


def evaluate_baseline_source(task: Task, source: str, cfg: EvalConfig, *, store: Any, force: bool,
                             kind: str, runners: Any = None) -> EvalResult:
    """Evaluate a generated baseline through the standard pipeline (stored under label `baseline:<kind>`)."""

    return evaluate_candidate(task, source, cfg, store=store, force=force, label=LABEL_PREFIX + kind,
                              runners=runners)


def ensure_baselines(tasks: Iterable[Task], kinds: Sequence[str], config: EvalConfig | None = None, *,
                     store: Any = None, force: bool = False,
                     on_result: Callable[[Task, str, BaselineRecord], None] | None = None,
                     should_stop: Callable[[], bool] | None = None) -> list[BaselineRecord]:
    """Measure every (task, kind) pair not yet cached (all of them with `force`); resumable.

    `kinds` are validated and deduplicated (`parse_kinds`). Returns the records in (task, kind) order;
    `on_result` is called after each (cached ones included). `should_stop` is asked before each pair (a
    time budget); the records so far are returned when it says stop. The kinds that need no compilation are
    measured first for every task, then the torch.compile kinds, after they compiled once in parallel
    (`cudal1.baselines.warm`) so that their timed runs find the caches filled: a budget that ends during
    the slow half still leaves the quick baselines complete. Evaluation runners are started ahead of need,
    as in `evaluate_many`, one supply for both halves.
    """

    tasks, config, kinds = list(tasks), config or EvalConfig(), parse_kinds(list(kinds))
    position = {kind: j for j, kind in enumerate(kinds)}
    quick = [k for k in kinds if k not in COMPILE_KINDS]
    slow = [k for k in kinds if k in COMPILE_KINDS]
    records: dict[tuple[int, int], BaselineRecord] = {}

    def measure(half: list[str], runners: Any) -> bool:
        """Measure the kinds of `half` for every task; False when told to stop."""
        for i, task in enumerate(tasks):
            for kind in half:
                if should_stop is not None and should_stop():
                    return False
                record = measure_baseline(task, kind, config, store=store, force=force, runners=runners)
                records[i, position[kind]] = record
                if on_result is not None:
                    on_result(task, kind, record)
        return True

    with runner_supply(resolve_device(config.device), len(tasks) * len(kinds),
                       hidden_files=[str(store.path)] if store is not None else None,
                       shared_compile_cache=True) as runners:
        if measure(quick, runners) and slow:
            _warm_compile_kinds(tasks, slow, config, store, force, should_stop)
            measure(slow, runners)
    return [records[key] for key in sorted(records)]


def _warm_compile_kinds(tasks: list[Task], kinds: Sequence[str], config: EvalConfig, store: Any, force: bool,
                        should_stop: Callable[[], bool] | None) -> None:
    """Fill torch.compile's caches in parallel for the compile kinds about to be measured (two or more)."""

    pending = []
    for kind in kinds:
        cfg = baseline_config(config, kind)
        pending += [(t, kind) for t in tasks if force or store is None or _stored_baseline(store, t, kind, cfg) is None]
    if len(pending) > 1:
        warm_compile_caches(pending, baseline_config(config, pending[0][1]), should_stop=should_stop)


def load_baselines(store: Any, task_hash: str, environment: dict[str, Any],
                   protocol: dict[str, Any]) -> dict[str, BaselineRecord]:
    """Cached baselines of a task for the machine of `environment` and the protocol of `protocol`."""
    rows = store.list_baselines(task_hash, environment_key(environment), baseline_protocol_version(protocol))
    return {name: BaselineRecord.from_store(task_hash, name, row) for name, row in rows.items()}


def baseline_cell(record: BaselineRecord | None, reason_chars: int = 40) -> str:
    """A baseline as `cudal1 baseline` and audit reports show it: 'ms (speedup vs eager x)', 'failed: reason'
    (cut to `reason_chars`), or '-' when none is stored."""
    if record is None:
        return "-"
    if not record.ok:
        reason = " ".join(record.reason.split())[:reason_chars].rstrip()
        return f"failed: {reason}" if reason else "failed"
    ms = "-" if record.ms is None else f"{record.ms:.3f}"
    speedup = "-" if record.speedup_vs_eager is None else f"{record.speedup_vs_eager:.2f}"
    return f"{ms} ({speedup}x)"


def null_test_summary(records: Iterable[BaselineRecord]) -> str | None:
    """One sentence on the protocol's null test: the eager baseline's measured speedups (the reference timed
    as a candidate against itself: 1.00x would be no bias) over the given records, and how far their median
    lies from 1.00x, as measured, not as hoped (the 29 built-in tasks on shared 2-core CPUs: medians of 0.95x
    and 0.983x, docs/log.md 2026-12-07); None without any."""
    xs = sorted(r.measured_speedup for r in records if r.name == "eager" and r.ok and r.measured_speedup)
    if not xs:
        return None
    q = statistics.quantiles(xs, n=20, method="inclusive") if len(xs) > 1 else [xs[0]] * 19
    median = statistics.median(xs)
    lean = "within 1 % of it" if abs(median - 1.0) < 0.01 else \
        f"{abs(median - 1.0):.0%} {'low' if median < 1.0 else 'high'}: speedups here lean that way"
    return (f"Null test (the reference timed as a candidate against itself; no bias would read 1.00x), {len(xs)} "
            f"task(s): median {median:.3f}x ({lean}), p5 {q[0]:.3f}x, p95 {q[-1]:.3f}x "
            f"(min {xs[0]:.3f}x, max {xs[-1]:.3f}x).")


def speedups_vs_baselines(speedup: float, records: dict[str, BaselineRecord]) -> dict[str, float]:
    """speedup vs eager -> speedup vs each successful non-eager baseline (the ratio of paired ratios)."""
    out = {}
    for name, record in records.items():
        if name == "eager" or not record.ok or not record.speedup_vs_eager:
            continue
        out[name] = speedup / record.speedup_vs_eager
    return out


def attach_baselines(result: EvalResult, task: Task | str, store: Any,
                     records: dict[str, BaselineRecord] | None = None) -> EvalResult:
    """The result with `baselines` = its speedup vs every cached baseline of its task and machine.

    `task` is the Task or its source hash; `records` the task's baselines when the caller already loaded
    them (`load_baselines` for the result's machine and protocol). A result without a speedup (not correct)
    is returned unchanged; entries already in `result.baselines` are kept unless a cached baseline of the
    same name replaces them.
    """
    if store is None or result.speedup is None:
        return result
    if records is None:
        task_hash = task if isinstance(task, str) else task.hash
        records = load_baselines(store, task_hash, result.environment, result.protocol)
    found = speedups_vs_baselines(result.speedup, records)
    if not found:
        return result
    return result.replace(baselines={**result.baselines, **found})
