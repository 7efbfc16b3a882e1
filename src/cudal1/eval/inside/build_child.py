"""Entries of the build children the compile service starts: import a candidate so that its builds run.

Run in a sandboxed runner (`processes.run_isolated`), in the environment of `compile.build_environment`,
with the build hooks installed (`build_hooks.install_build_hooks`):

- `prepare_candidate`: import the candidate (its `load_inline` builds run and are recorded) and, with init
  inputs, instantiate `ModelNew(*init_inputs)` (many candidates build lazily in `__init__`);
- `warm_lazy_builds`: run one forward of the candidate on the reference's inputs, so that builds made lazily
  in `forward` happen here too;
- `reference_init_inputs`: a reference's `get_init_inputs()` when JSON can carry it.

They judge nothing: whether a failed build fails the candidate is the evaluation's verdict.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from cudal1.eval.inside.build_hooks import BuildRecorder, capture_fds, install_build_hooks


def import_candidate(source: str, directory: Path | None = None) -> Any:
    """Write `source` to a file in `directory` (default: cwd) and import it under a unique module name."""
    digest = hashlib.sha256(source.encode()).hexdigest()[:16]
    module_name = f"cudal1_candidate_{digest}"
    path = (directory or Path.cwd()) / f"{module_name}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import the candidate from {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    return module


def _instantiate(module: Any, init_inputs: list[Any], device: str) -> Any:
    """`ModelNew(*init_inputs)` with `device` as the default device (and current CUDA device)."""
    import torch

    model_cls = getattr(module, "ModelNew", None)
    if model_cls is None:
        raise AttributeError("the candidate defines no class ModelNew")
    if device.startswith("cuda"):
        torch.cuda.set_device(torch.device(device))
    with torch.device(device):
        return model_cls(*init_inputs)


def _one_line(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:300]


def prepare_candidate(payload: dict[str, Any]) -> dict[str, Any]:
    """Entry of the build child. Payload: `source` (str), `init_inputs` (JSON list or None), `device`
    ('cpu' or 'cuda:N'), `levers` (dict of `BuildLevers`), `nice` (added niceness) and `cpus` (the cores it
    may use), both inherited by the compilers.

    Returns {"ok", "builds": [{"name", "seconds", "ok", "variant"}], "seconds", "log", "import_ok"}:
    ok is True when the import (and instantiation) succeeded and every recorded build succeeded; log is
    the trimmed compiler log of the first failed build, else the one-line exception, else "".
    """
    start = time.monotonic()
    recorder = _setup_child(payload)
    error: BaseException | None = None
    try:
        with capture_fds():  # candidates print; keep the child's stdout clean
            module = import_candidate(payload["source"])
            init_inputs = payload.get("init_inputs")
            if init_inputs is not None:
                _instantiate(module, list(init_inputs), str(payload.get("device") or "cpu"))
    except BaseException as exc:  # noqa: BLE001 - the candidate is untrusted; report whatever it raised
        error = exc
    failed = [r for r in recorder.records if not r.ok]
    if failed:
        log = failed[0].log
    elif error is not None:
        log = _one_line(error)
    else:
        log = ""
    return {"ok": error is None and not failed, "import_ok": error is None,
            "builds": [r.to_dict() for r in recorder.records],
            "seconds": round(time.monotonic() - start, 3), "log": log}


def _setup_child(payload: dict[str, Any]) -> BuildRecorder:
    """The payload's niceness and cores for this child (its compilers inherit them), then the build hooks."""
    if payload.get("nice"):
        os.nice(int(payload["nice"]))
    if payload.get("cpus") and hasattr(os, "sched_setaffinity"):
        with contextlib.suppress(OSError):  # cores this process may not use: build wherever allowed
            os.sched_setaffinity(0, payload["cpus"])
    return install_build_hooks(payload.get("levers"))


def warm_lazy_builds(payload: dict[str, Any]) -> dict[str, Any]:
    """Entry of the warm-up child: run the candidate once, as the evaluation will, so that the builds it makes
    lazily (in `forward`, or in `ModelNew(...)` when the build child had no init inputs) happen here, in the
    build environment, instead of in the candidate's runner on the GPU's clock. Payload: `source`,
    `ref_source` (the task's reference module: `get_init_inputs()`, `get_inputs()`), `sizes` ('full' or
    'small', as the evaluation will use), `device` ('cpu' or 'cuda:N'), `levers`, `nice`, `cpus` (as for
    `prepare_candidate`).

    Returns {"builds": [{"name", "seconds", "ok", "variant", "phase"}], "forward_ok", "forward_error",
    "seconds"}: phase says where a build happened ("import", "init" or "forward"), forward_error is the
    candidate's one-line exception ("" when the forward ran). Judges nothing: whether a lazy failure fails
    the candidate is the evaluation's verdict.
    """
    import torch

    from cudal1.eval.inside.harness import make_inputs
    from cudal1.tasks.task import load_reference

    start = time.monotonic()
    recorder = _setup_child(payload)
    device = str(payload.get("device") or "cpu")
    phase = "import"
    phases: list[str] = []  # where each record was made

    def begin(next_phase: str) -> None:
        """The records made so far were made during the current phase; the next ones during `next_phase`."""
        nonlocal phase
        phases.extend([phase] * (len(recorder.records) - len(phases)))
        phase = next_phase

    error: BaseException | None = None
    try:
        with capture_fds():  # candidates print; keep the child's stdout clean
            ref = load_reference(payload["ref_source"], "warm-up", sizes=str(payload.get("sizes") or "full"))
            module = import_candidate(payload["source"])
            begin("init")
            model = _instantiate(module, list(ref.get_init_inputs()), device)
            if isinstance(model, torch.nn.Module):
                model = model.to(device)
            begin("forward")
            inputs = make_inputs(ref, torch.device(device), seed=0)  # as the evaluation makes them
            with torch.no_grad():
                model(*inputs)
            if device.startswith("cuda"):
                torch.cuda.synchronize()
    except BaseException as exc:  # noqa: BLE001 - the candidate is untrusted; report whatever it raised
        error = exc
    begin(phase)  # the records of the phase that ended the run
    return {"builds": [{**r.to_dict(), "phase": p} for r, p in zip(recorder.records, phases, strict=True)],
            "forward_ok": error is None, "forward_error": _one_line(error) if error is not None else "",
            "seconds": round(time.monotonic() - start, 3)}


def reference_init_inputs(payload: dict[str, Any]) -> dict[str, Any]:
    """Entry for isolated use: run a reference module's `get_init_inputs()` and return it if JSON-able.

    Payload: `ref_source`. Returns {"init_inputs": list | None, "error": str | None}.
    """
    try:
        module = import_candidate(payload["ref_source"])
        values = list(module.get_init_inputs())
        json.dumps(values)
    except Exception as exc:  # noqa: BLE001 - reported to the caller
        return {"init_inputs": None, "error": _one_line(exc)}
    return {"init_inputs": values, "error": None}
