"""The verl exporter splits tasks with the training stages' split file (it drew its own: 4 of its 5
validation tasks were training tasks of the split cudal1's trainer used)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq

from cudal1.tasks import load_tasks
from cudal1.tasks.splits import make_split

SCRIPT = Path(__file__).resolve().parents[2] / "examples" / "verl" / "export_data.py"


def _task_ids(path: Path) -> set[str]:
    return {row["task_id"] for row in pq.read_table(path).column("extra_info").to_pylist()}


def test_train_and_val_follow_the_split_file(tmp_path):
    split = make_split(load_tasks("builtin"), test_fraction=0.3, seed=7)
    splits = split.save(tmp_path / "splits.json")
    out = tmp_path / "verl"
    subprocess.run([sys.executable, str(SCRIPT), str(out), "--splits-file", str(splits)], check=True,
                   capture_output=True, text=True, timeout=120)
    assert _task_ids(out / "val.parquet") == split.ids("test")
    assert _task_ids(out / "train.parquet") == split.ids("train")


def test_without_a_split_file_one_is_made_and_kept_for_the_trainer(tmp_path):
    out = tmp_path / "verl"
    subprocess.run([sys.executable, str(SCRIPT), str(out)], check=True, capture_output=True, text=True, timeout=120)
    saved = json.loads((out / "splits.json").read_text())
    assert _task_ids(out / "val.parquet") == set(saved["test"]) and not set(saved["test"]) & set(saved["train"])
