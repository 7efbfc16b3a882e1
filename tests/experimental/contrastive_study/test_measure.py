"""`measure` without a GPU: compiles once per family, and a worker that dies in a cell is restarted with that
cell recorded as a runtime_error (the worker is a stand-in, tests/helpers/study_worker.py)."""

from __future__ import annotations

from experimental.contrastive_study import measure as measure_module
from experimental.contrastive_study.table import Table
from tests.helpers.study_worker import CRASH_AT, fake_worker


def test_a_crashed_cell_is_recorded_and_the_rest_measured(tmp_path, monkeypatch):
    compiled = []

    def fake_compile_all(sources):
        compiled.append(len(sources))
        return ["ptxas error : too much shared data" if "#define T 1024" in s and "#define STAGE 1" in s else ""
                for s in sources]

    monkeypatch.setattr(measure_module, "compile_all", fake_compile_all)
    monkeypatch.setattr(measure_module, "run_worker", fake_worker)
    path = measure_module.measure(tmp_path, budget_s=120, tasks="study/gelu_n2[67]")
    table = Table.load(path)
    assert set(table.tasks) == {"study/gelu_n26", "study/gelu_n27"} and compiled == [480]
    task, recipe = CRASH_AT
    assert table.cell(task, recipe)["status"] == "runtime_error"
    assert table.data["crashed_cells"][task][recipe].startswith("crashed the CUDA context (exit 3)")
    assert sum(c["status"] == "correct" for c in table.tasks[task]["cells"].values()) == 479
    assert table.data["compile_errors"]["gelu|T1024 V4 I8 G S1 M0"].startswith("ptxas error")
    assert table.data["provenance"]["reps"] == 5 and table.data["provenance"]["complete"] is False
    measure_module.measure(tmp_path, budget_s=120, tasks="study/gelu_n2[67]")  # nothing left: no recompiles
    assert compiled == [480]
