"""`measure`: the study's table on one GPU within a time budget, in worker processes that may crash.

The compiles run first (`bench.compile_all`, every CPU core; NVRTC results are cached on disk). Then a
worker process measures the tasks (`bench.run_worker`; every family's smallest size first, then the next
sizes, so a run cut short still covers every family), writing the table after each. A kernel
that kills the CUDA context (an illegal address) kills the worker, not the run: the worker names the cell
it is about to launch first (`progress.json`), and the next worker, started for the tasks left, records
that cell as a `runtime_error` and measures the rest. A run stopped by its budget leaves a valid partial
table; running the command again measures what is missing.
"""

from __future__ import annotations

import fnmatch
import json
import logging
import multiprocessing
import time
from pathlib import Path
from typing import Any

from experimental.contrastive_study.bench import compile_all, run_worker
from experimental.contrastive_study.kernels import kernel_source
from experimental.contrastive_study.ops import study_tasks
from experimental.contrastive_study.provenance import provenance
from experimental.contrastive_study.recipes import SPACE
from experimental.contrastive_study.table import load_table, new_table, write_table

logger = logging.getLogger(__name__)

MAX_RESTARTS = 6
METHOD = ("experimental.contrastive_study.bench: CUDA events around one call on the current stream, L2 flushed (a write of "
          "twice its size) before each; `reps` rounds, each over every correct cell and the reference twice "
          "in a fresh random order; a cell's time is the median of its rounds")


def measure(out_dir: Path, *, budget_s: float = 230.0, reps: int = 5, tasks: str = "*") -> Path:
    """Measure the table into `out_dir/table.json` (see the module docstring); returns its path."""
    started = time.time()
    deadline = started + budget_s
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "table.json"
    chosen = [t for t in measure_order() if fnmatch.fnmatch(t.id, tasks) or fnmatch.fnmatch(t.family.name, tasks)]
    if path.is_file():
        data = load_table(path)
    else:
        data = new_table("measured", provenance(method=METHOD, reps=reps, ref_reps=2 * reps,
                                                tolerance="|y - ref| <= 1e-4 + 1e-4 |ref|"))
    _compile_families(data, {t.family.name: t for t in chosen})
    write_table(path, data)
    logger.info("compiles done in %.0f s", time.time() - started)
    progress = out_dir / "progress.json"
    skip: dict[str, dict[str, str]] = data.setdefault("crashed_cells", {})
    context = multiprocessing.get_context("spawn")
    for attempt in range(MAX_RESTARTS + 1):
        todo = [t.id for t in chosen if not load_table(path)["tasks"].get(t.id, {}).get("cells")]
        if not todo or time.time() >= deadline:
            break
        progress.write_text("{}")
        worker = context.Process(target=run_worker, args=(str(path), todo, reps, deadline, str(progress), skip))
        worker.start()
        worker.join(max(1.0, deadline - time.time() + 60.0))  # a task in flight at the deadline may finish
        if worker.is_alive():
            worker.kill()
            worker.join()
            logger.warning("worker stopped at the budget")
            break
        if worker.exitcode == 0:
            continue
        crashed = json.loads(progress.read_text() or "{}")
        if not crashed:
            logger.error("worker failed (exit %s) outside any cell; giving up", worker.exitcode)
            break
        logger.warning("worker died (exit %s) in %s %s; that cell is a runtime_error, restarting (%d)",
                       worker.exitcode, crashed["task"], crashed["recipe"], attempt + 1)
        skip.setdefault(crashed["task"], {})[crashed["recipe"]] = f"crashed the CUDA context (exit {worker.exitcode})"
        data = load_table(path)
        data["crashed_cells"] = skip
        write_table(path, data)
    data = load_table(path)
    data["provenance"]["measure_s"] = round(data["provenance"].get("measure_s", 0.0) + time.time() - started, 1)
    data["provenance"]["complete"] = all(t.id in data["tasks"] for t in study_tasks())
    write_table(path, data)
    return path


def measure_order() -> list[Any]:
    """Every family's smallest task first, then every family's next size...: a run cut short by its budget
    still has every family, held-out ones too."""
    tasks = study_tasks()
    rank = {t.id: [u.id for u in tasks if u.family is t.family].index(t.id) for t in tasks}
    return sorted(tasks, key=lambda t: (rank[t.id], t.family.name))


def _compile_families(data: dict[str, Any], families: dict[str, Any]) -> None:
    """Compile every recipe of each family not compiled yet; errors into `data["compile_errors"]`."""
    done = set(data.setdefault("compiled_families", []))
    todo = [(name, task) for name, task in families.items() if name not in done]
    if not todo:
        return
    keys, sources = [], []
    for name, task in todo:
        for recipe in SPACE:
            keys.append(f"{name}|{recipe.text}")
            sources.append(kernel_source(task, recipe))
    for key, error in zip(keys, compile_all(sources), strict=True):
        if error:
            data["compile_errors"][key] = error
    data["compiled_families"] = sorted(done | {name for name, _ in todo})
