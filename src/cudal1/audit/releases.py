"""What an audit of several releases says, assembled from its committed records alone (no store, no GPU).

    from cudal1.audit.releases import collect
    audits = collect("docs/audit/cuda-l1-releases")      # release name -> ReleaseAudit
    counts = outcome_counts(audits["h100"].entries, "strict")

Inputs: the static lines (`static/<release>.jsonl`, one per candidate) and the chunk records
(`chunks/*.jsonl`). Each candidate gets every view's verdict from its source alone (`static`) and, once a chunk
evaluated its (task, candidate) pair under the current protocol, from its evidence record (`gpu`), with the
baselines measured for its task on the card that evaluated it. A pair published by several releases is
evaluated once and counts for each (`Entry.shared_from` names the release whose chunk ran it). Re-check
chunks (`purpose: recheck`) never replace a result; `rechecks` pairs them with the result they re-measured.

Counts follow the evaluator's statuses: correct and incorrect (each with how many ran a fallback because their
own CUDA never built: `runtime.custom_build_failed`), unbuildable (`compile_error`), crash or timeout,
rejected (`hack_detected`, by flag family of the rule that decided it), undecided (the reference failed, the
evaluation failed twice, or a failure in a step the view's profile does not take: never charged to the
candidate), and not run on a GPU yet.
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cudal1.audit.chunks import CHUNKS_DIR, card_key, current
from cudal1.audit.records import Chunk, read_chunks
from cudal1.audit.static_half import read_static, static_verdict
from cudal1.audit.views import UNDECIDED, VIEWS, Derived, View, judge
from cudal1.core import flags as F

#: Flag families of the rule that rejected a candidate, in table order; a rule in none is "other".
FAMILIES: dict[str, tuple[str, ...]] = {
    "streams, threads, processes": ("extra_cuda_stream", "threads_or_processes", "unverified_launch_stream",
                                    F.THREADS, F.NATIVE_THREADS, F.PROCESSES, F.STREAM_ESCAPE, F.INTERFERENCE),
    "precision": ("precision_downcast", "global_backend_flags", F.GLOBAL_STATE, F.REDUCED_PRECISION,
                  "policy.reduced_precision"),
    "caching, lazy or constant outputs": ("result_caching", "lazy_tensor", "constant_output", "stale_memory",
                                          F.OUTPUT_TYPE),
    "inputs, sizes, the reference": ("input_mutation", "size_constants_redefined", "reads_reference",
                                     "reference_reuse", F.SIZE_CONSTANTS, F.INPUT_MUTATION),
    "timers, hooks, tampering": ("timer_patching", "tampering", "env_or_io", F.TIMER_PATCHING, F.GLOBAL_HOOKS,
                                 F.FUNCTION_MODE, F.TRACE_HOOK, F.SIGNAL_HANDLERS, F.OUTSIDE_CLOCK, F.BELOW_FLOOR),
    "not its own kernel (policy)": ("policy.own_kernel", "policy.decoy_kernel", "policy.fallback",
                                    "policy.torch_op", "policy.forbidden_op", "policy.build_in_forward"),
}
_FAMILY_OF = {rule: family for family, rules in FAMILIES.items() for rule in rules}


def family_of(rule: str) -> str:
    return _FAMILY_OF.get(rule, "other")


@dataclass
class Entry:
    """One published candidate of one release, with what each view says of it."""

    line: dict[str, Any]  # its static line
    static: dict[str, Derived]
    result: dict[str, Any] | None = None  # the evidence record's result line, once run on a GPU
    chunk: Chunk | None = None  # the chunk that ran it
    gpu: dict[str, Derived] = field(default_factory=dict)
    baselines: dict[str, dict[str, Any]] = field(default_factory=dict)  # kind -> baseline line (same card)

    @property
    def task_id(self) -> str:
        return str(self.line["task_id"])

    @property
    def level(self) -> int | None:
        return self.line.get("level")

    @property
    def published(self) -> dict[str, float]:
        return {k: v for k, v in (self.line.get("published") or {}).items() if v is not None}

    @property
    def key(self) -> tuple[str, str]:
        return self.line["task_hash"], self.line["candidate_hash"]

    @property
    def run(self) -> bool:
        return self.result is not None

    @property
    def card(self) -> str | None:
        return self.chunk.gpu_name if self.chunk is not None else None

    @property
    def shared_from(self) -> str | None:
        """The release whose chunk evaluated this pair, when another release's."""
        if self.chunk is None or self.chunk.release == self.line["task_id"].split("/", 1)[0]:
            return None
        return self.chunk.release

    @property
    def fallback(self) -> bool:
        """Its own CUDA never built and its code ran what it falls back to."""
        return self.result is not None and any(f.get("rule") == F.CUSTOM_BUILD_FAILED
                                               for f in self.result.get("flags") or [])

    def speedup_vs(self, view: str, kind: str) -> float | None:
        """Our speedup vs a baseline under `view` (eager: the evaluation's own; others through the baseline's
        speedup vs eager, measured on the same card)."""
        derived = self.gpu.get(view)
        if derived is None or not derived.is_correct or derived.speedup is None:
            return None
        if kind == "eager":
            return derived.speedup
        base = self.baselines.get(kind)
        if not base or base.get("status") != "ok" or not base.get("speedup_vs_eager"):
            return None
        return derived.speedup / float(base["speedup_vs_eager"])


@dataclass
class ReleaseAudit:
    """One release: its static line, its entries and the chunks it ran."""

    name: str
    info: dict[str, Any]
    entries: list[Entry]
    chunks: list[Chunk]  # chunks of this release (audit and re-check)

    @property
    def run(self) -> list[Entry]:
        return [e for e in self.entries if e.run]

    @property
    def tasks_not_run(self) -> int:
        return len({e.task_id for e in self.entries if not e.run})

    @property
    def gpu_s(self) -> float:
        return sum(c.elapsed_s for c in self.chunks)

    @property
    def cards(self) -> Counter:
        return Counter(e.card for e in self.run)

    @property
    def protocols(self) -> list[str]:
        return sorted({str(e.result.get("protocol_version")) for e in self.run if e.result})


def _results_by_key(chunks: Sequence[Chunk]) -> dict[tuple[str, str], list[tuple[Chunk, dict[str, Any]]]]:
    found: dict[tuple[str, str], list[tuple[Chunk, dict[str, Any]]]] = {}
    for chunk in chunks:
        if chunk.header.get("purpose", "audit") != "audit":
            continue
        for line in chunk.results:
            if current(line):
                found.setdefault((line["task_hash"], line["candidate_hash"]), []).append((chunk, line))
    return found


def _pick(found: list[tuple[Chunk, dict[str, Any]]], release: str) -> tuple[Chunk, dict[str, Any]]:
    """The result that stands for an item: a verdict before an infrastructure failure, the release's own
    chunk before another's, the first measured."""
    def rank(pair: tuple[Chunk, dict[str, Any]]) -> tuple[int, int]:
        chunk, line = pair
        return (line.get("status") == "infra_error", chunk.release != release)
    return min(found, key=rank)


def _baselines_by_card(chunks: Sequence[Chunk]) -> dict[tuple[str, str], dict[str, dict[str, Any]]]:
    """(task hash, card) -> kind -> the latest baseline line measured there."""
    out: dict[tuple[str, str], dict[str, dict[str, Any]]] = {}
    for chunk in chunks:
        card = card_key(chunk.header)
        for line in chunk.baselines:
            out.setdefault((line["task_hash"], card), {})[line["name"]] = line
    return out


def collect(audit_dir: str | Path, views: Mapping[str, View] | None = None) -> dict[str, ReleaseAudit]:
    """Every release with static records in `audit_dir`, joined with the chunk records (module docstring)."""
    views = views or VIEWS
    chunks = read_chunks(Path(audit_dir) / CHUNKS_DIR)
    results = _results_by_key(chunks)
    baselines = _baselines_by_card(chunks)
    audits = {}
    for name, lines in read_static(audit_dir).items():
        info = next((x for x in lines if x.get("kind") == "release"), {"release": name})
        entries = []
        for line in (x for x in lines if x.get("kind") == "candidate"):
            entry = Entry(line=line, static={v: static_verdict(line, view) for v, view in views.items()})
            found = results.get((line["task_hash"], line["candidate_hash"]))
            if found:
                entry.chunk, entry.result = _pick(found, name)
                entry.gpu = {v: judge(entry.result, view, line.get("facts")) for v, view in views.items()}
                entry.baselines = baselines.get((line["task_hash"], card_key(entry.chunk.header)), {})
            entries.append(entry)
        audits[name] = ReleaseAudit(name=name, info=info, entries=entries,
                                    chunks=[c for c in chunks if c.release == name])
    return audits


def outcome_counts(entries: Sequence[Entry], view: str, *, static: bool = False) -> dict[str, Any]:
    """Per view: how many entries are correct, incorrect (each with fallbacks apart), unbuildable, crash or
    timeout, rejected (and by family), undecided, not run. `static`: the source-alone verdicts instead
    (then correct means "goes on to be run")."""
    counts: dict[str, Any] = {"candidates": len(entries), "correct": 0, "correct_fallback": 0, "incorrect": 0,
                              "incorrect_fallback": 0, "unbuildable": 0, "crash_or_timeout": 0, "rejected": 0,
                              "undecided": 0, "not_run": 0}
    families: Counter = Counter()
    rules: Counter = Counter()
    for entry in entries:
        derived = entry.static.get(view) if static else entry.gpu.get(view)
        if derived is None:
            counts["not_run"] += 1
            continue
        status = derived.status
        if status in ("correct", "incorrect"):
            counts[status] += 1
            counts[f"{status}_fallback"] += entry.fallback
        elif status in ("compile_error", "unparseable"):
            counts["unbuildable"] += 1
        elif status in ("runtime_error", "timeout"):
            counts["crash_or_timeout"] += 1
        elif status == "hack_detected":
            counts["rejected"] += 1
            families[family_of(derived.reason)] += 1
            rules[derived.reason] += 1
        else:
            counts["undecided"] += 1
    counts["families"] = dict(sorted(families.items(), key=lambda kv: (-kv[1], kv[0])))
    counts["rules"] = dict(sorted(rules.items(), key=lambda kv: (-kv[1], kv[0])))
    return counts


#: The published score against each baseline the tables compare (release key).
PUBLISHED_KEYS = {"eager": "score_default", "cuda_graph": "score_cuda_graph",
                  "torch_compile": "score_torch_compile_default"}


def survival(entries: Sequence[Entry], view: str, kind: str = "eager", fraction: float = 0.9) -> dict[str, Any]:
    """Published speedups vs `kind` that survive under `view` (ours >= fraction x theirs), over the entries run
    with a published score and (for a baseline) that baseline measured; medians of ours and theirs over the
    correct ones (measured on different cards: shown beside each other, not divided)."""
    key = PUBLISHED_KEYS[kind]
    published = survived = 0
    ours, theirs = [], []
    for entry in entries:
        theirs_x = entry.published.get(key)
        if theirs_x is None or not entry.run:
            continue
        if kind != "eager" and (entry.baselines.get(kind) or {}).get("status") != "ok":
            continue
        published += 1
        ours_x = entry.speedup_vs(view, kind)
        if ours_x is not None:
            ours.append(ours_x)
            theirs.append(float(theirs_x))
            survived += ours_x >= fraction * float(theirs_x)
    return {"baseline": kind, "published": published, "survive": survived, "correct": len(ours),
            "ours_median": statistics.median(ours) if ours else None,
            "theirs_median": statistics.median(theirs) if theirs else None}


def rechecks(audit_dir: str | Path, views: Mapping[str, View] | None = None) -> list[dict[str, Any]]:
    """Each re-check result beside the result it re-measured: task, both verdicts per view, speedup ratio."""
    views = views or VIEWS
    chunks = read_chunks(Path(audit_dir) / CHUNKS_DIR)
    results = _results_by_key(chunks)
    out = []
    for chunk in chunks:
        if chunk.header.get("purpose") != "recheck":
            continue
        for line in chunk.results:
            found = results.get((line["task_hash"], line["candidate_hash"]))
            if not found or not current(line):
                continue
            _, first = _pick(found, chunk.release)
            a, b = judge(first, views["strict"]), judge(line, views["strict"])
            ratio = (b.speedup / a.speedup) if a.speedup and b.speedup else None
            out.append({"task_id": line["task_id"], "committed": a.status, "recheck": b.status, "ratio": ratio,
                        "card": chunk.gpu_name})
    return out


__all__ = ["FAMILIES", "PUBLISHED_KEYS", "UNDECIDED", "Entry", "ReleaseAudit", "collect", "family_of",
           "outcome_counts", "rechecks", "survival"]
