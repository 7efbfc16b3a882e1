"""The study's tasks: op families of three kinds at 3-4 sizes each, their reference modules and features.

Kinds: elementwise chains (`ew`), row-wise reductions and normalizations (`row`), transposes fused with an
elementwise op (`tr`). Every task moves at least 512 MB (the fastest recipes run for about 100 us or more on
an H200), so no task is launch-bound. The references are written as PyTorch would be by hand (several
kernels: `x * torch.sigmoid(x)`, softmax from max, exp and sum), the form KernelBench tasks take, so a fused
kernel has something to gain; `row_sum` is left to PyTorch's own reduction (little to gain: some tasks are so).

A task's features (`features`): the kind, how many tensors it reads, whether its math is heavy
(transcendentals), the passes over a row its natural algorithm makes, whether it writes a row or a value per
row, and the log2 sizes. Never the family's name. What a policy is shown of them is a feature set
(`FEATURE_SETS`, `visible_features`): `full` (all seven; the first study's, under which a lookup of the
training tasks' results by kind and size already found 0.99 of the held-out best without any feedback) or
`kind` (the kind alone: the study's default, so that what a task needs must come from feedback).

Held-out (never trained on, `HELD_OUT_FAMILIES`): whole families, one or more per kind.
"""

from __future__ import annotations

from dataclasses import dataclass

from cudal1.tasks.task import Task

KINDS = ("ew", "row", "tr")
#: What a policy is shown of a task's features: the first `n` of them (module docstring).
FEATURE_SETS = {"full": 7, "kind": 1}


def visible_features(features: list[str], feature_set: str) -> list[str]:
    """The part of a task's features (`StudyTask.features` order) a policy is shown under `feature_set`."""
    if feature_set not in FEATURE_SETS:
        raise ValueError(f"feature set must be one of {sorted(FEATURE_SETS)}, not {feature_set!r}")
    return list(features[:FEATURE_SETS[feature_set]])


@dataclass(frozen=True)
class Family:
    """One op family: what it computes (PyTorch and CUDA) and at which sizes."""

    name: str
    kind: str
    inputs: int  # tensors read (x, or x and z)
    heavy: bool  # transcendental math per element
    passes: int  # passes over a row of the natural kernel (row ops; 1 otherwise)
    row_out: bool  # one value per row (a reduction) instead of a full output
    torch_forward: str  # the reference's forward body (a return statement on x[, z])
    cuda_op: str  # ew/tr: CUDA expression of `a` (and `b`, the second input); row: the family's body name
    shapes: tuple[tuple[int, int], ...]  # (rows, cols); elementwise: (1, n)


_EW = ((1, 1 << 26), (1, 1 << 27), (1, 1 << 28))
_ROW = ((1 << 19, 1 << 8), (1 << 16, 1 << 11), (1 << 13, 1 << 14), (1 << 11, 1 << 16))
_TR = ((1 << 11, 1 << 15), (1 << 13, 1 << 13), (1 << 15, 1 << 11))

FAMILIES: dict[str, Family] = {f.name: f for f in (
    Family("swish", "ew", 1, True, 1, False, "return x * torch.sigmoid(x)", "a / (1.0f + expf(-a))", _EW),
    Family("gelu", "ew", 1, True, 1, False, "return 0.5 * x * (1.0 + torch.erf(x * 0.7071067811865476))",
           "0.5f * a * (1.0f + erff(a * 0.70710678118654752f))", _EW),
    Family("mish", "ew", 1, True, 1, False, "return x * torch.tanh(torch.nn.functional.softplus(x))",
           "a * tanhf(a > 20.0f ? a : log1pf(expf(a)))", _EW),
    Family("axpby_relu", "ew", 2, False, 1, False, "return torch.relu(1.5 * x - 0.5 * z)",
           "fmaxf(1.5f * a - 0.5f * b, 0.0f)", _EW),
    Family("row_sum", "row", 1, False, 1, True, "return x.sum(-1)", "row_sum", _ROW),
    Family("row_l2norm", "row", 1, False, 1, True, "return (x * x).sum(-1).sqrt()", "row_l2norm", _ROW),
    Family("logsumexp", "row", 1, True, 2, True,
           "m = x.max(-1, keepdim=True).values\n        return (m + torch.log(torch.exp(x - m).sum(-1, keepdim=True)))"
           ".squeeze(-1)", "logsumexp", _ROW),
    Family("softmax", "row", 1, True, 3, False,
           "e = torch.exp(x - x.max(-1, keepdim=True).values)\n        return e / e.sum(-1, keepdim=True)",
           "softmax", _ROW),
    Family("rmsnorm", "row", 1, False, 2, False, "return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + 1e-5)",
           "rmsnorm", _ROW),
    Family("layernorm", "row", 1, False, 3, False,
           "mean = x.mean(-1, keepdim=True)\n        var = ((x - mean) ** 2).mean(-1, keepdim=True)\n"
           "        return (x - mean) / torch.sqrt(var + 1e-5)", "layernorm", _ROW),
    Family("transpose_add", "tr", 2, False, 1, False, "return x.t() + z", "a + b", _TR),
    Family("transpose_gelu", "tr", 1, True, 1, False,
           "y = x.t()\n        return 0.5 * y * (1.0 + torch.erf(y * 0.7071067811865476))",
           "0.5f * a * (1.0f + erff(a * 0.70710678118654752f))", _TR),
)}

#: Families never trained on: one or more of every kind, so held-out tasks test transfer through features
#: and exemplars alone.
HELD_OUT_FAMILIES = ("mish", "logsumexp", "rmsnorm", "transpose_gelu")


@dataclass(frozen=True)
class StudyTask:
    """One (family, shape) of the study."""

    family: Family
    rows: int
    cols: int

    @property
    def id(self) -> str:
        f = self.family
        size = f"n{self.cols.bit_length() - 1}" if f.kind == "ew" else \
            f"r{self.rows.bit_length() - 1}_c{self.cols.bit_length() - 1}"
        return f"study/{f.name}_{size}"

    @property
    def held_out(self) -> bool:
        return self.family.name in HELD_OUT_FAMILIES

    @property
    def numel(self) -> int:
        return self.rows * self.cols

    @property
    def features(self) -> list[str]:
        """What a policy sees of the task (module docstring), as tokens."""
        f = self.family
        return [f.kind, f"in{f.inputs}", "heavy" if f.heavy else "light", f"p{f.passes}",
                "rowout" if f.row_out else "fullout", f"r{self.rows.bit_length() - 1}",
                f"c{self.cols.bit_length() - 1}"]

    @property
    def min_bytes(self) -> int:
        """The bytes the task must move at least (inputs read once, output written once), float32."""
        f = self.family
        out = self.rows if f.row_out else self.numel
        return 4 * (f.inputs * self.numel + out)

    def reference_source(self) -> str:
        return reference_source(self)

    def to_task(self) -> Task:
        """The project's task (KernelBench format) for the evaluator."""
        return Task(self.id, self.reference_source(), level=1, origin="contrastive_study")


_REFERENCE = '''"""Study task {id}: {name} ({kind}) on float32, {shape}."""
import torch
import torch.nn as nn

ROWS = {rows}
COLS = {cols}


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, {args}):
        {forward}


def get_inputs():
    return [{inputs}]


def get_init_inputs():
    return []
'''


def reference_source(task: StudyTask) -> str:
    """The reference module of a task: `Model` on x (ROWS x COLS; elementwise: a flat COLS) [and z]."""
    f = task.family
    x = "torch.randn(COLS)" if f.kind == "ew" else "torch.randn(ROWS, COLS)"
    z = {"ew": "torch.randn(COLS)", "tr": "torch.randn(COLS, ROWS)"}.get(f.kind, "")
    shape = f"{task.cols} elements" if f.kind == "ew" else f"{task.rows} x {task.cols}"
    return _REFERENCE.format(id=task.id, name=f.name, kind=f.kind, shape=shape, rows=task.rows, cols=task.cols,
                             args="x, z" if f.inputs == 2 else "x", forward=f.torch_forward,
                             inputs=f"{x}, {z}" if f.inputs == 2 else x)


def study_tasks() -> list[StudyTask]:
    """Every task of the study, training ones first, each family's sizes in order."""
    tasks = [StudyTask(f, rows, cols) for f in FAMILIES.values() for rows, cols in f.shapes]
    return sorted(tasks, key=lambda t: t.held_out)


def task_by_id() -> dict[str, StudyTask]:
    return {t.id: t for t in study_tasks()}
