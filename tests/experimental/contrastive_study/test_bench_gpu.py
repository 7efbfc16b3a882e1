"""The study's kernels on a GPU: every recipe of every family, at small sizes, is correct or fails for the
reason the table expects (a static tile over 48 KB does not compile, staged rows over the limit cannot
launch). Run before `contrastive_study.py measure`: `python -m pytest -m gpu tests/experimental/contrastive_study -q`."""

from __future__ import annotations

import pytest

from experimental.contrastive_study.bench import Launcher, compile_all, measure_task
from experimental.contrastive_study.kernels import kernel_source, launch_config
from experimental.contrastive_study.ops import FAMILIES, StudyTask
from experimental.contrastive_study.recipes import BY_TEXT, SPACE

torch = pytest.importorskip("torch")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

SMALL = {"ew": [(1, 1 << 16)], "row": [(512, 256), (48, 4096), (4, 32768)], "tr": [(256, 512), (96, 160)]}


def _small_tasks():
    return [StudyTask(f, rows, cols) for f in FAMILIES.values() for rows, cols in SMALL[f.kind]]


def test_every_cell_is_correct_or_fails_as_expected():
    tasks = _small_tasks()
    sources = sorted({kernel_source(t, r) for t in tasks for r in SPACE})
    errors = dict(zip(sources, compile_all(sources), strict=True))
    flush = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    bad = []
    for task in tasks:
        row = measure_task(task, SPACE, errors, Launcher(), reps=1, flush=flush, sm_count=sms)
        for recipe in SPACE:
            cell = row["cells"][recipe.text]
            status = cell["status"]
            expected_failure = ("compile_error" if errors[kernel_source(task, recipe)] else
                                "runtime_error" if launch_config(task, recipe, sms).error else None)
            if status != "correct" and status != expected_failure:
                bad.append((task.id, task.rows, task.cols, recipe.text, status, cell.get("message")))
    assert not bad, f"{len(bad)} cells: {bad[:10]}"


def test_torch_s_own_loader_launches_the_same_kernels():
    task = StudyTask(FAMILIES["softmax"], 64, 1024)
    launcher = Launcher()
    launcher.mode = "torch"
    recipe = BY_TEXT["T256 V4 I2 G S1 M1"]
    source = kernel_source(task, recipe)
    row = measure_task(task, [recipe], dict(zip([source], compile_all([source]), strict=True)), launcher, reps=5,
                       flush=torch.empty(1 << 20, dtype=torch.uint8, device="cuda"), sm_count=132)
    cell = row["cells"][recipe.text]
    assert cell["status"] == "correct" and len(cell["times_ms"]) == 5 and len(row["ref"]["times_ms"]) == 10
