"""Baselines (eager, torch.compile, CUDA Graph replay, cuDNN/TF32 flags) and speed-of-light figures.

    from cudal1.baselines import ensure_baselines, attach_baselines, measure_peaks, task_cost
    records = ensure_baselines(tasks, ["eager", "cuda_graph"], EvalConfig(), store=store)
    result = attach_baselines(evaluate_candidate(task, source, store=store), task, store)

See `variants` (the generated baseline candidates), `runner` (measuring, caching, attaching) and `sol`
(FLOPs, minimum bytes, device peaks, fraction of the physical limit). The kinds themselves are records in
`cudal1.core.baselines`, re-exported here: `register_baseline_kind(BaselineKind(...))` adds one.
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
from cudal1.baselines.variants import baseline_source, parse_kinds
from cudal1.core.baselines import (
    BaselineKind,
    baseline_kind_names,
    cuda_only_kinds,
    register_baseline_kind,
    registered_baseline_kind,
    unregister_baseline_kind,
)

__all__ = [
    "LABEL_PREFIX",
    "BaselineKind",
    "BaselineRecord",
    "TaskCost",
    "attach_baselines",
    "baseline_cell",
    "baseline_config",
    "baseline_kind_names",
    "baseline_protocol_version",
    "baseline_source",
    "cached_task_cost",
    "cuda_only_kinds",
    "ensure_baselines",
    "load_baselines",
    "measure_baseline",
    "measure_peaks",
    "null_test_summary",
    "parse_kinds",
    "peak_flops",
    "register_baseline_kind",
    "registered_baseline_kind",
    "sol_fraction",
    "speedups_vs_baselines",
    "stored_peaks",
    "task_cost",
    "unregister_baseline_kind",
]
