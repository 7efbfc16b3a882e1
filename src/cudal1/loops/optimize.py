"""`optimize`: CUDA-L1's iterative contrastive loop on one task, resumable, ending with a verified best file.

Each round asks the LLM for `samples` completions in parallel, extracts the candidate of each (a completion
without code is an UNPARSEABLE verdict, stored too), evaluates them (an evaluator pool when given, else
this machine), and adds every correct one to the per-task exemplar database with its speedup. Prompts:
while the database holds no exemplar for the task, the plain prompt; afterwards CUDA-L1's contrastive
prompt with exemplars drawn by the configured sampler (bucket by default, N=2) for each sample. With
`feedback` on, the previous round's most informative failure (compile log, runtime error, worst
mismatch; trimmed) is appended to every prompt of the next round. The database is seeded with the correct
candidates the results store already knows for this task (same reference source, same device type).

Resuming: a run is named by a hash of what decides its samples (task source, model, form, samples per
round, sampler, feedback, seed, evaluation protocol; or `run_name`), not by `rounds`, so rerunning the
same command after an interruption continues where it stopped (finished samples are not regenerated
nor re-evaluated), and rerunning it with more rounds extends the run. See `cudal1.loops.common.RunJournal`.

A failed LLM request is a failed generation (logged, not evaluated, counted per round); the loop goes on,
unless every request this invocation sent in a round failed (a server down, a wrong key or model name):
then it stops and says why. A resumed run does not send failed requests again; its next round does.
At the end the best correct candidate is written to `out` (default `<task name>_best.py`) with a header
(verdict, speedup vs eager and every cached baseline, kernel class) and a JSON sidecar.

Limits: one task per call; rounds are sequential (generation of round r+1 needs round r's results);
speedups of exemplars measured on another device type are not shown (they would mislead the model).
"""

from __future__ import annotations

import dataclasses
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cudal1.core.errors import ConfigError
from cudal1.core.types import EvalResult, Status
from cudal1.eval.config import EvalConfig, resolve_device
from cudal1.exemplars import SAMPLERS, ExemplarDB, ScoredCode, make_sampler
from cudal1.llm import LLMConfig, build_contrastive_prompt, build_plain_prompt
from cudal1.llm.prompts import DEFAULT_PROMPT_TOKEN_BUDGET, FORMS
from cudal1.loops.common import (
    GENERATION_ERROR,
    CandidateEvaluator,
    RunJournal,
    SampleRecord,
    detect_form,
    evaluate_records,
    feedback_from,
    generate_records,
    stable_hash,
)
from cudal1.tasks.task import Task

logger = logging.getLogger(__name__)

CUDA_BASELINES = ("torch_compile", "torch_compile_reduce_overhead", "cuda_graph")


def _f(default: Any, help: str) -> Any:
    return field(default=default, metadata={"help": help})


@dataclass
class OptimizeConfig:
    """Settings of one `optimize` run (the task itself is an argument of `optimize`)."""

    llm: LLMConfig | str = field(metadata={"help": "The model: an LLMConfig or its spec, e.g. "
                                                   "'openai:MODEL@http://127.0.0.1:8000/v1' or 'hf:PATH'."})
    rounds: int = _f(4, "Rounds of generate -> evaluate -> update the exemplar database.")
    samples: int = _f(8, "Completions requested in parallel per round.")
    sampler: str = _f("bucket", "Exemplar sampler of the contrastive prompt: bucket (the paper), island, random.")
    sampler_options: dict[str, Any] = field(default_factory=dict, metadata={
        "help": "Settings of the sampler's config (e.g. {'n': 2, 'bucket_width': 0.1, 'temperature': 1.0})."})
    form: str = _f("raw_cuda", "Candidate form asked for: raw_cuda (NVRTC, builds in < 1 s) or load_inline.")
    eval: EvalConfig = field(default_factory=EvalConfig, metadata={
        "help": "How candidates are evaluated (device, profile, trials, timing protocol)."})
    feedback: bool = _f(True, "Append the previous round's most informative failure to the next prompts.")
    seed: int = _f(0, "Seed of exemplar sampling (each round and sample derive their own).")
    out: str | None = _f(None, "Where the best candidate is written (default: <task name>_best.py); "
                               "a JSON sidecar goes next to it.")
    run_name: str = _f("", "Name of the run to create or continue (default: derived from the settings).")
    resume: bool = _f(True, "Continue the run an earlier identical command started; False starts afresh.")
    exemplar_db: str | None = _f(None, "Exemplar database file (default: the results store's file).")
    seed_from_store: bool = _f(True, "Seed the exemplar database with correct candidates the store knows.")
    baselines: str = _f("auto", "Baselines to measure for the best candidate's header: auto (torch.compile "
                                "x2 and CUDA graph on a GPU, none on CPU), none, or a comma list.")
    time_budget_s: float = _f(0.0, "Stop starting rounds and evaluations after this many seconds (0: none).")
    prompt_token_budget: int = _f(DEFAULT_PROMPT_TOKEN_BUDGET, "Token budget of a contrastive prompt.")
    label: str = _f("", "Label of the stored evaluations (default: optimize:<model>).")

    def __post_init__(self) -> None:
        if isinstance(self.llm, str):
            self.llm = LLMConfig(spec=self.llm)
        if isinstance(self.eval, dict):
            self.eval = EvalConfig.from_dict(self.eval)
        if self.rounds < 1 or self.samples < 1:
            raise ConfigError(f"set rounds >= 1 and samples >= 1 (got {self.rounds} and {self.samples})")
        if self.sampler not in SAMPLERS:
            raise ConfigError(f"unknown sampler {self.sampler!r}: choose one of {', '.join(sorted(SAMPLERS))}")
        if self.form not in FORMS:
            raise ConfigError(f"unknown form {self.form!r}: choose one of {', '.join(FORMS)}")
        if self.time_budget_s < 0:
            raise ConfigError("time_budget_s must be >= 0 (0 means no budget)")
        try:
            make_sampler(self.sampler, dict(self.sampler_options))
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"bad sampler_options for {self.sampler}: {exc}") from None
        baseline_kinds(self.baselines, "cuda")  # validates the names

    def to_dict(self) -> dict[str, Any]:
        """The fully resolved config, JSON-ready (stored with the run and in the sidecar)."""
        return dataclasses.asdict(self)

    def run_key(self, task: Task) -> str:
        """The name of the run this config continues on `task` (see the module docstring)."""
        if self.run_name:
            return stable_hash({"name": self.run_name, "task": task.hash})
        assert isinstance(self.llm, LLMConfig)
        return stable_hash({"task": task.hash, "llm": self.llm.spec, "form": self.form, "samples": self.samples,
                            "sampler": self.sampler, "sampler_options": self.sampler_options,
                            "feedback": self.feedback, "seed": self.seed, "protocol": self.eval.protocol()})


def baseline_kinds(spec: str, device: str) -> list[str]:
    """The baseline kinds `spec` asks to measure on `device` (eager is the speedup itself)."""
    spec = spec.strip()
    if spec in ("", "none"):
        return []
    if spec == "auto":
        return list(CUDA_BASELINES) if device.startswith("cuda") else []
    from cudal1.baselines import parse_kinds

    return [k for k in parse_kinds(spec) if k != "eager"]


@dataclass(frozen=True)
class ProgressEvent:
    """What `optimize` reports while it runs: a round starts or ends, or one sample has its verdict."""

    kind: str  # "round_start" | "sample" | "round_end"
    round: int
    rounds: int
    samples: int
    key: str = ""
    status: str | None = None
    speedup: float | None = None
    best_speedup: float | None = None


@dataclass
class RoundSummary:
    """One round: how its samples fared and the best speedup so far."""

    round: int
    prompt_kind: str  # "plain" | "contrastive"
    with_feedback: bool
    samples: int
    reused: int  # samples generated by an earlier invocation (resume), not asked again
    generation_errors: int
    statuses: dict[str, int]
    best_speedup: float | None  # best of this round
    best_so_far: float | None


@dataclass
class OptimizeResult:
    """The outcome of `optimize`: the best verified candidate (if any), per-round history, output files."""

    task_id: str
    run_id: str
    best_source: str | None
    best_result: EvalResult | None
    best_origin: dict[str, Any]
    history: list[RoundSummary]
    resumed: bool
    stopped: str = ""  # why the run stopped early ("time budget"), "" when all rounds ran
    out_path: Path | None = None
    sidecar_path: Path | None = None
    evaluated: int = 0  # candidates evaluated by this invocation (cache hits included)
    llm_usage: dict[str, int] = field(default_factory=dict)

    @property
    def best_speedup(self) -> float | None:
        return self.best_result.speedup if self.best_result else None

    def to_dict(self) -> dict[str, Any]:
        return {"task_id": self.task_id, "run_id": self.run_id, "best_speedup": self.best_speedup,
                "best_result": self.best_result.to_dict() if self.best_result else None,
                "best_origin": self.best_origin, "history": [dataclasses.asdict(h) for h in self.history],
                "resumed": self.resumed, "stopped": self.stopped,
                "out_path": str(self.out_path) if self.out_path else None,
                "sidecar_path": str(self.sidecar_path) if self.sidecar_path else None,
                "evaluated": self.evaluated, "llm_usage": self.llm_usage}


ProgressFn = Callable[[ProgressEvent], None]


def optimize(task: Task, config: OptimizeConfig, *, backend: Any = None, store: Any = None, pool: Any = None,
             progress: ProgressFn | None = None) -> OptimizeResult:
    """Run (or continue) the contrastive loop on `task`; see the module docstring.

    `backend` defaults to `make_backend(config.llm)`; `store` (a `ResultsStore`) makes the run resumable
    and caches evaluations; `pool` (a `cudal1.service` pool) evaluates instead of this machine; `progress`
    is called with a `ProgressEvent` as rounds and samples finish (an exception raised there stops the
    run, which a rerun then continues).
    """
    loop = _OptimizeLoop(task, config, backend=backend, store=store, pool=pool, progress=progress)
    try:
        return loop.run()
    finally:
        loop.close()


class _OptimizeLoop:
    """The state of one `optimize` call (split out so that each step stays short)."""

    def __init__(self, task: Task, config: OptimizeConfig, *, backend: Any, store: Any, pool: Any,
                 progress: ProgressFn | None):
        from cudal1.llm import make_backend

        assert isinstance(config.llm, LLMConfig)
        self.task, self.config, self.store, self.progress = task, config, store, progress
        self.backend = backend if backend is not None else make_backend(config.llm)
        self.device = resolve_device(config.eval.device)
        self.device_type = self.device.split(":")[0]
        self.started_s = time.monotonic()
        self.journal = RunJournal(store, "optimize", config.run_key(task), config.to_dict(), resume=config.resume)
        self._tmp: Any = None
        self.exemplars = ExemplarDB(self._exemplar_path())
        self.sampler = make_sampler(config.sampler, dict(config.sampler_options), rng=config.seed)
        label = config.label or f"optimize:{getattr(self.backend, 'model', '') or config.llm.spec}"
        self.evaluator = CandidateEvaluator(config.eval, store=store, pool=pool, label=label,
                                            run_id=self.journal.run_id)
        self.best: tuple[str, EvalResult, dict[str, Any]] | None = None

    def _exemplar_path(self) -> Path:
        if self.config.exemplar_db:
            return Path(self.config.exemplar_db)
        if self.store is not None:
            return Path(self.store.path)
        import tempfile

        self._tmp = tempfile.TemporaryDirectory(prefix="cudal1-exemplars-")
        return Path(self._tmp.name) / "exemplars.sqlite"

    def close(self) -> None:
        self.evaluator.close()
        if self._tmp is not None:
            self._tmp.cleanup()

    def over_budget(self) -> bool:
        budget = self.config.time_budget_s
        return bool(budget) and time.monotonic() - self.started_s > budget

    def _emit(self, kind: str, round_: int, **fields: Any) -> None:
        if self.progress is not None:
            best = self.best[1].speedup if self.best else None
            self.progress(ProgressEvent(kind, round_, self.config.rounds, self.config.samples,
                                        best_speedup=best, **fields))

    def run(self) -> OptimizeResult:
        if self.config.seed_from_store and self.store is not None:
            self._seed_from_store()
        history: list[RoundSummary] = []
        stopped = ""
        previous: list[SampleRecord] = []
        for round_ in range(1, self.config.rounds + 1):
            if self.over_budget():
                stopped = "time budget"
                break
            previous, sent = self._run_round(round_, previous, history)
            if self.over_budget() and any(r.status is None for r in previous):
                stopped = "time budget"
                break
            failed = [r.error for r in sent if r.error is not None]
            if sent and len(failed) == len(sent):
                # Every request sent in this round failed after its retries: more rounds would only repeat
                # that, at the retries' cost each.
                stopped = f"the LLM backend failed every request of round {round_}: {failed[0]}"
                break
        return self._finish(history, stopped)

    # -------------------------------------------------------------------------------------- seeding
    def _seed_from_store(self) -> None:
        """Add the correct candidates the store knows for this task (same source, device type) as exemplars."""
        from cudal1.baselines import LABEL_PREFIX

        rows = self.store.query_evaluations(task_id=self.task.id, status=Status.CORRECT,
                                            latest_per_task_candidate=True)
        added = 0
        for row in rows:
            if row["task_hash"] != self.task.hash or str(row.get("label") or "").startswith(LABEL_PREFIX):
                continue
            result = EvalResult.from_dict(row["result"])
            if result.speedup is None or not self._comparable(result):
                continue
            candidate = self.store.get_candidate(row["candidate_hash"])
            if candidate is None:
                continue
            self._add_exemplar(candidate["source"], result, {"origin": "store", "run_id": row.get("run_id")})
            self._consider_best(candidate["source"], result, {"origin": "store", "run": row.get("run_id")})
            added += 1
        if added:
            logger.info("seeded the exemplar database of %s with %d known correct candidates", self.task.id, added)

    def _comparable(self, result: EvalResult) -> bool:
        """Measured like this run measures: same device type, correctness profile and problem sizes."""
        sizes = self.config.eval.resolved(self.device).sizes
        return (result.environment.get("device_type") == self.device_type
                and result.protocol.get("profile") == self.config.eval.profile
                and result.protocol.get("sizes") == sizes)

    def _add_exemplar(self, code: str, result: EvalResult, meta: dict[str, Any]) -> None:
        if result.speedup is None:
            return
        meta = {**meta, "task_hash": self.task.hash, "device_type": self.device_type, "form": detect_form(code)}
        self.exemplars.add(self.task.id, code, float(result.speedup), meta)

    def _consider_best(self, code: str, result: EvalResult, origin: dict[str, Any]) -> None:
        if result.status is not Status.CORRECT or result.speedup is None:
            return
        if self.best is None or result.speedup > (self.best[1].speedup or 0.0):
            self.best = (code, result, origin)

    def _exemplar_pool(self) -> list[ScoredCode]:
        """This task's exemplars that fit: same reference source and device type, not the other CUDA form."""
        other = {"raw_cuda": "load_inline", "load_inline": "raw_cuda"}[self.config.form]
        pool = []
        for ex in self.exemplars.list(self.task.id):
            if ex.meta.get("task_hash", self.task.hash) != self.task.hash:
                continue
            if ex.meta.get("device_type", self.device_type) != self.device_type:
                continue
            if detect_form(ex.code) == other:
                continue
            pool.append(ex)
        return pool

    # ---------------------------------------------------------------------------------------- rounds
    def _run_round(self, round_: int, previous: list[SampleRecord],
                   history: list[RoundSummary]) -> tuple[list[SampleRecord], list[SampleRecord]]:
        """(the round's records, those generated by this invocation)."""
        keys = [f"r{round_}/s{s}" for s in range(self.config.samples)]
        records = {k: self.journal.load(k) for k in keys}
        reused = sum(r is not None for r in records.values())
        feedback = None
        if self.config.feedback:
            feedback = feedback_from([r.eval_result for r in previous if r.eval_result is not None
                                      and r.status != Status.CORRECT.value])
        pool = self._exemplar_pool()
        self._emit("round_start", round_)
        for key in keys:  # samples finished by an earlier invocation count towards the progress too
            record = records[key]
            if record is not None and self.journal.is_done(key):
                self._emit("sample", round_, key=key, status=record.status, speedup=record.speedup)
        todo = [k for k in keys if records[k] is None]
        sent = self._generate(round_, todo, pool, feedback) if todo else []
        for record in sent:
            records[record.key] = record
        ordered = [records[k] for k in keys]
        self._evaluate(round_, [r for r in ordered if r is not None and not self.journal.is_done(r.key)])
        done = [r for r in ordered if r is not None]
        history.append(self._summary(round_, done, reused, "contrastive" if pool else "plain", feedback))
        self._emit("round_end", round_)
        return done, sent

    def _prompt(self, round_: int, sample: int, pool: list[ScoredCode], feedback: str | None) -> list[dict]:
        form = self.config.form
        if not pool:
            return build_plain_prompt(self.task.source, form=form, feedback=feedback)
        self.sampler.rng = random.Random(f"{self.config.seed}:{self.task.id}:{round_}:{sample}")
        shown = self.sampler.sample(pool, task_id=self.task.id)
        return build_contrastive_prompt(self.task.source, shown, form=form, feedback=feedback,
                                        token_budget=self.config.prompt_token_budget)

    def _generate(self, round_: int, keys: list[str], pool: list[ScoredCode],
                  feedback: str | None) -> list[SampleRecord]:
        prompts = [self._prompt(round_, int(k.rsplit("s", 1)[1]), pool, feedback) for k in keys]
        return generate_records(self.backend, keys, prompts, [self.task.id] * len(keys), self.journal)

    def _evaluate(self, round_: int, records: list[SampleRecord]) -> None:
        """Verdicts for the records not yet done; correct ones enter the exemplar database."""

        def on_verdict(record: SampleRecord, result: EvalResult | None) -> None:
            if result is not None and result.status is Status.CORRECT and record.code is not None:
                origin = {"run": self.journal.run_id, "round": round_, "sample": record.key, "model": record.model}
                self._add_exemplar(record.code, result, {"model": record.model, "run_id": self.journal.run_id,
                                                          "round": round_})
                self._consider_best(record.code, result, origin)
            self.journal.save(record)
            self.journal.mark_done(record.key)
            self._emit("sample", round_, key=record.key, status=record.status, speedup=record.speedup)

        evaluate_records(records, {self.task.id: self.task}, self.evaluator, on_verdict,
                         should_stop=self.over_budget)

    def _summary(self, round_: int, records: list[SampleRecord], reused: int, prompt_kind: str,
                 feedback: str | None) -> RoundSummary:
        statuses: dict[str, int] = {}
        for record in records:
            if record.status is not None:
                statuses[record.status] = statuses.get(record.status, 0) + 1
            if record.correct and record.eval_result is not None:  # samples of an earlier invocation too
                self._consider_best(record.code or "", record.eval_result,
                                    {"run": self.journal.run_id, "round": round_, "sample": record.key,
                                     "model": record.model})
        speedups = [r.speedup for r in records if r.correct and r.speedup is not None]
        return RoundSummary(round=round_, prompt_kind=prompt_kind, with_feedback=bool(feedback),
                            samples=len(records), reused=reused,
                            generation_errors=statuses.get(GENERATION_ERROR, 0), statuses=statuses,
                            best_speedup=max(speedups) if speedups else None,
                            best_so_far=self.best[1].speedup if self.best else None)

    # ---------------------------------------------------------------------------------------- finish
    def _finish(self, history: list[RoundSummary], stopped: str) -> OptimizeResult:
        result = OptimizeResult(task_id=self.task.id, run_id=self.journal.run_id, best_source=None,
                                best_result=None, best_origin={}, history=history, resumed=self.journal.resumed,
                                stopped=stopped, evaluated=self.evaluator.evaluated,
                                llm_usage=self._usage())
        if self.best is not None:
            source, best, origin = self.best
            best = self._with_baselines(best)
            result.best_source, result.best_result, result.best_origin = source, best, origin
            result.out_path, result.sidecar_path = self._write(source, best, origin, history)
        self.journal.finish({"best_speedup": result.best_speedup, "rounds": len(history), "stopped": stopped,
                             "out_path": str(result.out_path) if result.out_path else None})
        return result

    def _usage(self) -> dict[str, int]:
        usage = getattr(self.backend, "usage", None)
        return usage.to_dict() if hasattr(usage, "to_dict") else {}

    def _with_baselines(self, best: EvalResult) -> EvalResult:
        if self.store is None:
            return best
        from cudal1.baselines import attach_baselines, ensure_baselines

        kinds = baseline_kinds(self.config.baselines, self.device)
        if kinds:
            ensure_baselines([self.task], kinds, self.config.eval, store=self.store)
        return attach_baselines(best, self.task, self.store)

    def _write(self, source: str, best: EvalResult, origin: dict[str, Any],
               history: list[RoundSummary]) -> tuple[Path, Path]:
        from cudal1.loops.output import write_candidate

        path = Path(self.config.out) if self.config.out else Path(f"{self.task.name}_best.py")
        sidecar = {"run_id": self.journal.run_id, "history": [dataclasses.asdict(h) for h in history],
                   "config": self.config.to_dict()}
        return write_candidate(path, self.task, source, best, provenance=origin, sidecar=sidecar)


__all__ = ["OptimizeConfig", "OptimizeResult", "ProgressEvent", "RoundSummary", "baseline_kinds", "optimize"]
