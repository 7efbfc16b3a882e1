"""CPU tests for the built-in task suite (src/cudal1/tasks/builtin).

Every task: parses, has a docstring, Model/get_inputs/get_init_inputs and a valid SMALL_SIZES; at SMALL_SIZES
the reference runs on CPU, deterministically, and returns finite FP32 output; at full sizes it runs on the meta
device (shapes only, no memory). Every example: parses and defines ModelNew with the task's signatures; CUDA
examples are checked statically and (with load_inline stubbed out) for identical parameters; PyTorch examples
are checked for correctness against their reference at SMALL_SIZES. Timing is never asserted here; the GPU
run is tests/tasks/test_builtin_suite_gpu.py.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

import pytest
import torch

from cudal1.tasks.builtin import BUILTIN_DIR

TASK_FILES = sorted(BUILTIN_DIR.glob("level[123]/*.py"))
EXAMPLE_FILES = sorted((BUILTIN_DIR / "examples").glob("*.py"))
CUDA_EXAMPLES = [p for p in EXAMPLE_FILES if not p.stem.endswith("__torch")]
TORCH_EXAMPLES = [p for p in EXAMPLE_FILES if p.stem.endswith("__torch")]
TASKS_BY_NAME = {p.stem: p for p in TASK_FILES}
NAME_RE = re.compile(r"^[a-z][a-z0-9_]*$")
TOL = 1e-4


def _ids(paths: list[Path]) -> list[str]:
    return [f"{p.parent.name}/{p.stem}" for p in paths]


def exec_module(path: Path, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """Execute a module's source into a fresh namespace, then apply constant overrides."""
    ns: dict[str, Any] = {"__name__": f"cudal1_test_{path.stem}", "__file__": str(path)}
    exec(compile(path.read_text(), str(path), "exec"), ns)
    if overrides:
        ns.update(overrides)
    return ns


def load_small(path: Path) -> dict[str, Any]:
    """Execute a task module with its SMALL_SIZES applied."""
    ns = exec_module(path)
    ns.update(ns["SMALL_SIZES"])
    return ns


def task_for_example(path: Path) -> Path:
    return TASKS_BY_NAME[path.stem.removesuffix("__torch")]


def as_tuple(out: Any) -> tuple:
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


def build_and_run(ns: dict[str, Any], model_cls: type, seed: int = 0) -> tuple:
    """Seed, construct model_cls from the task's init inputs, draw inputs, run forward; returns outputs."""
    torch.manual_seed(seed)
    model = model_cls(*ns["get_init_inputs"]())
    inputs = ns["get_inputs"]()
    with torch.no_grad():
        return as_tuple(model(*inputs))


def _module_level(tree: ast.Module) -> tuple[dict[str, ast.AST], set[str]]:
    defs = {n.name: n for n in tree.body if isinstance(n, (ast.ClassDef, ast.FunctionDef))}
    consts = {
        t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)
    }
    return defs, consts


def _signature(func: ast.FunctionDef) -> list[str]:
    return [a.arg for a in func.args.args]


def _method(cls: ast.ClassDef, name: str) -> ast.FunctionDef:
    return next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == name)


def test_suite_counts_and_names():
    levels = {p.parent.name for p in TASK_FILES}
    assert levels == {"level1", "level2", "level3"}
    assert len(TASK_FILES) >= 24
    assert sum(p.parent.name == "level1" for p in TASK_FILES) >= 10
    assert sum(p.parent.name == "level2" for p in TASK_FILES) >= 7
    assert sum(p.parent.name == "level3" for p in TASK_FILES) >= 4
    names = [p.stem for p in TASK_FILES]
    assert len(names) == len(set(names)), "task names must be unique across levels"
    assert all(NAME_RE.match(n) for n in names)
    assert len(CUDA_EXAMPLES) >= 8
    assert len(TORCH_EXAMPLES) >= 4
    for p in EXAMPLE_FILES:
        assert p.stem.removesuffix("__torch") in TASKS_BY_NAME, f"{p.name} names no task"


@pytest.mark.parametrize("path", TASK_FILES, ids=_ids(TASK_FILES))
def test_task_structure(path: Path):
    tree = ast.parse(path.read_text())
    assert ast.get_docstring(tree), "module docstring missing"
    defs, consts = _module_level(tree)
    assert isinstance(defs.get("Model"), ast.ClassDef)
    assert isinstance(defs.get("get_inputs"), ast.FunctionDef)
    assert isinstance(defs.get("get_init_inputs"), ast.FunctionDef)
    assert "SMALL_SIZES" in consts
    ns = exec_module(path)
    small = ns["SMALL_SIZES"]
    assert isinstance(small, dict) and small
    for key, value in small.items():
        assert key.isupper() and key in consts, f"SMALL_SIZES key {key} is not a module constant"
        assert type(value) is type(ns[key]), f"{key}: override type differs"
    for fname in ("get_inputs", "get_init_inputs"):
        body = ast.unparse(defs[fname])
        assert ".cuda(" not in body and "device=" not in body, f"{fname} must not pick a device"


@pytest.mark.parametrize("path", TASK_FILES, ids=_ids(TASK_FILES))
def test_task_runs_small_on_cpu(path: Path):
    ns = load_small(path)
    outs = build_and_run(ns, ns["Model"])
    again = build_and_run(ns, ns["Model"])
    assert outs and all(isinstance(o, torch.Tensor) for o in outs)
    for out, out2 in zip(outs, again, strict=True):
        if out.is_floating_point():
            assert out.dtype == torch.float32
            assert torch.isfinite(out).all()
        assert out.numel() > 0
        assert torch.equal(out, out2), "reference is not deterministic under a fixed seed"
    torch.manual_seed(0)
    for t in ns["get_inputs"]():
        if t.is_floating_point():
            assert t.dtype == torch.float32


@pytest.mark.parametrize("path", TASK_FILES, ids=_ids(TASK_FILES))
def test_task_full_size_shapes_on_meta(path: Path, capsys: pytest.CaptureFixture[str]):
    ns = exec_module(path)
    small_inputs_numel = sum(t.numel() for t in load_small(path)["get_inputs"]())
    with torch.device("meta"):
        model = ns["Model"](*ns["get_init_inputs"]())
        inputs = ns["get_inputs"]()
        outs = as_tuple(model(*inputs))
    assert all(t.device.type == "meta" for t in inputs)
    assert all(isinstance(o, torch.Tensor) and o.device.type == "meta" for o in outs)
    full_numel = sum(t.numel() for t in inputs)
    assert full_numel > small_inputs_numel, "get_inputs must read the module constants at call time"
    assert sum(t.numel() * t.element_size() for t in inputs) <= 4.3e9, "inputs above ~4 GB"
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == ""


@pytest.mark.parametrize("path", EXAMPLE_FILES, ids=_ids(EXAMPLE_FILES))
def test_example_signatures_match_task(path: Path):
    tree = ast.parse(path.read_text())
    assert ast.get_docstring(tree), "module docstring missing"
    defs, _ = _module_level(tree)
    new = defs.get("ModelNew")
    assert isinstance(new, ast.ClassDef)
    ref_defs, _ = _module_level(ast.parse(task_for_example(path).read_text()))
    ref = ref_defs["Model"]
    for method in ("__init__", "forward"):
        assert _signature(_method(new, method)) == _signature(_method(ref, method)), method
    assert "get_inputs" not in defs and "get_init_inputs" not in defs


@pytest.mark.parametrize("path", CUDA_EXAMPLES, ids=_ids(CUDA_EXAMPLES))
def test_cuda_example_form(path: Path):
    source = path.read_text()
    tree = ast.parse(source)
    calls = [
        n for n in ast.walk(tree)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "load_inline"
    ]
    assert len(calls) == 1
    kwargs = {k.arg: k.value for k in calls[0].keywords}
    assert {"name", "cpp_sources", "cuda_sources", "functions", "extra_cuda_cflags"} <= set(kwargs)
    assert ast.literal_eval(kwargs["extra_cuda_cflags"]) == ["-O3"]
    assert "getCurrentCUDAStream()" in source and "<<<" in source and "__global__" in source
    for banned in ("cudaStreamCreate", "__half", "__nv_bfloat16", "allow_tf32", "use_fast_math", "cudaDeviceSynchronize"):
        assert banned not in source, f"{banned} in a CUDA example"
    assert not any(isinstance(n, ast.Try) for n in ast.walk(tree)), "no try/except fallbacks"
    functions = ast.literal_eval(kwargs["functions"])
    for fn in functions:
        assert f"_ext.{fn}(" in source, f"compiled function {fn} is never called"


class _FakeExtension:
    """Stands in for a compiled extension so a CUDA example's ModelNew can be constructed on CPU."""

    def __getattr__(self, name: str):
        raise RuntimeError(f"{name}: CUDA extension not available on CPU")


@pytest.mark.parametrize("path", CUDA_EXAMPLES, ids=_ids(CUDA_EXAMPLES))
def test_cuda_example_parameters_match_reference(path: Path, monkeypatch: pytest.MonkeyPatch):
    """ModelNew must draw the same parameters as Model under the same seed (the harness compares outputs)."""
    import torch.utils.cpp_extension as cpp_extension

    seen: dict[str, Any] = {}

    def fake_load_inline(**kwargs: Any) -> _FakeExtension:
        seen.update(kwargs)
        return _FakeExtension()

    monkeypatch.setattr(cpp_extension, "load_inline", fake_load_inline)
    cand = exec_module(path)
    assert seen["name"].startswith("cudal1_builtin_")
    ref = load_small(task_for_example(path))
    torch.manual_seed(0)
    ref_model = ref["Model"](*ref["get_init_inputs"]())
    torch.manual_seed(0)
    new_model = cand["ModelNew"](*ref["get_init_inputs"]())
    ref_state, new_state = ref_model.state_dict(), new_model.state_dict()
    assert list(ref_state) == list(new_state)
    for key in ref_state:
        assert torch.equal(ref_state[key], new_state[key]), key


@pytest.mark.parametrize("path", TORCH_EXAMPLES, ids=_ids(TORCH_EXAMPLES))
def test_torch_example_matches_reference(path: Path):
    source = path.read_text()
    assert "load_inline" not in source and ".cuda(" not in source
    ref = load_small(task_for_example(path))
    cand = exec_module(path)
    for trial in range(2):
        torch.manual_seed(trial)
        ref_model = ref["Model"](*ref["get_init_inputs"]())
        torch.manual_seed(trial)
        new_model = cand["ModelNew"](*ref["get_init_inputs"]())
        torch.manual_seed(100 + trial)
        inputs = ref["get_inputs"]()
        with torch.no_grad():
            expected = as_tuple(ref_model(*[t.clone() for t in inputs]))
            got = as_tuple(new_model(*[t.clone() for t in inputs]))
        assert len(expected) == len(got)
        for e, g in zip(expected, got, strict=True):
            assert type(g) is torch.Tensor and g.shape == e.shape and g.dtype == e.dtype
            torch.testing.assert_close(g, e, atol=TOL, rtol=TOL)
