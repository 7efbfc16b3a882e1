"""Does contrastive RL help? A controlled ablation of CUDA-L1's contrastive prompts on a measured task table.

    PYTHONPATH=src python scripts/contrastive_study.py measure OUT_DIR [--budget-s 230]     # GPU: the table
    PYTHONPATH=src python scripts/contrastive_study.py spotcheck OUT_DIR [--budget-s 240]   # GPU: vs the evaluator
    PYTHONPATH=src python scripts/contrastive_study.py run OUT_DIR --table T --seeds 0-23  # CPU: the arms
    PYTHONPATH=src python scripts/contrastive_study.py summarize OUT_DIR --table T         # CPU: CIs, results
    PYTHONPATH=src python scripts/contrastive_study.py advantages OUT_DIR --table T        # CPU: the dead band
    PYTHONPATH=src python scripts/contrastive_study.py run OUT_DIR --table T --seeds 0 \
        --against docs/results/contrastive_study.json      # one seed again, against the committed seeds' spread
    PYTHONPATH=src python scripts/contrastive_study.py surrogate OUT_DIR   # CPU: a SURROGATE table (tests only)

The table (`experimental.contrastive_study`): 42 tasks of 12 op families in three kinds (elementwise chains, row reductions
and normalizations, transposes fused with an op), 3-4 sizes each, none launch-bound (each moves >= 512 MB);
a recipe grammar of 480 recipes (threads, vector width, items per thread, one-shot or grid-stride, shared-
memory staging, work mapping: `experimental/contrastive_study/recipes.py`) that templates turn into raw-CUDA kernels. `measure`
compiles, checks and times every cell on one GPU (CUDA events, L2 flushed, >= 5 timings per cell, median and
spread; `experimental/contrastive_study/bench.py`), writing `OUT_DIR/table.json` as it goes (a timeout keeps what was measured;
running it again measures what is missing). `spotcheck` evaluates a stratified sample of >= 50 cells through
the project's evaluator and writes the agreement to `OUT_DIR/spotcheck.json`. Both record their provenance
(commit, a digest of the sources, library versions, host, date: `experimental/contrastive_study/provenance.py`).

Held out: 14 tasks, whole families of every kind (mish, logsumexp, rmsnorm, transpose_gelu). So that held-out
success needs feedback (the first study's held-out tasks were answered by their features: a lookup of the
training tasks by kind and size found 0.99 of their best with no feedback at all):
- a policy sees a task's kind only (`feature_set: kind`, `experimental/contrastive_study/ops.py`), not its sizes;
- each held-out task's table is the measured one with 3 of the 6 recipe fields relabelled by a fixed random
  permutation of their values (`experimental/contrastive_study/perturb.py`): the same measurements, the optimum moved away
  from where the training siblings put it (the permutations are in the results, `perturbation`).
Every evaluation draws the cell's measured noise (`Table.draw`: a log-normal around the table's speedup
with the standard error of a median of its timings, and the 95 % interval the evaluator would report), so
the scores a policy is shown, the exemplar database's median scores and `reward_speedup: lower` see noise;
what is scored is the table's median.

The policy: a 0.35 M-parameter Llama over a word-level vocabulary, pre-trained on the CPU with the project's
SFT stage as an in-context improver on SYNTHETIC landscapes only (input: the kind and k scored recipes;
output: a better recipe; 7 of 8 examples show exemplars; `experimental/contrastive_study/landscapes.py`), once per
pre-training seed (`pretrain_seeds`: 4; study seed s starts from pre-training s mod 4). RL arms then train
it with the project's stage 3 (`run_rl`: TRL's GRPO, `KernelReward`, the exemplar database, stage 3's
default reward shaping: group normalization with its dead band, the clip, TRL not rescaling, a copy of a
shown exemplar paid its score less 5 %) on the 28 training tasks: 60 steps x 8 tasks x 8 completions.

Arms (`experimental/contrastive_study/arms.py`):
- `grpo-bucket`: contrastive GRPO, exemplars by CUDA-L1's bucket sampler; searches with bucket prompts;
- `grpo-random`: contrastive GRPO, exemplars drawn uniformly;
- `grpo-shuffled`: contrastive GRPO whose exemplars' scores are permuted among them (and shown in the order
  of the permuted scores): do the scores matter, or only the code text?
- `grpo-plain`: GRPO with the plain prompt (no exemplars); held-out: best-of-N samples;
- `grpo-refine`: multi-turn refinement (as Kevin-32B and Dr.Kernel train): GRPO whose prompt shows the
  policy's own last two attempts on the task with their measured results; held-out: 8 trajectories per task,
  each turn showing its own last two attempts (rewards per turn, not discounted over the trajectory);
- `evolution`: contrastive prompting without RL: the pre-trained improver iterated with the database;
- `random-search`: uniform proposals without repeats;
- `sft-only`: the pre-trained improver with the plain prompt (best-of-N);
- `lookup`: no learning, no feedback: recipes in the order of their mean fraction of the best on the
  training tasks of the same kind.

Budgets: every arm evaluates exactly 32 distinct recipes per held-out task (`budget`), the same 4 random
correct ones first (seeded per seed and search; listed in each seed file). An evaluation is a distinct
recipe, as the results store makes it: a repeat is served from the store and an unparseable answer is never
evaluated; both spend samples, at most 128 per task, after which the rest of the 32 are random recipes not
evaluated yet (counted: `held_out_fallback`). Each trained policy searches 4 times (`search_repeats`, other
seeded recipes); a seed's value is the mean of its 4 searches.

Metrics (fixed before the runs; per arm and seed, means over the 14 held-out tasks and the 4 searches):
1. PRIMARY `held_out_log_regret`: ln(task's best / best found) after 8, 16 and 32 evaluations, averaged
   (0 is perfect; it does not saturate as a fraction does); `held_out_fraction` is exp(-log-regret), the
   geometric-mean fraction of the best. The study's question is the paired difference grpo-bucket -
   grpo-plain over seeds (a plain 95 % t interval, the one pre-registered contrast); the other contrasts
   are one family with Holm-adjusted p-values and Bonferroni intervals (`experimental/contrastive_study/run.py`).
2. `evaluations_to_95`, `evaluations_to_99`: evaluations spent when the best found first reached 0.95, 0.99 of
   the task's best (33 when never); `held_out_curve`: the best found after 4, 8, 16 and 32.
3. The mechanism, within one policy: `mechanism` = the mean fraction of the best of 32 answers to the 4
   seeded recipes shown with their scores, minus the same with the scores permuted among the recipes
   (`mechanism_true_scores`, `mechanism_permuted_scores`); `one_shot_fraction_of_best`: 32 answers to the
   arm's own prompt built from the seeded recipes.
4. RL arms: the fraction of the best of each training batch (`train_curve`), first and last 10 % of steps,
   and the share of completions that copy a recipe their prompt shows (`train_copies_last`).

Costs on one CPU core (2026-12-07): a pre-training about 165 CPU s; a seed's nine arms about 3 CPU minutes.
`run` is resumable per seed and per arm (`--seeds 3` or `--seeds 0-23`); a folder holds one protocol
(`--protocol KEY=VALUE` overrides it for a pipeline test). A table whose `kind` is `surrogate` (an analytic
model, `experimental/contrastive_study/surrogate.py`) is only for testing the pipeline: `run` refuses it without
`--allow-surrogate`, and its results are never published.
"""

from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT))  # experimental/ (the contrastive study)


def parse_seeds(text: str) -> list[int]:
    """'3', '0-9' or '0,2,5' -> seeds."""
    seeds: list[int] = []
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        seeds += list(range(int(lo), int(hi) + 1)) if hi else [int(lo)]
    return seeds


def protocol_from(items: list[str] | None):
    """The study's `Protocol` with `KEY=VALUE` overrides (a pipeline test's smaller budgets)."""
    import dataclasses

    import yaml

    from experimental.contrastive_study.arms import Protocol

    values = {}
    for item in items or []:
        key, _, raw = item.partition("=")
        values[key.strip()] = yaml.safe_load(raw)
    if "checkpoints" in values:
        values["checkpoints"] = tuple(values["checkpoints"])
    known = {f.name for f in dataclasses.fields(Protocol)}
    unknown = sorted(set(values) - known)
    if unknown:
        raise SystemExit(f"unknown protocol settings {unknown}; known: {sorted(known)}")
    return Protocol(**values)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("command", choices=("measure", "spotcheck", "run", "summarize", "surrogate", "advantages"))
    p.add_argument("out_dir", type=Path)
    p.add_argument("--table", type=Path, help="The table (default OUT_DIR/table.json).")
    p.add_argument("--budget-s", type=float, help="measure: 230 s; spotcheck: 240 s.")
    p.add_argument("--reps", type=int, default=5, help="measure: timings per cell (>= 5).")
    p.add_argument("--tasks", default="*", help="measure: a glob over task ids or family names.")
    p.add_argument("--cells", type=int, default=60, help="spotcheck: cells evaluated (>= 50).")
    p.add_argument("--profile", default="cuda-l1", help="spotcheck: the evaluator's profile.")
    p.add_argument("--seeds", default="0-19", help="run: '3', '0-9' or '0,2,5'.")
    p.add_argument("--arms", nargs="+", help="run: a subset of the arms (default: all nine).")
    p.add_argument("--protocol", nargs="+", metavar="KEY=VALUE",
                   help="run: protocol overrides (a pipeline test's; a published study uses the defaults).")
    p.add_argument("--allow-surrogate", action="store_true", help="run: accept a surrogate table (tests only).")
    p.add_argument("--spotcheck", type=Path, help="summarize: the spot-check's spotcheck.json (default: beside "
                                                  "the table).")
    p.add_argument("--against", type=Path, help="run/summarize: a committed contrastive_study.json to compare with.")
    args = p.parse_args(argv)
    if args.command == "measure" and args.reps < 5:
        p.error("--reps must be >= 5")
    return args


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    for noisy in ("httpx", "transformers", "trl", "cudal1.train", "cudal1.exemplars", "datasets"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    args = parse_args(argv)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    table = args.table or args.out_dir / "table.json"
    if args.command == "measure":
        from experimental.contrastive_study.measure import measure
        from experimental.contrastive_study.table import Table

        path = measure(args.out_dir, budget_s=args.budget_s or 230.0, reps=args.reps, tasks=args.tasks)
        t = Table.load(path)
        print(f"{path}: {len(t.tasks)} tasks measured; problems: {t.problems()[:5] or 'none'}")
        for tid in t.tasks:
            print(f"  {tid:30s} {t.landscape(tid)}")
    elif args.command == "spotcheck":
        from experimental.contrastive_study.spotcheck import spotcheck

        found = spotcheck(table, args.out_dir, n=args.cells, budget_s=args.budget_s or 240.0, profile=args.profile)
        print({k: v for k, v in found.items() if k != "rows"})
    elif args.command == "surrogate":
        from experimental.contrastive_study.surrogate import surrogate_table
        from experimental.contrastive_study.table import write_table

        write_table(args.out_dir / "table.json", surrogate_table())
        print(f"{args.out_dir / 'table.json'}: a SURROGATE table (analytic model, not measured)")
    elif args.command == "run":
        from experimental.contrastive_study.run import run_study

        run_study(args.out_dir, table, parse_seeds(args.seeds), arms=args.arms,
                  protocol=protocol_from(args.protocol), allow_surrogate=args.allow_surrogate)
    elif args.command == "advantages":
        import json

        from experimental.contrastive_study.shaping import measure_run

        found = measure_run(args.out_dir, table)
        (args.out_dir / "advantages.json").write_text(json.dumps(found, indent=1))
        print(json.dumps(found, indent=1))
    if args.command in ("run", "summarize"):
        import json

        from experimental.contrastive_study.run import against, markdown_table, summarize

        summary = summarize(args.out_dir, table, args.spotcheck)
        print(markdown_table(summary))
        if args.against:
            found = against(summary, json.loads(args.against.read_text()))
            (args.out_dir / "against.json").write_text(json.dumps(found, indent=1))
            for arm, entry in found.items():
                same = ""
                if entry["reproduced"] is not None:
                    same = f"; committed same seed {list(entry['same_seed_committed'].values())}: " + (
                        "reproduced" if entry["reproduced"] else "differs (other machine or libraries)")
                print(f"{arm:14s} {entry['now']} vs the {entry['committed_seeds']} committed seeds' prediction "
                      f"interval {entry['interval']} ({entry['level']}): {'inside' if entry['inside'] else 'OUTSIDE'}"
                      f"{same}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
