"""Tests of the raw-form built-in examples (src/cudal1/tasks/builtin/examples_raw).

CPU (CI): every `load_inline` example has a raw twin; each twin parses, has a docstring, defines ModelNew
with its task's signatures, keeps its CUDA in a `SOURCE` string without torch headers, compiles with NVRTC
for sm_90 (skipped when NVRTC is not loadable), launches only kernels it defines, each with an argument
tuple as long as the kernel's parsed signature, launches every kernel it defines, classifies as
`custom_cuda` with no rejecting flag under the strict preset, and (with `load_kernels` stubbed out) draws
exactly the reference Model's parameters under the same seed and runs forward at SMALL_SIZES with every
launch's arguments marshalled against the kernel signature as the launcher would (a CPU dry run: no
kernel executes, so numerical correctness is only checked by the GPU test).
GPU (`-m gpu`): every raw example is evaluated by `evaluate_many` and must be correct and `custom_cuda`;
speedups are printed, not asserted.
"""

from __future__ import annotations

import ast
import types
from pathlib import Path
from typing import Any

import pytest
import torch

from cudal1.analysis import analyze_source, rejecting_flags
from cudal1.core.types import KernelClass
from cudal1.raw_cuda import compile_only, marshal_args, parse_kernel_signatures
from cudal1.raw_cuda.compiler import nvrtc_version
from cudal1.tasks.builtin import BUILTIN_DIR

RAW_DIR = BUILTIN_DIR / "examples_raw"
RAW_FILES = sorted(RAW_DIR.glob("*.py"))
INLINE_FILES = sorted(p for p in (BUILTIN_DIR / "examples").glob("*.py") if not p.stem.endswith("__torch"))
TASKS_BY_NAME = {p.stem: p for p in BUILTIN_DIR.glob("level[123]/*.py")}
IDS = [p.stem for p in RAW_FILES]


def _exec(path: Path) -> dict[str, Any]:
    ns: dict[str, Any] = {"__name__": f"cudal1_test_raw_{path.stem}", "__file__": str(path)}
    exec(compile(path.read_text(), str(path), "exec"), ns)
    return ns


def _small_reference(name: str) -> dict[str, Any]:
    ns = _exec(TASKS_BY_NAME[name])
    ns.update(ns["SMALL_SIZES"])
    return ns


def _defs(tree: ast.Module) -> dict[str, ast.AST]:
    return {n.name: n for n in tree.body if isinstance(n, (ast.ClassDef, ast.FunctionDef))}


def _arg_names(cls: ast.ClassDef, method: str) -> list[str]:
    func = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == method)
    return [a.arg for a in func.args.args]


def _module_string(tree: ast.Module, name: str) -> str:
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            assert isinstance(node.value, ast.Constant) and isinstance(node.value.value, str), name
            return node.value.value
    raise AssertionError(f"no module-level string {name}")


def _kernel_set_names(tree: ast.Module) -> set[str]:
    """Names bound to the result of `load_kernels(...)`."""
    names = set()
    for node in ast.walk(tree):
        if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)
                and isinstance(node.value.func, ast.Name) and node.value.func.id == "load_kernels"):
            names |= {t.id for t in node.targets if isinstance(t, ast.Name)}
    return names


def _launches(tree: ast.Module) -> list[tuple[str, ast.Call]]:
    """(kernel name, call) for every `<kernel set>.<kernel>(...)` call."""
    sets = _kernel_set_names(tree)
    out = []
    for node in ast.walk(tree):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Name) and node.func.value.id in sets):
            out.append((node.func.attr, node))
    return out


def test_every_load_inline_example_has_a_raw_twin():
    assert len(INLINE_FILES) >= 10
    assert [p.name for p in RAW_FILES] == [p.name for p in INLINE_FILES]


@pytest.mark.parametrize("path", RAW_FILES, ids=IDS)
def test_raw_example_structure(path: Path):
    source = path.read_text()
    tree = ast.parse(source)
    doc = ast.get_docstring(tree)
    assert doc and f"examples/{path.name}" in doc, "docstring must name the load_inline twin"
    defs = _defs(tree)
    new = defs.get("ModelNew")
    assert isinstance(new, ast.ClassDef)
    ref = _defs(ast.parse(TASKS_BY_NAME[path.stem].read_text()))["Model"]
    for method in ("__init__", "forward"):
        assert _arg_names(new, method) == _arg_names(ref, method), method
    assert "get_inputs" not in defs and "get_init_inputs" not in defs
    code_names = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}
    code_names |= {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    code_names |= {a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom | ast.Import) for a in n.names}
    assert not code_names & {"load_inline", "cpp_extension", "load"}, "raw form only"
    assert len(_kernel_set_names(tree)) == 1, "exactly one load_kernels(...) at module level"
    cuda = _module_string(tree, "SOURCE")
    assert "torch/" not in cuda and "ATen" not in cuda and "c10" not in cuda, "no torch headers"
    assert "<<<" not in cuda and 'extern "C"' in cuda
    for banned in ("cudaStreamCreate", "use_fast_math", "allow_tf32", "cudaDeviceSynchronize", "stream="):
        assert banned not in source, banned
    assert not any(isinstance(n, ast.Try) for n in ast.walk(tree)), "no try/except fallbacks"


@pytest.mark.parametrize("path", RAW_FILES, ids=IDS)
def test_raw_example_launches_match_signatures(path: Path):
    tree = ast.parse(path.read_text())
    sigs = parse_kernel_signatures(_module_string(tree, "SOURCE"))
    assert sigs and all(s.extern_c for s in sigs.values())
    launched = set()
    for name, call in _launches(tree):
        assert name in sigs, f"launches {name}, which SOURCE does not define ({sorted(sigs)})"
        launched.add(name)
        kwargs = {k.arg: k.value for k in call.keywords}
        assert not call.args, f"{name}: launch arguments must be keywords"
        assert {"grid", "block", "args"} <= set(kwargs), name
        args = kwargs["args"]
        if isinstance(args, ast.Tuple) and not any(isinstance(e, ast.Starred) for e in args.elts):
            assert len(args.elts) == len(sigs[name].params), (
                f"{name}: {len(args.elts)} arguments for {sigs[name].describe()}")
        block = kwargs["block"]
        if isinstance(block, ast.Tuple):
            assert 1 <= len(block.elts) <= 3
    assert launched == set(sigs), f"kernels defined but never launched: {sorted(set(sigs) - launched)}"


@pytest.mark.skipif(nvrtc_version() is None, reason="NVRTC (libnvrtc via cuda-python) is not loadable here")
@pytest.mark.parametrize("path", RAW_FILES, ids=IDS)
def test_raw_example_compiles_with_nvrtc(path: Path):
    cuda = _module_string(ast.parse(path.read_text()), "SOURCE")
    result = compile_only(cuda, arch="sm_90", compiler="nvrtc", use_cache=False)
    assert result.cubin_bytes[:4] == b"\x7fELF"
    assert not result.cache_hit and result.arch == "sm_90"


@pytest.mark.parametrize("path", RAW_FILES, ids=IDS)
def test_raw_example_static_analysis(path: Path):
    report = analyze_source(path.read_text(), reference_source=TASKS_BY_NAME[path.stem].read_text())
    assert report.kernel_class is KernelClass.CUSTOM_CUDA
    assert rejecting_flags(report, "strict") == [], [f.message for f in report.flags]


class _FakeKernels:
    """Stands in for a KernelSet so ModelNew can be constructed without compiling or a GPU."""

    def __getattr__(self, name: str):
        raise RuntimeError(f"{name}: raw kernels cannot be launched on CPU")


@pytest.mark.parametrize("path", RAW_FILES, ids=IDS)
def test_raw_example_parameters_match_reference(path: Path, monkeypatch: pytest.MonkeyPatch):
    """ModelNew must draw the same parameters as Model under the same seed (the harness compares outputs)."""
    import cudal1.raw_cuda

    seen: list[str] = []

    def fake_load_kernels(source: str, *args: Any, **kwargs: Any) -> _FakeKernels:
        seen.append(source)
        return _FakeKernels()

    monkeypatch.setattr(cudal1.raw_cuda, "load_kernels", fake_load_kernels)
    cand = _exec(path)
    assert len(seen) == 1 and "__global__" in seen[0]
    ref = _small_reference(path.stem)
    for seed in (0, 1):
        torch.manual_seed(seed)
        ref_model = ref["Model"](*ref["get_init_inputs"]())
        torch.manual_seed(seed)
        new_model = cand["ModelNew"](*ref["get_init_inputs"]())
        ref_state, new_state = ref_model.state_dict(), new_model.state_dict()
        assert list(ref_state) == list(new_state)
        for key in ref_state:
            assert torch.equal(ref_state[key], new_state[key]), key
        # No silent PyTorch fallback: on CPU the forward must refuse (input check or the fake launch).
        with pytest.raises((RuntimeError, ValueError), match="CUDA|CPU"):
            new_model(*ref["get_inputs"]())


class _DryRunKernels:
    """A KernelSet stand-in that checks each launch's arguments against the parsed signature (dtype,
    count, integer range, contiguity) exactly as the launcher does, accepting CPU tensors, and records it."""

    def __init__(self, source: str, launches: list[tuple[str, tuple, list[str]]]):
        self.signatures = parse_kernel_signatures(source)
        self.launches = launches

    def __getattr__(self, name: str):
        params = self.signatures[name].params

        def launch(*, grid: Any, block: Any, args: tuple = (), shared_mem_bytes: int = 0) -> None:
            cargs = marshal_args(name, params, args, tensor_pointer=lambda t: t.data_ptr())
            assert shared_mem_bytes <= 200 * 1024
            self.launches.append((name, tuple(grid), [c.ctype for c in cargs]))

        return launch


@pytest.mark.parametrize("path", RAW_FILES, ids=IDS)
def test_raw_example_forward_dry_run_on_cpu(path: Path, monkeypatch: pytest.MonkeyPatch):
    """Run forward at SMALL_SIZES on CPU with launches marshalled but not executed: the Python side
    (shapes, grid, argument types) is exercised; the CUDA device checks are rewritten to accept CPU."""
    import cudal1.raw_cuda

    launches: list[tuple[str, tuple, list[str]]] = []
    kernel_sets: list[_DryRunKernels] = []

    def fake_load_kernels(source: str, *args: Any, **kwargs: Any) -> _DryRunKernels:
        kernel_sets.append(_DryRunKernels(source, launches))
        return kernel_sets[-1]

    monkeypatch.setattr(cudal1.raw_cuda, "load_kernels", fake_load_kernels)
    source = path.read_text()
    assert ".is_cpu" not in source
    source = source.replace(".is_cuda", ".is_cpu").replace("torch.cuda.get_device_properties(", "_props(")
    cand: dict[str, Any] = {"__name__": f"cudal1_test_dry_{path.stem}",
                            "_props": lambda device: types.SimpleNamespace(multi_processor_count=132)}
    exec(compile(source, str(path), "exec"), cand)
    ref = _small_reference(path.stem)
    torch.manual_seed(0)
    model = cand["ModelNew"](*ref["get_init_inputs"]())
    with torch.no_grad():
        model(*ref["get_inputs"]())
    assert {name for name, _, _ in launches} == set(kernel_sets[0].signatures)
    assert all(all(g >= 1 for g in grid) for _, grid, _ in launches)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_raw_examples_correct_through_the_evaluator():
    from cudal1.eval import EvalConfig, Status, evaluate_many
    from cudal1.tasks.sources import example_candidates

    pairs = example_candidates("cuda", forms=["raw"])
    assert len(pairs) == len(RAW_FILES)
    results = evaluate_many([(task, src) for task, _, src in pairs], EvalConfig(device="cuda"))
    failures = []
    for (task, _, _), r in zip(pairs, results, strict=True):
        print(f"{task.id:45s} raw {r.status.value:14s} speedup {r.speedup or 0:6.2f}x "
              f"class {r.kernel_class} {r.message[:80]}")
        if r.status is not Status.CORRECT or r.kernel_class is not KernelClass.CUSTOM_CUDA:
            failures.append((task.id, r.status.value, r.kernel_class, r.message))
    assert not failures, failures
