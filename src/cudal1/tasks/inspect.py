"""Validate a task and describe its problem (sizes, input and output shapes) without allocating memory.

Shapes are computed on PyTorch's `meta` device: factories inside `get_inputs()` create tensors with
shapes and dtypes but no storage, so even a task with gigabytes of inputs is described instantly on a
laptop. A reference that cannot run on `meta` (custom ops, explicit `.cuda()`) still validates; its
shapes are then reported as unknown.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import torch

from cudal1.core.errors import TaskError
from cudal1.tasks.task import Task

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class TensorSpec:
    shape: tuple[int, ...]
    dtype: str

    @property
    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    @property
    def nbytes(self) -> int:
        return self.numel * torch.empty((), dtype=getattr(torch, self.dtype)).element_size()

    def __str__(self) -> str:
        return f"{self.dtype}{list(self.shape)}"


@dataclass(frozen=True)
class TaskInfo:
    """What a task computes and on what."""

    task_id: str
    level: int | None
    description: str
    constants: dict[str, Any]
    init_inputs: list[str]  # repr of each init input
    inputs: list[TensorSpec | str] = field(default_factory=list)
    outputs: list[TensorSpec | str] = field(default_factory=list)
    parameters_bytes: int | None = None
    shapes_known: bool = True
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        def enc(x: TensorSpec | str) -> Any:
            return {"shape": list(x.shape), "dtype": x.dtype} if isinstance(x, TensorSpec) else x
        return {"id": self.task_id, "level": self.level, "description": self.description,
                "constants": {k: (list(v) if isinstance(v, tuple) else v) for k, v in self.constants.items()},
                "init_inputs": self.init_inputs, "inputs": [enc(x) for x in self.inputs],
                "outputs": [enc(x) for x in self.outputs], "parameters_bytes": self.parameters_bytes,
                "shapes_known": self.shapes_known, "note": self.note}


def _spec(x: Any) -> TensorSpec | str:
    if isinstance(x, torch.Tensor):
        return TensorSpec(tuple(x.shape), str(x.dtype).removeprefix("torch."))
    text = repr(x)
    return text if len(text) <= 60 else text[:57] + "..."


def _flatten_outputs(out: Any) -> list[Any]:
    if isinstance(out, (tuple, list)):
        return [o for item in out for o in _flatten_outputs(item)]
    return [out]


def inspect_task(task: Task, sizes: str = "full") -> TaskInfo:
    """Load a task, call its input factories and trace its forward on the meta device.

    Raises `TaskError` (one line naming the task) when the source is malformed or a factory raises.
    """
    ref = task.load(sizes=sizes)
    try:
        init_inputs = list(ref.get_init_inputs())
    except Exception as exc:  # noqa: BLE001
        raise TaskError(task.id, f"get_init_inputs() raised {type(exc).__name__}: {exc}") from None
    info: dict[str, Any] = dict(task_id=task.id, level=task.level, description=task.description,
                                constants=ref.constants, init_inputs=[_spec(x) for x in init_inputs])
    try:
        with torch.device("meta"):
            inputs = list(ref.get_inputs())
    except Exception as exc:  # noqa: BLE001 - retry on CPU only to tell a broken factory from a meta gap
        _check_inputs_on_cpu(task, ref, exc)
        return TaskInfo(**info, shapes_known=False, note=f"shapes unknown on meta: {type(exc).__name__}")
    info["inputs"] = [_spec(x) for x in inputs]
    try:
        with torch.device("meta"), torch.no_grad():
            model = ref.Model(*init_inputs)
            outputs = _flatten_outputs(model(*inputs))
        params = sum(p.numel() * p.element_size() for p in model.parameters())
        params += sum(b.numel() * b.element_size() for b in model.buffers())
    except Exception as exc:  # noqa: BLE001 - many ops lack meta kernels; that is not a task error
        logger.debug("meta trace of %s failed: %s", task.id, exc)
        return TaskInfo(**info, shapes_known=False, note=f"output shapes unknown: {type(exc).__name__}")
    return TaskInfo(**info, outputs=[_spec(o) for o in outputs], parameters_bytes=params)


def _check_inputs_on_cpu(task: Task, ref: Any, meta_exc: Exception) -> None:
    """A factory that fails on meta may be fine elsewhere; only small problems are tried for real."""
    if "meta" in str(meta_exc).lower() or "cuda" in str(meta_exc).lower():
        return
    raise TaskError(task.id, f"get_inputs() raised {type(meta_exc).__name__}: {meta_exc}") from None
