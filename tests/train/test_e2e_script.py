"""The end-to-end training script's stage-1 data: stage 3's prompt format is among what stage 1 teaches."""

from __future__ import annotations

from pathlib import Path

from cudal1.exemplars import ExemplarDB
from cudal1.tasks import load_tasks
from cudal1.train.rl import ContrastivePromptBuilder
from tests.helpers.scripts import load_script
from tests.train.helpers import correct_code

FIXTURES = Path(__file__).parent / "fixtures" / "tasks"


def _script():
    return load_script("train_e2e_gpu")


def test_stage1_rows_hold_the_plain_and_the_stage3_prompt(tmp_path):
    tasks = load_tasks(str(FIXTURES))[:2]
    rows = [{"task_id": t.id, "code": correct_code(t), "speedup": 1.5} for t in tasks]
    data = _script().stage1_rows(tasks, rows, prompt_token_budget=8192)
    assert len(data) == 4
    plain, contrastive = data[:2], data[2:]
    assert all(r["ref_code"] == t.source and r["code"] == correct_code(t) for r, t in zip(plain, tasks, strict=True))
    db = ExemplarDB(tmp_path / "ex.sqlite")  # what stage 3 is seeded with: the same kernels and scores
    for r in rows:
        db.add(r["task_id"], r["code"], r["speedup"], {})
    builder = ContrastivePromptBuilder(db, token_budget=8192)
    for row, task in zip(contrastive, tasks, strict=True):
        assert row["prompt"] == builder.build(task)
        assert row["completion"][0]["content"].startswith("```python\n") and correct_code(task).strip() in \
            row["completion"][0]["content"]
