"""Baselines (eager, torch.compile, CUDA Graph replay, cuDNN/TF32 flags) and speed-of-light figures.

    from cudal1.baselines import ensure_baselines, attach_baselines, measure_peaks, task_cost
    records = ensure_baselines(tasks, ["eager", "cuda_graph"], EvalConfig(), store=store)
    result = attach_baselines(evaluate_candidate(task, source, store=store), task, store)

See `variants` (the generated baseline candidates), `runner` (measuring, caching, attaching) and `sol`
(FLOPs, minimum bytes, device peaks, fraction of the physical limit).
"""

from cudal1.baselines.runner import (
    LABEL_PREFIX,
    BaselineRecord,
    attach_baselines,
    baseline_cell,
    baseline_config,
    baseline_protocol_version,
    ensure_baselines,
    load_baselines,
    measure_baseline,
    null_test_summary,
    speedups_vs_baselines,
)
from cudal1.baselines.sol import (
    TaskCost,
    cached_task_cost,
    measure_peaks,
    peak_flops,
    sol_fraction,
    stored_peaks,
    task_cost,
)
from cudal1.baselines.variants import BASELINE_KINDS, CUDA_ONLY_KINDS, baseline_source, parse_kinds

__all__ = [
    "BASELINE_KINDS",
    "CUDA_ONLY_KINDS",
    "LABEL_PREFIX",
    "BaselineRecord",
    "TaskCost",
    "attach_baselines",
    "baseline_cell",
    "baseline_config",
    "baseline_protocol_version",
    "baseline_source",
    "cached_task_cost",
    "ensure_baselines",
    "load_baselines",
    "measure_baseline",
    "measure_peaks",
    "null_test_summary",
    "parse_kinds",
    "peak_flops",
    "sol_fraction",
    "speedups_vs_baselines",
    "stored_peaks",
    "task_cost",
]
