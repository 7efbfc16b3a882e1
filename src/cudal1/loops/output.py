"""Write a verified candidate to disk: the module with a header comment stating its verdict, and a JSON sidecar.

The header gives the verdict and the evidence a reader needs before trusting the file: the profile and
device it was verified on, the speedup over eager (cold and warm L2, with both times), the speedup over
every cached baseline, the kernel class, and where it came from (run, round, model). The candidate's own
source follows unchanged, so the file is importable as is (comments do not displace a module docstring). A
kernel-form candidate (a JSON spec, which holds no comments) is written unchanged, its header in the sidecar.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from cudal1.analysis import analyze_source
from cudal1.core.forms import is_kernel_form
from cudal1.core.types import EvalResult, KernelClass
from cudal1.tasks.task import Task


def _fmt_x(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def _fmt_ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.4g} ms"


def kernel_class_of(source: str, result: EvalResult, reference: str | None = None) -> str:
    """The result's kernel class, else the static analysis' (when available), else "unknown"."""
    if result.kernel_class is not None:
        return result.kernel_class.value
    try:
        return KernelClass(analyze_source(source, reference_source=reference).kernel_class).value
    except Exception:  # noqa: BLE001 - the header must be written even if the analysis fails
        return "unknown"


def header_lines(task: Task, source: str, result: EvalResult, provenance: dict[str, Any]) -> list[str]:
    """The comment lines (without '# ') that head a written candidate."""
    protocol, env = result.protocol, result.environment
    where = env.get("gpu_name") or env.get("device_type") or protocol.get("device") or "?"
    lines = [f"cudal1 optimize: best verified candidate for {task.id}",
             f"verdict: {result.status.value} (profile {protocol.get('profile', '?')}, "
             f"{protocol.get('correctness_trials', '?')} correctness trials, sizes {protocol.get('sizes', '?')}, "
             f"on {where})"]
    warm = result.timing.speedup_warm if result.timing else None
    lines.append(f"speedup vs eager: {_fmt_x(result.speedup)} (reference {_fmt_ms(result.ref_ms)}, candidate "
                 f"{_fmt_ms(result.candidate_ms)}; warm L2 {_fmt_x(warm)}; stability "
                 f"{'-' if result.stability is None else f'{result.stability:.1%}'})")
    if result.baselines:
        for name, value in sorted(result.baselines.items()):
            lines.append(f"speedup vs {name}: {_fmt_x(value)}")
    else:
        lines.append("speedup vs other baselines: none cached for this task and machine "
                     "(measure them with `cudal1 baseline`)")
    lines.append(f"kernel class: {kernel_class_of(source, result, task.source)}")
    origin = ", ".join(f"{k} {v}" for k, v in provenance.items() if v not in (None, ""))
    if origin:
        lines.append(f"from: {origin}")
    lines.append(f"candidate sha256: {result.candidate_hash or '-'}")
    return lines


def write_candidate(path: str | Path, task: Task, source: str, result: EvalResult, *,
                    provenance: dict[str, Any] | None = None, sidecar: dict[str, Any] | None = None
                    ) -> tuple[Path, Path]:
    """Write `source` with its header to `path` and `<path>.json`; return both paths. A kernel-form spec is
    written unchanged (`cudal1 eval -c` takes the file as is) and its header goes into the sidecar."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = header_lines(task, source, result, provenance or {})
    body = source if source.endswith(chr(10)) else source + chr(10)
    kernel = is_kernel_form(source)
    path.write_text(body if kernel else "\n".join(f"# {line}" for line in lines) + "\n" + body)
    data = {"task_id": task.id, "task_hash": task.hash, "candidate_file": str(path),
            **({"header": lines} if kernel else {}),
            "provenance": provenance or {}, "result": result.to_dict(), **(sidecar or {})}
    json_path = path.with_suffix(path.suffix + ".json")
    json_path.write_text(json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")
    return path, json_path


__all__ = ["header_lines", "kernel_class_of", "write_candidate"]
