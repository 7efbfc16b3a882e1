"""The package's floors: every import, lazy ones included, runs down (or sideways within a package), and no
modules import each other in a circle. Read from the source, so an import hidden in a function counts too.

Floors, lowest first (a package may import only packages on lower floors):

    core                                              the verdict's vocabulary, errors, the machine, the forms
    raw_cuda store metrics analysis                   leaf services over core
    exemplars                                         scored codes, kept in the results store's file
    tasks report policy                               the task model, rendering, verdict policies
    kernel_form                                       the kernel-only form (its runtime loads the task's reference)
    eval llm                                          the evaluator (it builds kernel-form candidates), LLM access
    baselines judge service                           built on the evaluator
    audit loops integrations                          whole jobs
    train                                             the three training stages
    cli                                               the command line
    (top-level modules: __main__, config_docs)

Beside the library, above all of it: `experimental/` at the repository's root (research code such as the
contrastive study, not in the wheel). It may import any of cudal1; nothing of cudal1 imports it.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SRC = ROOT / "src"
FLOORS = [["core"], ["raw_cuda", "store", "metrics", "analysis"], ["exemplars"], ["tasks", "report", "policy"],
           ["kernel_form"], ["eval", "llm"], ["baselines", "judge", "service"], ["audit", "loops", "integrations"],
           ["train"], ["cli"]]
FLOOR = {package: i for i, names in enumerate(FLOORS) for package in names}
TOP = len(FLOORS)  # modules directly under cudal1/
EXPERIMENTAL = TOP + 1  # experimental/ at the repository's root


def _modules() -> dict[str, Path]:
    """cudal1's modules and those of `experimental/` (beside the library, not shipped)."""
    out = {}
    for root, package in ((SRC, "cudal1"), (ROOT, "experimental")):
        for path in (root / package).rglob("*.py"):
            parts = path.relative_to(root).with_suffix("").parts
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _imports(modules: dict[str, Path]) -> dict[str, set[str]]:
    """module -> the cudal1 modules it imports anywhere in its text (relative imports resolved)."""
    def known(name: str) -> str:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name

    graph: dict[str, set[str]] = defaultdict(set)
    for module, path in modules.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package
                    for _ in range(node.level - 1):
                        anchor = anchor.rpartition(".")[0]
                    base = f"{anchor}.{base}" if base else anchor
                names = [base] + [f"{base}.{a.name}" for a in node.names]
            for name in names:
                target = known(name) if name.startswith(("cudal1", "experimental")) else ""
                # A module's own package __init__ runs first anyway: not an edge.
                if target and target != module and not module.startswith(target + "."):
                    graph[module].add(target)
    return graph


def _floor(module: str) -> int:
    if module.split(".")[0] == "experimental":
        return EXPERIMENTAL
    parts = module.split(".")
    if len(parts) == 2 and parts[1] not in FLOOR:
        return TOP
    return FLOOR[parts[1]] if len(parts) > 1 else TOP


def test_every_package_has_a_floor():
    packages = {p.name for p in (SRC / "cudal1").iterdir() if (p / "__init__.py").exists()}
    assert packages <= set(FLOOR), sorted(packages - set(FLOOR))


def test_imports_run_down_the_floors():
    graph = _imports(_modules())
    upward = set()
    for module, targets in graph.items():
        for target in targets:
            src, dst = module.split(".")[1:2] or [""], target.split(".")[1:2] or [""]
            if src == dst:
                continue
            if _floor(target) >= _floor(module):
                upward.add((src[0], dst[0], module, target))
    assert not upward, sorted(upward)


def test_the_library_imports_nothing_experimental():
    """`experimental/` is not in the wheel: an import of it from cudal1 (top-level modules included) would
    break every installed copy."""
    graph = _imports(_modules())
    reaching = sorted((module, target) for module, targets in graph.items() if module.startswith("cudal1")
                      for target in targets if target.split(".")[0] == "experimental")
    assert not reaching, reaching


def test_the_wheel_holds_cudal1_only():
    """pyproject.toml's package discovery (`where = ["src"]`) finds cudal1 and its subpackages, and nothing of
    `experimental/`."""
    from setuptools import find_packages

    packages = find_packages(where=str(SRC))
    assert packages and all(p == "cudal1" or p.startswith("cudal1.") for p in packages), packages


def test_no_modules_import_each_other_in_a_circle():
    graph = _imports(_modules())
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for module in list(graph):
        if module not in index:
            visit(module)
    assert circles == [], circles


def test_the_evaluators_halves_import_nothing_of_the_parent():
    """Inside `eval`: what runs in the runners (`eval.inside`) imports only itself and `eval.shared`; what
    both halves use (`eval.shared`) imports only itself. The trusted parent is the rest of `eval`."""
    graph = _imports(_modules())
    crossing = []
    for module, targets in graph.items():
        for half, allowed in (("cudal1.eval.inside", ("cudal1.eval.inside", "cudal1.eval.shared")),
                              ("cudal1.eval.shared", ("cudal1.eval.shared",))):
            if not module.startswith(half + ".") and module != half:
                continue
            for target in targets:
                if target.startswith("cudal1.eval") and not target.startswith(allowed) and target != "cudal1.eval":
                    crossing.append((module, target))
    assert not crossing, sorted(crossing)


#: What the runners' modules may reach of cudal1, lazy imports included: the runner's halves, the ground
#: floor, and two leaf modules (the reference's loader, the build hooks' comment stripper). The packages
#: these sit in (`cudal1.tasks`, `cudal1.analysis`) export their names lazily, so importing the leaf loads
#: none of its siblings.
#: The one module a package face may import: its names' lazy lookup.
LAZY_FACE = "cudal1.core.lazy"
RUNNER_REACH = ("cudal1.eval.inside", "cudal1.eval.shared", "cudal1.core", "cudal1.tasks.task",
                "cudal1.analysis.cuda_source")


def test_the_runners_reach_only_their_prefixes():
    """Everything the runner's modules (`eval.inside`, `eval.shared`) import, followed transitively, with the
    `__init__` of every package on the way (it runs first), lies under `RUNNER_REACH` or is a package face
    that imports nothing of cudal1 but its lazy lookup."""
    modules = _modules()
    graph = _imports(modules)
    seen: set[str] = set()
    todo = [m for m in modules if m.startswith(("cudal1.eval.inside", "cudal1.eval.shared"))]
    while todo:
        module = todo.pop()
        if module in seen:
            continue
        seen.add(module)
        parts = module.split(".")
        todo.extend(".".join(parts[:i]) for i in range(1, len(parts)))  # the packages' __init__ run first
        todo.extend(graph.get(module, ()))
    face = {m for m in seen if modules[m].name == "__init__.py" and set(graph.get(m, ())) <= {LAZY_FACE}}
    stray = sorted(m for m in seen - face if not any(m == p or m.startswith(p + ".") for p in RUNNER_REACH))
    assert not stray, stray
