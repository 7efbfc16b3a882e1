"""The static half of an audit: what every published candidate is, read from its source alone (no GPU).

    from cudal1.audit.static_half import static_records, write_static_records
    lines = static_records("releases/h100.jsonl")

One line per release (`kind: release`: its name, the hash of its file, how many tasks and candidates) and one
per candidate (`kind: candidate`): its task, level and content hashes, the static analysis's kernel class and
flags (rule, severity, line, a short message), whether it builds a `load_inline` extension, the published
scores, and the source's facts the verdict policies read (`cudal1.policy.apply.source_facts`). Every view's
static verdict (`static_verdicts`) and, with a GPU record, its full verdict (`cudal1.audit.views`) are derived
from these lines, which hold no source code: they are committed beside the chunk records.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from cudal1.analysis import analyze_source
from cudal1.audit.records import FLAG_MESSAGE_CHARS, file_hash, read_jsonl, write_jsonl
from cudal1.audit.views import VIEWS, Derived, View, judge
from cudal1.eval.pipeline import uses_load_inline
from cudal1.policy.apply import source_facts
from cudal1.tasks.sources import load_release

STATIC_DIR = "static"


def static_records(release: str | Path) -> list[dict[str, Any]]:
    """The static lines of a release (module docstring)."""
    path = Path(release)
    pairs = load_release(path)
    lines: list[dict[str, Any]] = [{"kind": "release", "release": path.stem, "release_sha256": file_hash(path),
                                    "tasks": len(pairs), "candidates": sum(c is not None for _, c in pairs)}]
    for task, cand in pairs:
        if cand is None:
            continue
        report = analyze_source(cand.source, reference_source=task.source, preset="kernelbench-v0")
        lines.append({
            "kind": "candidate", "task_id": task.id, "level": task.level, "task_hash": task.hash,
            "candidate_hash": cand.hash, "kernel_class": report.kernel_class.value,
            "flags": [{"rule": f.rule, "severity": f.severity.value, "source": f.source, "line": f.line,
                       "message": " ".join(f.message.split())[:FLAG_MESSAGE_CHARS]} for f in report.flags],
            "load_inline": uses_load_inline(cand.source), "published": dict(cand.published),
            "facts": source_facts(cand.source, task.source),
        })
    return lines


def static_path(audit_dir: str | Path, release: str) -> Path:
    return Path(audit_dir) / STATIC_DIR / f"{release}.jsonl"


def write_static_records(release: str | Path, audit_dir: str | Path) -> Path:
    """Write the release's static lines to `audit_dir/static/<release>.jsonl`."""
    return write_jsonl(static_path(audit_dir, Path(release).stem), static_records(release))


def read_static(audit_dir: str | Path) -> dict[str, list[dict[str, Any]]]:
    """release name -> its static lines (release line first), for every release with static records."""
    folder = Path(audit_dir) / STATIC_DIR
    return {p.stem: read_jsonl(p) for p in sorted(folder.glob("*.jsonl"))} if folder.is_dir() else {}


def static_verdict(line: Mapping[str, Any], view: View) -> Derived:
    """What a view decides from the source alone: `hack_detected` when its preset rejects a flag, or when
    its policy would turn the candidate down were it correct; `correct` means "goes on to be run"."""
    record = {"status": "correct", "speedup": None, "flags": line.get("flags") or [], "stops": [],
              "kernel_class": line.get("kernel_class"), "reached": ""}
    return judge(record, view, line.get("facts"))


def static_verdicts(lines: Iterable[Mapping[str, Any]], views: Mapping[str, View] | None = None
                    ) -> dict[str, dict[str, Derived]]:
    """task id -> view -> static verdict, for the candidate lines."""
    return {line["task_id"]: {name: static_verdict(line, view) for name, view in (views or VIEWS).items()}
            for line in lines if line.get("kind") == "candidate"}


def repeats(per_release: Mapping[str, Sequence[Mapping[str, Any]]]) -> dict[str, Any]:
    """How much the releases share: candidates in all, distinct (task, candidate) evaluations, those published
    by more than one release, evaluations saved by keying on content, distinct candidate sources and those
    that repeat, load_inline builds among the distinct evaluations, and tasks whose reference differs between
    releases (every release's task ids map to one reference when 0)."""
    by_key: dict[tuple[str, str], set[str]] = {}
    by_source: dict[str, set[str]] = {}
    refs: dict[str, set[str]] = {}
    builds: dict[tuple[str, str], bool] = {}
    total = 0
    for release, lines in per_release.items():
        for line in lines:
            if line.get("kind") != "candidate":
                continue
            total += 1
            key = (line["task_hash"], line["candidate_hash"])
            by_key.setdefault(key, set()).add(release)
            by_source.setdefault(line["candidate_hash"], set()).add(release)
            refs.setdefault(line["task_id"].split("/", 1)[1], set()).add(line["task_hash"])
            builds[key] = bool(line.get("load_inline"))
    return {"candidates": total, "distinct_evaluations": len(by_key),
            "repeated_evaluations": sum(len(r) > 1 for r in by_key.values()),
            "evaluations_saved": total - len(by_key), "distinct_sources": len(by_source),
            "repeated_sources": sum(len(r) > 1 for r in by_source.values()),
            "distinct_load_inline": sum(builds.values()),
            "tasks": len(refs), "tasks_with_differing_reference": sum(len(h) > 1 for h in refs.values())}


__all__ = ["STATIC_DIR", "read_static", "repeats", "static_path", "static_records", "static_verdict",
           "static_verdicts", "write_static_records"]
