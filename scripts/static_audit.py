#!/usr/bin/env python3
"""Static audit of a kernel release: kernel class and flags of every published candidate (no GPU, no run).

Usage: python scripts/static_audit.py RELEASE.jsonl OUT.md [--presets strict,cuda-l1]
Writes a Markdown report: counts per kernel class, per flag and per preset verdict, and one row per task
with the published speedup over eager. It is the static half of `cudal1 audit` (which also re-runs and
times every candidate on a GPU) and needs only the release file.
"""

from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from cudal1.analysis import analyze_source, rejecting_flags  # noqa: E402
from cudal1.tasks import load_release  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("release", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--presets", default="strict,cuda-l1")
    args = ap.parse_args()
    presets = args.presets.split(",")
    rows, classes, flags = [], collections.Counter(), collections.Counter()
    rejected = {p: collections.Counter() for p in presets}
    pairs = [(t, c) for t, c in load_release(args.release) if c is not None]
    for task, cand in pairs:
        report = analyze_source(cand.source, reference_source=task.source, preset=presets[0])
        classes[report.kernel_class.value] += 1
        names = sorted({f.rule for f in report.flags if f.severity.value != "info"})
        flags.update(names)
        verdicts = {}
        for p in presets:
            bad = rejecting_flags(report, p)
            verdicts[p] = bad[0].rule if bad else "pass"
            rejected[p][report.kernel_class.value if not bad else "rejected"] += 1
        rows.append((task.id, cand.published.get("score_default"), report.kernel_class.value, names, verdicts))
    lines = [f"# Static audit of `{args.release.name}`", "",
             f"{len(pairs)} published candidates analysed without running them (cudal1 static analysis; "
             "presets: " + ", ".join(presets) + "). A rejection under a preset means the candidate would be "
             "`hack_detected` before any timing.", "", "## Kernel classes", "", "| class | candidates |",
             "| --- | ---: |"]
    lines += [f"| {k} | {v} |" for k, v in classes.most_common()]
    lines += ["", "## Flags (warning or error severity)", "", "| rule | candidates |", "| --- | ---: |"]
    lines += [f"| {k} | {v} |" for k, v in flags.most_common()]
    lines += ["", "## Verdicts per preset", "", "| preset | rejected | passing (by class) |", "| --- | ---: | --- |"]
    for p in presets:
        passing = ", ".join(f"{k} {v}" for k, v in rejected[p].items() if k != "rejected")
        lines.append(f"| {p} | {rejected[p]['rejected']} | {passing} |")
    lines += ["", "## Per task", "", "| task | published speedup | class | flags | " + " | ".join(presets) + " |",
              "| --- | ---: | --- | --- | " + " | ".join("---" for _ in presets) + " |"]
    for tid, score, cls, names, verdicts in rows:
        s = f"{score:.3f}" if score is not None else "-"
        lines.append(f"| {tid} | {s} | {cls} | {', '.join(names) or '-'} | "
                     + " | ".join(verdicts[p] for p in presets) + " |")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n")
    print(f"{len(pairs)} candidates; classes {dict(classes)}; rejected " +
          ", ".join(f"{p}: {rejected[p]['rejected']}" for p in presets))


if __name__ == "__main__":
    main()
