#!/usr/bin/env python3
"""How often each verdict-policy preset agrees with the harness whose rules it implements.

Usage: python scripts/harness_agreement.py OUT_DIR [--device cpu|cuda] [--cases MANIFEST] [--only HARNESS,...]

The cases (`tests/fixtures/harnesses/manifest.yaml`) are this project's own candidates, each written after
one of another harness's public test cases (KernelBench, SOL-ExecBench, CUDA-L2, KernelGYM, CUDA Agent,
KernelBench-Hard): what the candidate does, and the verdict that harness gives it (accept or reject, and the
reward where it states one). Every case is evaluated once by the real evaluator (the cases a CPU can run on
`--device cpu`, all of them on `--device cuda`), then judged under each preset its entry names, with the
same `apply_policy` the pipeline calls; an honest case names every preset, since none may reject it.

Prints, per harness, the cases, how many the matching preset agrees with and the disagreements; then the
honest cases rejected under any preset. Writes agreement.json (every case, preset, verdict, message)
under OUT_DIR. Exit status 0 whatever the agreement: the figures are the result.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from cudal1.eval import EvalConfig, Status, evaluate_many  # noqa: E402
from cudal1.policy import PRESETS, apply_policy  # noqa: E402
from cudal1.tasks.sources import load_file  # noqa: E402

MANIFEST = ROOT / "tests" / "fixtures" / "harnesses" / "manifest.yaml"
#: the preset that implements each harness's rule set
HARNESS_PRESET = {"KernelBench": "kernelbench", "SOL-ExecBench": "sol-execbench", "CUDA-L2": "cuda-l1",
                  "KernelGYM": "kernelgym", "CUDA Agent": "cuda-agent", "KernelBench-Hard": "kernelbench-hard"}
#: short evaluation settings: the verdicts, not the speedups, are what is compared (a cold torch.compile on
#: two CPU cores takes longer than the default 30 s a step may take)
SETTINGS = {"cpu": dict(device="cpu", sizes="full", correctness_trials=3, buckets=2, target_bucket_ms=5.0,
                        warm_buckets=1, warmup_iters=1, timeout_s=300.0, phase_floor_s=120.0),
            "cuda": dict(device="cuda", sizes="full", correctness_trials=5, buckets=3, target_bucket_ms=20.0,
                         timeout_s=300.0)}


@dataclass
class Case:
    """One manifest entry: a candidate, its reference, the harness it comes from and the expected verdicts."""

    id: str
    harness: str
    file: Path
    ref: Path
    needs: str
    expect: dict[str, str]  # preset -> accept | reject
    reward: float | None = None  # the reward the harness's own preset records for a violation
    preset: str = ""  # the preset of the harness's check this case tests (default: HARNESS_PRESET)
    slow: bool = False  # compiles (a C++ extension, torch.compile): tens of seconds on a CPU
    deliberate: str = ""  # why cudal1 gives the opposite verdict on purpose


@dataclass
class Judgement:
    case: str
    harness: str
    preset: str
    expected: str  # the harness's verdict
    status: str
    agrees: bool  # cudal1's verdict is the harness's
    own: bool  # judged under the preset of the harness's check (the others are cross-checks)
    deliberate: str = ""
    message: str = ""
    flags: list[str] = field(default_factory=list)

    @property
    def as_intended(self) -> bool:
        """Agreement, or the opposite verdict where the case documents a deliberate difference."""
        return self.agrees != bool(self.deliberate and self.own)


def load_cases(manifest: Path = MANIFEST) -> list[Case]:
    """The manifest's entries, checked: known harness and presets, files that exist, accept/reject only."""
    base = manifest.parent
    cases = []
    for raw in yaml.safe_load(manifest.read_text(encoding="utf-8"))["cases"]:
        expect = dict(raw["expect"])
        if "all" in expect:
            every = expect.pop("all")
            expect = {name: every for name in PRESETS} | expect
        case = Case(id=raw["id"], harness=raw["harness"], file=base / raw["file"], ref=base / raw["ref"],
                    needs=raw["needs"], expect=expect, reward=raw.get("reward"),
                    preset=raw.get("preset") or HARNESS_PRESET.get(raw["harness"], ""),
                    slow=bool(raw.get("slow")), deliberate=raw.get("deliberate", ""))
        problems = [f"unknown harness {case.harness!r}"] if case.harness not in HARNESS_PRESET else []
        problems += [f"unknown preset {p!r}" for p in expect if p not in PRESETS]
        problems += [f"expected {v!r} (accept or reject)" for v in expect.values() if v not in ("accept", "reject")]
        problems += [f"missing {p}" for p in (case.file, case.ref) if not p.is_file()]
        problems += [] if case.needs in ("cpu", "cuda") else [f"needs {case.needs!r} (cpu or cuda)"]
        problems += [] if case.preset in expect else [f"no verdict under its preset {case.preset!r}"]
        if problems:
            raise ValueError(f"{manifest}: case {case.id}: {'; '.join(problems)}")
        cases.append(case)
    ids = [c.id for c in cases]
    if len(set(ids)) != len(ids):
        raise ValueError(f"{manifest}: duplicate case ids")
    return cases


def judge(case: Case, result, source: str, task_source: str) -> list[Judgement]:
    """The evaluator's `result` for `case` judged under each preset the case names."""
    out = []
    for preset, expected in case.expect.items():
        judged = apply_policy(result, source, preset, task_source=task_source)
        accepted = judged.status is Status.CORRECT
        agrees = accepted == (expected == "accept")
        if agrees and preset == case.preset and case.reward is not None and not accepted:
            agrees = judged.protocol.get("policy_violation_reward") == case.reward
        out.append(Judgement(case.id, case.harness, preset, expected, judged.status.value, agrees,
                             preset == case.preset, case.deliberate, judged.message[:200],
                             sorted({f.rule for f in judged.flags})))
    return out


def run_cases(cases: list[Case], device: str) -> list[Judgement]:
    """Evaluate the cases `device` can run, once each, and judge them under their presets."""
    runnable = [c for c in cases if device == "cuda" or c.needs == "cpu"]
    tasks = [load_file(c.ref) for c in runnable]
    sources = [c.file.read_text(encoding="utf-8") for c in runnable]
    results = evaluate_many(list(zip(tasks, sources, strict=True)), EvalConfig(**SETTINGS[device]))
    out = []
    for case, task, source, result in zip(runnable, tasks, sources, results, strict=True):
        out += judge(case, result, source, task.source)
    return out


def summarize(judgements: list[Judgement]) -> dict:
    """Per harness, under the preset of each case's check: cases, agreements, deliberate differences, other
    disagreements; then every judgement (cross-checks under other presets included) that is not as intended,
    and the honest cases rejected under some preset."""
    by_harness: dict[str, dict] = {}
    for j in (j for j in judgements if j.own):
        row = by_harness.setdefault(j.harness, {"cases": 0, "agree": 0, "deliberate": [], "disagree": []})
        row["cases"] += 1
        row["agree"] += j.agrees
        if j.deliberate and not j.agrees:
            row["deliberate"].append(f"{j.case} ({j.preset}): {j.harness} {j.expected}s, cudal1 {j.status}: {j.deliberate}")
        elif not j.agrees:
            row["disagree"].append(f"{j.case} ({j.preset}): expected {j.expected}, got {j.status}: {j.message}")
    return {"harnesses": by_harness, "cases": sum(r["cases"] for r in by_harness.values()),
            "agree": sum(r["agree"] for r in by_harness.values()), "judgements": len(judgements),
            "not_as_intended": [f"{j.case} under {j.preset}: expected {j.expected}, got {j.status}: {j.message}"
                                for j in judgements if not j.as_intended],
            "honest_rejected": sorted({f"{j.case} under {j.preset} ({j.status})" for j in judgements
                                       if j.expected == "accept" and j.status != "correct" and not j.deliberate})}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--device", choices=sorted(SETTINGS), default="cpu")
    parser.add_argument("--cases", type=Path, default=MANIFEST)
    parser.add_argument("--only", default="", help="comma-separated harness names")
    parser.add_argument("--quick", action="store_true", help="leave out the cases that compile (C++ builds, torch.compile)")
    args = parser.parse_args(argv)
    cases = load_cases(args.cases)
    if args.only:
        wanted = {name.strip() for name in args.only.split(",")}
        cases = [c for c in cases if c.harness in wanted]
    if args.quick:
        cases = [c for c in cases if not c.slow]
    started = time.monotonic()
    judgements = run_cases(cases, args.device)
    summary = summarize(judgements)
    summary.update(device=args.device, seconds=round(time.monotonic() - started, 1),
                   skipped=[c.id for c in cases if args.device == "cpu" and c.needs == "cuda"])
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / "agreement.json").write_text(json.dumps(
        {"summary": summary, "judgements": [j.__dict__ for j in judgements]}, indent=1))
    print(f"{'harness':18s} {'agree':>9s}  deliberate  other")
    for harness, row in summary["harnesses"].items():
        print(f"{harness:18s} {row['agree']:>4d}/{row['cases']:<4d}  {len(row['deliberate']):>10d}  {len(row['disagree']):>5d}")
        for line in row["deliberate"]:
            print(f"    deliberate: {line}")
        for line in row["disagree"]:
            print(f"    differs: {line}")
    print(f"all: {summary['agree']}/{summary['cases']} agree on {args.device} ({len(summary['skipped'])} cases need "
          f"a GPU); {summary['judgements']} judgements, {len(summary['not_as_intended'])} not as intended; honest "
          f"cases rejected under some preset: {len(summary['honest_rejected'])}")
    for line in summary["not_as_intended"]:
        print(f"    not as intended: {line}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
