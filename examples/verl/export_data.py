"""Write verl parquet files of cudal1 prompts (train/val split of the built-in suite by default).

    python examples/verl/export_data.py data/cudal1_verl [--source builtin] [--val-fraction 0.2]

Prompts are cudal1's plain prompt; for contrastive prompts pass your own `prompt_fn` to
`cudal1.integrations.verl.rows_from_tasks` (e.g. `build_contrastive_prompt` with exemplars from the
exemplar database), re-exporting between RL rounds as the database grows.
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

from cudal1.integrations.verl import export_verl_parquet, rows_from_tasks
from cudal1.tasks import load_tasks


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--source", default="builtin")
    parser.add_argument("--val-fraction", type=float, default=0.2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    tasks = load_tasks(args.source)
    random.Random(args.seed).shuffle(tasks)
    n_val = max(1, int(len(tasks) * args.val_fraction))
    val, train = tasks[:n_val], tasks[n_val:]
    for name, split in (("train", train), ("val", val)):
        path = export_verl_parquet(rows_from_tasks(split, split=name), args.out_dir / f"{name}.parquet")
        print(f"{path}: {len(split)} tasks")


if __name__ == "__main__":
    main()
