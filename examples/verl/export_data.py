"""Write verl parquet files of cudal1 prompts, split as cudal1's own training splits its tasks.

    python examples/verl/export_data.py data/cudal1_verl [--source builtin] [--splits-file runs/rl/splits.json]

The train/val files follow the same split file the training stages read (`cudal1.tasks.splits`): given with
`--splits-file`, else made deterministically (stratified by level) and saved next to the parquet files, so
that a later `cudal1 train ... --set splits_file=...` or `evaluate-policy --splits-file` holds out the same
tasks. Prompts are cudal1's plain prompt; for contrastive prompts pass your own `prompt_fn` to
`cudal1.integrations.verl.rows_from_tasks`, re-exporting between RL rounds as the exemplar database grows.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from cudal1.integrations.verl import export_verl_parquet, rows_from_tasks
from cudal1.tasks import load_tasks
from cudal1.tasks.splits import load_or_make_split, select_tasks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--source", default="builtin")
    parser.add_argument("--splits-file", type=Path, help="Split JSON (as training writes it); default: "
                        "OUT_DIR/splits.json, made when missing.")
    parser.add_argument("--test-fraction", type=float, default=0.2, help="Held-out share of a new split.")
    parser.add_argument("--seed", type=int, default=0, help="Seed of a new split.")
    args = parser.parse_args()
    tasks = load_tasks(args.source)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    split = load_or_make_split(args.splits_file or args.out_dir / "splits.json", tasks,
                               test_fraction=args.test_fraction, seed=args.seed)
    for name, which in (("train", "train"), ("val", "test")):
        chosen = select_tasks(tasks, which, split)
        path = export_verl_parquet(rows_from_tasks(chosen, split=name), args.out_dir / f"{name}.parquet")
        print(f"{path}: {len(chosen)} tasks")


if __name__ == "__main__":
    main()
