"""Task loaders: where tasks (and published candidates) come from.

A source is named by one string, the same on the CLI (`--source`) and in Python:
- `builtin`                       the suite shipped with cudal1 (ids `builtin/levelN/NAME`);
- `DIR`                           a KernelBench checkout (`DIR/KernelBench/levelN/ID_Name.py` or
                                  `DIR/levelN/ID_Name.py`; ids `kernelbench/levelN/ID_Name`), or any
                                  folder of task files;
- `hf:NAME_OR_FILE[:SPLIT]`       the Hugging Face dataset `ScalingIntelligence/KernelBench` (columns
                                  `code`, `level`, `name`, `problem_id`) or a local parquet/JSON file
                                  with the same columns, through `datasets`;
- `jsonl:PATH`                    a release in CUDA-L1's schema (`level_id`, `task_id`, `ref_code`,
                                  `custom_code`, `cuda_graph_code`, `cudnn_code`, `score_*`); yields
                                  tasks and their candidates with the published scores;
- `FILE.py`                       one user file defining `Model`, `get_inputs`, `get_init_inputs`.

Loaders only read and parse; they never execute candidate code, and execute reference code only when a
caller asks (`Task.load`, `inspect_task`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from cudal1.core.errors import MissingDependencyError, SourceError, TaskError
from cudal1.core.hub import offline_if_unreachable
from cudal1.core.schemas import schema_problems
from cudal1.tasks.builtin import BUILTIN_DIR
from cudal1.tasks.task import Candidate, Task, check_syntax, size_problem, source_problem

HF_DEFAULT_DATASET = "ScalingIntelligence/KernelBench"
LEVEL_DIR = re.compile(r"^level_?(\d+)$")
SCORE_PREFIX = "score_"
NULL_CODE = (None, "", "None", "null")


def _natural_key(path: Path) -> tuple:
    head = re.match(r"^(\d+)", path.stem)
    return (int(head.group(1)) if head else 10**9, path.stem)


def load_builtin() -> list[Task]:
    """The built-in suite: `BUILTIN_DIR/levelN/NAME.py` -> `builtin/levelN/NAME`."""
    return _load_level_dirs(BUILTIN_DIR, prefix="builtin")


def builtin_examples(task: Task, form: str = "all") -> dict[str, Path]:
    """Example candidates shipped for a built-in task: {label: path}.

    Labels: `cuda` (KernelBench `load_inline` form), `torch` (PyTorch-level rewrite), `raw` (cudal1's
    raw-CUDA form). `form` filters by label ("all" keeps every one).
    """
    found = {}
    patterns = {"cuda": f"examples/{task.name}.py", "torch": f"examples/{task.name}__torch.py",
                "raw": f"examples_raw/{task.name}.py"}
    for label, rel in patterns.items():
        path = BUILTIN_DIR / rel
        if path.is_file() and form in ("all", label):
            found[label] = path
    return found


def _load_level_dirs(root: Path, prefix: str) -> list[Task]:
    tasks: list[Task] = []
    for level_dir in sorted(p for p in root.iterdir() if p.is_dir() and LEVEL_DIR.match(p.name)):
        level = int(LEVEL_DIR.match(level_dir.name).group(1))
        for path in sorted(level_dir.glob("*.py"), key=_natural_key):
            if path.name.startswith("_"):
                continue
            tasks.append(Task(id=f"{prefix}/level{level}/{path.stem}", source=_task_text(path),
                              level=level, origin=str(path)))
    return tasks


def _task_text(path: Path) -> str:
    """A task file's text; `SourceError` naming it when it is over the size limit of a source."""
    problem = size_problem(path.stat().st_size)
    if problem:
        raise SourceError(f"task file {path} cannot be evaluated: it is {problem}")
    return path.read_text()


def load_directory(path: Path) -> list[Task]:
    """A KernelBench checkout (level folders, possibly under `KernelBench/`) or a flat folder of tasks."""
    root = path / "KernelBench" if (path / "KernelBench").is_dir() else path
    if any(LEVEL_DIR.match(p.name) for p in root.iterdir() if p.is_dir()):
        return _load_level_dirs(root, prefix="kernelbench")
    files = sorted((p for p in root.glob("*.py") if not p.name.startswith("_")), key=_natural_key)
    if not files:
        raise SourceError(f"{path}: no task files (expected levelN/ folders or *.py files)")
    return [Task(id=f"{root.name}/{p.stem}", source=_task_text(p), origin=str(p)) for p in files]


def load_file(path: Path | str) -> Task:
    """One user file; raises `TaskError` naming what is missing."""
    path = Path(path)
    task_id = f"file/{path.stem}"
    try:
        source = path.read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise TaskError(task_id, f"cannot read {path}: {exc}") from None
    check_syntax(source, task_id)
    return Task(id=task_id, source=source, origin=str(path.resolve()))


def load_hf(name: str = HF_DEFAULT_DATASET, split: str | None = None) -> list[Task]:
    """KernelBench from the Hugging Face Hub, or a local data file with its columns."""
    try:
        import datasets
    except ImportError:
        raise MissingDependencyError("datasets", "train", "Hugging Face datasets") from None
    local = Path(name)
    with offline_if_unreachable(name) as offline:  # offline, an uncached dataset fails in seconds
        try:
            if local.is_file():
                kind = {".parquet": "parquet", ".json": "json", ".jsonl": "json",
                        ".csv": "csv"}.get(local.suffix)
                if kind is None:
                    raise SourceError(f"{name}: unsupported data file (use .parquet, .json, .jsonl or .csv)")
                data = datasets.load_dataset(kind, data_files=str(local))
            else:
                data = datasets.load_dataset(name)
        except SourceError:
            raise
        except Exception as exc:  # noqa: BLE001 - datasets raises many types for "offline"/"not found"
            why = f"not in the Hugging Face cache, and {offline}" if offline else \
                f"{type(exc).__name__}: {' '.join(str(exc).split())[:200]}"
            raise SourceError(f"cannot load dataset {name!r} ({why}); without network, pass a local file: "
                              "hf:PATH.parquet") from None
    splits = [split] if split else sorted(data.keys())
    tasks: list[Task] = []
    for s in splits:
        if s not in data:
            raise SourceError(f"dataset {name!r} has no split {s!r} (splits: {', '.join(sorted(data))})")
        for row in data[s]:
            missing = [c for c in ("code", "level", "name") if c not in row]
            if missing:
                raise SourceError(f"dataset {name!r} lacks columns {', '.join(missing)}")
            stem = str(row["name"]).removesuffix(".py")
            tasks.append(Task(id=f"kernelbench/level{int(row['level'])}/{stem}", source=row["code"],
                              level=int(row["level"]), origin=f"hf:{name}:{s}"))
    return tasks


#: The fields of a release row that hold a module's source (each within `MAX_SOURCE_BYTES`).
SOURCE_FIELDS = ("ref_code", "custom_code", "cuda_graph_code", "cudnn_code")


def _not_a_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a number JSON allows")


def release_row(row: Any, where: str) -> tuple[int, Any, dict[str, float | None]]:
    """(level, task id, published scores) of one parsed release row, checked against its schema
    (`cudal1/schemas/release_row.schema.json`) and the size limit of a source; `SourceError` naming the row,
    the field and what was expected."""
    problems = schema_problems("release_row", row)
    if problems:
        raise SourceError(f"{where}: not a release row: {'; '.join(problems)}")
    for name in SOURCE_FIELDS:
        text = row.get(name)
        # The reference must be a source file (it is stored and run); a published candidate that holds a NUL or
        # an unencodable character is kept, and its evaluation says so (`unparseable`); none may exceed the size
        # limit, which no runner could take.
        problem = (source_problem(text) if name == "ref_code" else size_problem(text)) if isinstance(text, str) else None
        if problem:
            raise SourceError(f"{where}: {name} cannot be evaluated: "
                              f"{problem if name == 'ref_code' else 'it is ' + problem}")
    scores = {}
    for key, value in row.items():
        if key.startswith(SCORE_PREFIX):
            scores[key] = None if value in NULL_CODE else float(value)
    return row["level_id"], row["task_id"], scores


def load_release(path: str | Path) -> list[tuple[Task, Candidate | None]]:
    """A JSONL release in CUDA-L1's schema: each line gives a task and (maybe) its published candidate. Every row
    is checked (`release_row`) and no two may name the same task; `SourceError` names the first that fails."""
    path = Path(path)
    label = path.stem
    pairs: list[tuple[Task, Candidate | None]] = []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise SourceError(f"cannot read {path}: {exc}") from None
    seen: dict[str, int] = {}
    for lineno, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        try:
            row = json.loads(line, parse_constant=_not_a_constant)
        except ValueError as exc:
            raise SourceError(f"{where}: not a release row (not JSON: {exc})") from None
        except RecursionError:
            raise SourceError(f"{where}: not a release row (not JSON: it nests too deeply)") from None
        level, number, scores = release_row(row, where)
        task_id = f"{label}/level{level}/{number}"
        if task_id in seen:
            raise SourceError(f"{where}: level_id {level}, task_id {json.dumps(number)} repeats line {seen[task_id]}: "
                              "one row per task")
        seen[task_id] = lineno
        meta = {k: row[k] for k in ("cuda_graph_code", "cudnn_code") if row.get(k) not in NULL_CODE}
        task = Task(id=task_id, source=row["ref_code"], level=level, origin=where, meta=meta)
        code = row.get("custom_code")
        candidate = None if code in NULL_CODE else Candidate(
            task_id=task_id, source=code, origin=where, label=label, published=scores)
        pairs.append((task, candidate))
    return pairs


def load_tasks(spec: str) -> list[Task]:
    """Resolve a source string (see the module docstring) to its tasks."""
    if spec == "builtin":
        return load_builtin()
    if spec.startswith("hf:"):
        rest = spec[3:] or HF_DEFAULT_DATASET
        name, _, split = rest.partition(":") if not Path(rest).exists() else (rest, "", "")
        return load_hf(name, split or None)
    if spec.startswith("jsonl:"):
        return [task for task, _ in load_release(Path(spec[6:]))]
    path = Path(spec)
    if path.is_dir():
        return load_directory(path)
    if path.is_file() and path.suffix == ".jsonl":
        return [task for task, _ in load_release(path)]
    if path.is_file():
        return [load_file(path)]
    raise SourceError(f"unknown task source {spec!r}: use builtin, a folder, hf:NAME, jsonl:PATH or FILE.py")


def load_candidates(spec: str) -> list[tuple[Task, Candidate | None]]:
    """Tasks with published candidates, from a JSONL release (`jsonl:PATH` or `PATH.jsonl`)."""
    path = Path(spec.removeprefix("jsonl:"))
    if not path.is_file():
        raise SourceError(f"no such release file: {path}")
    return load_release(path)


def find_task(task_id: str, sources: Iterable[str] = ("builtin",)) -> Task:
    """The task with this id from the first source that has it (`SourceError` if none)."""
    for spec in sources:
        for task in load_tasks(spec):
            if task.id == task_id or (spec == "builtin" and task.name == task_id):
                return task
    raise SourceError(f"no task {task_id!r} in {', '.join(sources)} (see `cudal1 tasks list`)")


#: The forms a built-in example candidate comes in: `load_inline` CUDA, PyTorch-level, raw CUDA.
EXAMPLE_FORMS = ("cuda", "torch", "raw")


def example_candidates(device_type: str, forms: Iterable[str] | None = None) -> list[tuple[Task, str, str]]:
    """(task, form label, candidate source) for every built-in example runnable on `device_type`.

    On `cpu` only the PyTorch-level rewrites can run; on `cuda` every form does.
    """
    unknown = sorted(set(forms or ()) - set(EXAMPLE_FORMS))
    if unknown:
        raise SourceError(f"unknown example form(s) {', '.join(unknown)}: choose from {', '.join(EXAMPLE_FORMS)}")
    wanted = set(forms) if forms else ({"torch"} if device_type == "cpu" else {"cuda", "torch", "raw"})
    if not forms and "raw" in wanted and not raw_form_available():
        wanted.discard("raw")  # the raw form needs cuda-python (pip install 'cudal1[cuda]')
    out = []
    for task in load_builtin():
        for label, path in builtin_examples(task).items():
            if label in wanted:
                out.append((task, label, path.read_text()))
    return out


def raw_form_available() -> bool:
    """Whether this environment can launch raw-CUDA-form candidates (cuda-python and NVRTC or nvcc)."""
    try:
        import cuda.bindings.driver  # noqa: F401

        from cudal1.raw_cuda.compiler import nvcc_path, nvrtc_version
    except ImportError:
        return False
    return nvrtc_version() is not None or nvcc_path() is not None
