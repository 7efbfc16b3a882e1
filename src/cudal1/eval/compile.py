"""Compile service: build KernelBench `load_inline` candidates in parallel, cached by content hash.

A KernelBench candidate compiles its CUDA when it is imported or instantiated, through
`torch.utils.cpp_extension.load_inline` (or `load`). A cache-miss build costs about a minute, almost all
of it in parsing the torch headers, so this module builds candidates ahead of evaluation, many at once,
each in an isolated child (`cudal1.eval.isolated.run_isolated` -> `build_child.prepare_candidate`),
and records successful builds so that nothing is built twice:

- `build_key(source, arch=..., extra=...)`: sha256 over the source and everything that changes the
  binary (torch and CUDA versions, nvcc version, arch list, the build levers, BUILD_PROTOCOL_VERSION).
- `build_environment(key, arch)`: the environment of the build child. **The evaluator must give the same
  environment to the runner that imports the candidate for evaluation** and call
  `build_hooks.install_build_hooks()` there before the import (it reads the levers from that
  environment and replays the build decisions), so that torch finds the finished build in
  `TORCH_EXTENSIONS_DIR/<name>` and ninja sees nothing to do (0.0 s); any difference in flags, arch list
  or extension directory makes torch rebuild from scratch.
- `CompileService` / `build_candidates`: a thread pool supervising isolated children; a key whose
  marker file (`<cache>/torch_extensions/<key>/.cudal1_ok`) exists is returned as `cached=True`
  without starting a child.
- `trim_compiler_log(text)`: the few compiler lines that explain a failure, for LLM feedback.

- Lazy builds: the build child imports the candidate and, when init inputs are given, runs
  `ModelNew(*init_inputs)`. A candidate that builds inside `forward` would build in the candidate's runner,
  on the GPU's clock; with `CompileConfig.warm_lazy_builds` (and the task's reference source), a candidate
  with more `load_inline`/`load` call sites than recorded builds gets a second child
  (`build_hooks.warm_lazy_builds`) that runs one forward on the reference's inputs in the same extension
  directory. Its outcome never changes the verdict: a failed lazy build is left to the evaluation, which
  replays it at once (`BuildLevers.remember_failures`).

Limits: the call-site count is a static approximation (a call in a loop, or a `load` that is not torch's,
miscounts). The cache is never evicted here. Library code: logs, never prints.
"""

from __future__ import annotations

import ast
import contextlib
import dataclasses
import functools
import hashlib
import json
import logging
import os
import re
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cudal1.core.errors import ConfigError
from cudal1.core.files import write_atomically
from cudal1.core.syntax import parse as parse_python
from cudal1.eval.inside.build_hooks import LEVERS_ENV, RESOURCE_FAILURE, BuildLevers
from cudal1.eval.isolated import Limits, run_isolated
from cudal1.eval.runner_process import SCRATCH_INSIDE
from cudal1.eval.sandbox import detect_sandbox
from cudal1.eval.shared.compile_log import trim_compiler_log
from cudal1.eval.supply import usable_cpu_count
from cudal1.tasks.static_inputs import static_init_inputs

logger = logging.getLogger(__name__)

# Bump when anything in the build child changes what lands in the extension directory
# (levers, rewrite rules, flags), so that old cache entries are not reused.
BUILD_PROTOCOL_VERSION = "1"
MARKER_NAME = ".cudal1_ok"
BUILD_ENTRY = "cudal1.eval.inside.build_child:prepare_candidate"
WARM_ENTRY = "cudal1.eval.inside.build_child:warm_lazy_builds"
# Rationale: ninja runs main.cpp and cuda.cu in parallel; more jobs than that do not help one build
# (measured on the H200 host: MAX_JOBS=2 no change), and the pool already fills the cores.
DEFAULT_MAX_JOBS = 2


# --------------------------------------------------------------------------- configuration


@dataclass(frozen=True)
class CompileConfig:
    """Configuration of the compile service."""

    arch: str | None = field(default=None, metadata={
        "help": "TORCH_CUDA_ARCH_LIST, e.g. '9.0'; None: the local GPU's capability (required without GPU)."})
    # A parallelism count is `threads` across cudal1: each one sizes a pool of this process's threads (here
    # each drives one build child); `jobs` already names ninja's MAX_JOBS inside one build (`max_jobs`), and
    # "worker" names an evaluator pool's processes only.
    threads: int | None = field(default=None, metadata={
        "help": "Builds in parallel, one thread each; None: every core this process may use."})
    timeout_s: float = field(default=900.0, metadata={"help": "Wall-clock limit of one candidate's build."})
    memory_bytes: int | None = field(default=24 * 2**30, metadata={
        "help": "Host memory limit of one build child (cicc alone takes about 3 GB on the torch headers)."})
    max_jobs: int = field(default=DEFAULT_MAX_JOBS, metadata={"help": "MAX_JOBS for ninja inside one build."})
    device: str = field(default="cuda:0", metadata={
        "help": "Device on which ModelNew(*init_inputs) is instantiated (lazy builds); 'cpu' for no GPU."})
    cache_dir: str | None = field(default=None, metadata={
        "help": "Cache root; None: $CUDAL1_CACHE_DIR or ~/.cache/cudal1."})
    levers: BuildLevers = field(default_factory=BuildLevers, metadata={"help": "Build-time levers."})
    cpus: tuple[int, ...] | None = field(default=None, metadata={
        "help": "CPU cores the build children and their compilers may use; None: every core."})
    nice: int = field(default=10, metadata={
        "help": "Niceness of build children and their compilers (0-19): an evaluation timed on the same host "
                "(another pool slot, a batch's next candidate) keeps its CPU while builds run."})
    warm_sizes: str = field(default="full", metadata={
        "help": "Problem sizes of the warm-up forward ('full' or 'small'): those the evaluation will use, so that "
                "a build specialised to the input shapes is the one it needs."})
    warm_lazy_builds: bool = field(default=False, metadata={
        "help": "After a successful build, run one forward of the candidate on the reference's inputs in a "
                "second child, on `device`, when it has more load_inline/load call sites than recorded builds: "
                "builds made lazily in forward then happen before the evaluation, not on its clock. It uses "
                "the device: for build passes while no evaluation is timed there. Never fails a build."})

    def __post_init__(self) -> None:
        if not 0 <= self.nice <= 19:
            raise ConfigError("nice must be between 0 and 19")
        if self.threads is not None and self.threads < 1:
            raise ConfigError("threads must be >= 1 (or None for every usable core)")
        if self.timeout_s <= 0:
            raise ConfigError("timeout_s must be positive")
        if self.max_jobs < 1:
            raise ConfigError("max_jobs must be >= 1")
        if self.warm_sizes not in ("full", "small"):
            raise ConfigError("warm_sizes must be 'full' or 'small'")
        if not (self.device == "cpu" or re.fullmatch(r"cuda(:\d+)?", self.device)):
            raise ConfigError(f"device must be 'cpu', 'cuda' or 'cuda:N', got {self.device!r}")


# --------------------------------------------------------------------------- keys and environment


def cache_root(cache_dir: str | os.PathLike | None = None) -> Path:
    """The cache root: `cache_dir`, else `$CUDAL1_CACHE_DIR`, else `~/.cache/cudal1`."""
    root = cache_dir or os.environ.get("CUDAL1_CACHE_DIR") or Path.home() / ".cache" / "cudal1"
    return Path(root).expanduser()


@functools.lru_cache(maxsize=1)
def nvcc_version() -> str:
    """The last line of `nvcc --version` (e.g. 'Build cuda_13.0.r13.0/compiler.36424714_0'), or 'none'."""
    cuda_home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH") or "/usr/local/cuda"
    for nvcc in ("nvcc", os.path.join(cuda_home, "bin", "nvcc")):
        try:
            out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            continue
        lines = [ln.strip() for ln in out.stdout.splitlines() if ln.strip()]
        if out.returncode == 0 and lines:
            return lines[-1]
    return "none"


def local_arch(arch: str | None = None) -> str:
    """`arch` if given, else the local GPU's compute capability as 'major.minor'.

    Raises ConfigError when there is no GPU and no explicit arch.
    """
    if arch:
        return arch
    import torch

    if torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability()
        return f"{major}.{minor}"
    raise ConfigError("no CUDA GPU here: pass the target arch explicitly (e.g. arch='9.0')")


def build_key(source: str, *, arch: str, extra: dict[str, Any]) -> str:
    """Content hash of one candidate build (hex sha256).

    Covers the candidate source, torch version, torch.version.cuda, the nvcc version string, the arch
    list, `extra` (the levers and anything else the caller injects; must be JSON-serialisable) and
    BUILD_PROTOCOL_VERSION.
    """
    import torch

    parts = {
        "protocol": BUILD_PROTOCOL_VERSION,
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "nvcc": nvcc_version(),
        "arch": arch,
        "extra": extra,
    }
    h = hashlib.sha256()
    h.update(json.dumps(parts, sort_keys=True, default=str).encode())
    h.update(b"\0")
    h.update(source.encode())
    return h.hexdigest()


def extensions_dir(key: str, cache_dir: str | os.PathLike | None = None) -> Path:
    """TORCH_EXTENSIONS_DIR of one build key."""
    return cache_root(cache_dir) / "torch_extensions" / key


def build_environment(key: str, arch: str, *, cache_dir: str | os.PathLike | None = None,
                      max_jobs: int = DEFAULT_MAX_JOBS, levers: BuildLevers | None = None,
                      sandboxed: bool = False) -> dict[str, str]:
    """Environment of the build child AND of the candidate's runner that later imports the candidate.

    Pass exactly this to both, and in the runner call `cudal1.eval.inside.build_hooks.install_build_hooks()`
    before importing the candidate (it reads the levers from `CUDAL1_BUILD_LEVERS`): torch then reuses the
    build in `TORCH_EXTENSIONS_DIR/<name>` instead of compiling again. `sandboxed`: both see the build at the
    scratch folder of their sandbox (the service copies it in and out), never the shared cache itself.
    """
    env = {
        "TORCH_EXTENSIONS_DIR": SCRATCH_INSIDE if sandboxed else str(extensions_dir(key, cache_dir)),
        "TORCH_CUDA_ARCH_LIST": arch,
        "MAX_JOBS": str(max_jobs),
        "CUDAL1_CACHE_DIR": "/tmp/cache" if sandboxed else str(cache_root(cache_dir)),
        LEVERS_ENV: json.dumps((levers or BuildLevers()).to_dict(), sort_keys=True),
    }
    # Torch finds nvcc through CUDA_HOME or PATH; a scrubbed child keeps PATH, so only pin CUDA_HOME
    # when the parent knows it (same value in build and eval keeps the ninja files identical).
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            env[var] = os.environ[var]
    return env


def clear_stale_locks(key: str, cache_dir: str | os.PathLike | None = None) -> None:
    """Remove the lock files that torch's builds hold in the extension directories of `key`. Call only after
    the child that built there was killed (a timeout, a crash): torch waits on a lock left behind forever,
    so the next build of that candidate (the evaluation's) would hang until its own limit. Nothing else
    builds in those directories meanwhile: one candidate's children run one after another."""
    for lock in extensions_dir(key, cache_dir).glob("*/lock"):
        with contextlib.suppress(OSError):
            lock.unlink()


def publish_build(staging: Path, key: str, cache_dir: str | os.PathLike | None = None) -> None:
    """Copy what a sandboxed build wrote into the cache entry of `key` (replacing it), leaving out links and
    markers: only the trusted side writes the cache, and only it marks a build as done."""
    target = extensions_dir(key, cache_dir)
    target.parent.mkdir(parents=True, exist_ok=True)
    fresh = target.with_name(f"{target.name}.new.{os.getpid()}.{threading.get_ident()}")

    def skip(folder: str, names: list[str]) -> list[str]:
        return [n for n in names if n == MARKER_NAME or os.path.islink(os.path.join(folder, n))]

    shutil.copytree(staging, fresh, symlinks=True, ignore=skip, copy_function=shutil.copy2)
    if target.exists():
        shutil.rmtree(target, ignore_errors=True)
    os.replace(fresh, target)


def marker_path(key: str, cache_dir: str | os.PathLike | None = None) -> Path:
    return extensions_dir(key, cache_dir) / MARKER_NAME


def read_marker(key: str, cache_dir: str | os.PathLike | None = None) -> dict[str, Any] | None:
    """The marker of a finished successful build, or None."""
    try:
        return json.loads(marker_path(key, cache_dir).read_text())
    except (OSError, ValueError):
        return None


def write_marker(key: str, info: dict[str, Any], cache_dir: str | os.PathLike | None = None) -> None:
    """Atomically mark `key` as built (write to a temporary name, then rename)."""
    write_atomically(marker_path(key, cache_dir), json.dumps(info, sort_keys=True))


# --------------------------------------------------------------------------- the service


@dataclass(frozen=True)
class ExtensionBuild:
    """One `load_inline`/`load` call seen while preparing a candidate."""

    name: str
    seconds: float
    ok: bool
    lazy: bool = False  # built by the warm-up child (`CompileConfig.warm_lazy_builds`), not by the build child

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any], *, lazy: bool | None = None) -> ExtensionBuild:
        """A record of a build child, a warm-up child (`lazy=True`) or a marker (its own `lazy` key)."""
        return cls(str(d.get("name")), float(d.get("seconds", 0.0)), bool(d.get("ok")),
                   bool(d.get("lazy", False)) if lazy is None else lazy)


@dataclass(frozen=True)
class BuildResult:
    """Outcome of building one candidate."""

    key: str
    ok: bool
    cached: bool  # True when no child was started (the marker existed, or this process saw it fail)
    seconds: float  # wall time of the build child, and of the warm-up child if one ran (0.0 when cached)
    log: str  # trimmed compiler log or one-line import error; "" when ok
    builds: tuple[ExtensionBuild, ...] = ()
    #: Not ok, yet the import (and construction) succeeded: the candidate's own code caught a failed build
    #: (a compiler's verdict, not a lack of resources) and falls back to code that runs without it.
    fallback: bool = False
    #: The build child ran past the build's time limit (a timeout, not a compiler's verdict).
    timed_out: bool = False

    def to_dict(self) -> dict[str, Any]:
        return {"key": self.key, "ok": self.ok, "cached": self.cached, "seconds": self.seconds,
                "log": self.log, "builds": [b.to_dict() for b in self.builds], "fallback": self.fallback}


ProgressCallback = Callable[[int, int, BuildResult], None]  # (done, total, result of the one just done)

#: Compile errors of this process, by key, newest last. A batch builds its candidates ahead of evaluation
#: and the evaluation asks for the same build again: without this, every failing candidate was compiled
#: twice (4-19 s each for the CUDA-L1 release's failures on the H200 host), the second time on the GPU's
#: critical path. Only what the source decides is kept (`_is_compile_error`): a failed compiler run or a
#: syntax error. A build that was killed, timed out, ran out of memory or disk, or failed while
#: instantiating `ModelNew` on a GPU may pass on a quieter machine and is tried again.
_COMPILE_ERRORS: dict[str, BuildResult] = {}
_COMPILE_ERRORS_MAX = 1024
_compile_errors_lock = threading.Lock()
def _is_compile_error(value: dict[str, Any], log: str) -> bool:
    """Whether a failed build child's report is a verdict on the source itself (see `_COMPILE_ERRORS`)."""
    compiler_failed = any(not b.get("ok") for b in value.get("builds", []))
    syntax_error = not value.get("import_ok", True) and log.startswith(("SyntaxError", "IndentationError",
                                                                          "TabError"))
    return (compiler_failed or syntax_error) and not RESOURCE_FAILURE.search(log)


def _remember_compile_error(result: BuildResult) -> None:
    with _compile_errors_lock:
        _COMPILE_ERRORS.pop(result.key, None)
        _COMPILE_ERRORS[result.key] = result
        while len(_COMPILE_ERRORS) > _COMPILE_ERRORS_MAX:
            _COMPILE_ERRORS.pop(next(iter(_COMPILE_ERRORS)))


def forget_compile_errors() -> None:
    """Forget the compile errors this process has seen (a benchmark that times cold builds twice)."""
    with _compile_errors_lock:
        _COMPILE_ERRORS.clear()


def _known_compile_error(key: str) -> BuildResult | None:
    with _compile_errors_lock:
        failed = _COMPILE_ERRORS.get(key)
    return dataclasses.replace(failed, cached=True, seconds=0.0) if failed is not None else None


_BUILD_CALLS = ("load_inline", "load")
WARM_UPS_AT_ONCE = 4


def build_call_sites(source: str) -> int:
    """How many calls in `source` go to a function named `load_inline` or `load` (`load_inline(...)`,
    `cpp_extension.load(...)`): more than the build child recorded means the candidate may still build
    something when it runs. Counts `json.load(...)` too; 0 for a source that does not parse."""
    try:
        tree = parse_python(source)
    except (SyntaxError, ValueError):
        return 0
    return sum(isinstance(node, ast.Call) and (
        (isinstance(node.func, ast.Name) and node.func.id in _BUILD_CALLS)
        or (isinstance(node.func, ast.Attribute) and node.func.attr in _BUILD_CALLS))
        for node in ast.walk(tree))


def lazy_records(builds: Sequence[dict[str, Any]], instantiated: bool) -> list[dict[str, Any]]:
    """The warm-up child's build records the build child did not make: those made in `forward`, and those
    made in `ModelNew(...)` when the build child did not instantiate it (the import's builds are reloads)."""
    phases = ("forward",) if instantiated else ("init", "forward")
    return [b for b in builds if b.get("phase") in phases]


def _device_env_and_name(device: str) -> tuple[dict[str, str], str]:
    """Make only the named GPU visible to the child; the child then uses 'cuda:0'."""
    if device == "cpu":
        return {"CUDA_VISIBLE_DEVICES": ""}, "cpu"
    index = int(device.split(":")[1]) if ":" in device else 0
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = [v.strip() for v in visible.split(",")] if visible else [str(i) for i in range(index + 1)]
    if index >= len(ids):
        raise ConfigError(f"device {device} is not visible (CUDA_VISIBLE_DEVICES={visible!r})")
    return {"CUDA_VISIBLE_DEVICES": ids[index]}, "cuda:0"


class CompileService:
    """Builds candidates in parallel isolated children, skipping keys already built."""

    def __init__(self, config: CompileConfig | None = None):
        self.config = config or CompileConfig()
        self.arch = local_arch(self.config.arch)
        # Warm-up forwards share the GPU: a few at a time (each holds a CUDA context and full-size inputs).
        self._warm_slots = threading.Semaphore(WARM_UPS_AT_ONCE)

    def key_for(self, source: str, init_inputs: list[Any] | None = None) -> str:
        extra = {"levers": self.config.levers.to_dict(), "init_inputs": init_inputs,
                 "instantiate_on": "cpu" if self.config.device == "cpu" else "cuda"}
        return build_key(source, arch=self.arch, extra=extra)

    @property
    def sandboxed(self) -> bool:
        return detect_sandbox().level != "none"

    def environment(self, key: str) -> dict[str, str]:
        """The environment to give the candidate's runner that imports the candidate of `key`."""
        return build_environment(key, self.arch, cache_dir=self.config.cache_dir, max_jobs=self.config.max_jobs,
                                 levers=self.config.levers, sandboxed=self.sandboxed)

    def build_directory(self, key: str) -> Path:
        """Where the build of `key` lives in the cache (copied into a sandboxed runner before it imports)."""
        return extensions_dir(key, self.config.cache_dir)

    def _run(self, entry: str, payload: dict[str, Any], key: str, limits: Limits, env: dict[str, str]) -> Any:
        """One build child; sandboxed, it works on a copy of the cache entry that is published back after."""
        if not self.sandboxed:
            return run_isolated(entry, payload, limits=limits, env=env, device=self.config.device)
        staging = Path(tempfile.mkdtemp(prefix="cudal1-build-"))
        try:
            existing = extensions_dir(key, self.config.cache_dir)
            outcome = run_isolated(entry, payload, limits=limits, env=env, device=self.config.device,
                                   scratch_from=existing if existing.is_dir() else None, scratch_out=staging)
            publish_build(staging, key, self.config.cache_dir)
            return outcome
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    def build(self, sources: Sequence[str], *, init_inputs: Sequence[list[Any] | None] | None = None,
              ref_sources: Sequence[str | None] | None = None,
              progress: ProgressCallback | None = None,
              should_cancel: Callable[[], bool] | None = None) -> list[BuildResult]:
        """Build every source (same order in the result); identical keys are built once. `ref_sources` (the
        tasks' reference modules, one or None per source) enable `warm_lazy_builds`. Once `should_cancel`
        says so, builds not started yet are skipped (not ok, log 'build cancelled'); running ones finish."""
        inits = list(init_inputs) if init_inputs is not None else [None] * len(sources)
        refs = list(ref_sources) if ref_sources is not None else [None] * len(sources)
        if len(inits) != len(sources) or len(refs) != len(sources):
            raise ConfigError("init_inputs and ref_sources must have one entry (or None) per source")
        keys = [self.key_for(s, i) for s, i in zip(sources, inits, strict=True)]
        results: dict[str, BuildResult] = {}
        todo: dict[str, tuple[str, list[Any] | None, str | None]] = {}
        for key, src, init, ref in zip(keys, sources, inits, refs, strict=True):
            cached = self._cached_result(key) or _known_compile_error(key)
            if cached is not None:
                results[key] = cached
            elif key not in todo:
                todo[key] = (src, init, ref)
        total, done = len(set(keys)), 0
        for result in results.values():
            done += 1
            if progress:
                progress(done, total, result)
        threads = self.config.threads or usable_cpu_count()
        if todo:
            with ThreadPoolExecutor(max_workers=min(threads, len(todo)), thread_name_prefix="build") as pool:
                futures = {pool.submit(self._build_unless_cancelled, k, s, i, r, should_cancel): k
                           for k, (s, i, r) in todo.items()}
                for fut in as_completed(futures):
                    result = fut.result()
                    results[result.key] = result
                    done += 1
                    if progress:
                        progress(done, total, result)
        return [results[k] for k in keys]

    def cached_result(self, key: str) -> BuildResult | None:
        """The successful build of `key` already in the cache, else None (nothing is built)."""
        return self._cached_result(key)

    def _cached_result(self, key: str) -> BuildResult | None:
        info = read_marker(key, self.config.cache_dir)
        if info is None:
            return None
        builds = tuple(ExtensionBuild.from_dict(b) for b in info.get("builds", []))
        return BuildResult(key=key, ok=True, cached=True, seconds=0.0, log="", builds=builds)

    def _build_unless_cancelled(self, key: str, source: str, init_inputs: list[Any] | None,
                                ref_source: str | None, should_cancel: Callable[[], bool] | None) -> BuildResult:
        if should_cancel is not None and should_cancel():
            return BuildResult(key=key, ok=False, cached=False, seconds=0.0, log="build cancelled")
        return self._build_one(key, source, init_inputs, ref_source, should_cancel)

    def _build_one(self, key: str, source: str, init_inputs: list[Any] | None,
                   ref_source: str | None = None, should_cancel: Callable[[], bool] | None = None) -> BuildResult:
        cfg = self.config
        device_env, child_device = _device_env_and_name(cfg.device)
        env = {**self.environment(key), **device_env}
        extensions_dir(key, cfg.cache_dir).mkdir(parents=True, exist_ok=True)
        common = {"source": source, "device": child_device, "levers": cfg.levers.to_dict(), "nice": cfg.nice,
                  "cpus": list(cfg.cpus) if cfg.cpus else None}
        limits = Limits(timeout_s=cfg.timeout_s, memory_bytes=cfg.memory_bytes)
        outcome = self._run(BUILD_ENTRY, {**common, "init_inputs": init_inputs}, key, limits, env)
        value = outcome.value
        if value is None:
            clear_stale_locks(key, cfg.cache_dir)
            detail = trim_compiler_log(outcome.stderr_tail, max_lines=6) if outcome.stderr_tail.strip() else ""
            log = "\n".join(x for x in (f"build {outcome.describe_failure()}", detail) if x)
            logger.info("build %s: no result (%s)", key[:12], outcome.describe_failure())
            return BuildResult(key=key, ok=False, cached=False, seconds=outcome.duration_s, log=log,
                               timed_out=outcome.timed_out)
        builds = tuple(ExtensionBuild.from_dict(b, lazy=False) for b in value.get("builds", []))
        ok, seconds = bool(value.get("ok")), outcome.duration_s
        if (ok and cfg.warm_lazy_builds and ref_source is not None and build_call_sites(source) > len(builds)
                and not (should_cancel is not None and should_cancel())):
            lazy, warm_s = self._warm_lazy_builds(key, {**common, "ref_source": ref_source, "sizes": cfg.warm_sizes},
                                                  init_inputs is not None, limits, env)
            builds, seconds = builds + lazy, seconds + warm_s
        log = str(value.get("log", ""))
        fallback = (not ok and bool(value.get("import_ok")) and any(not b.ok for b in builds)
                    and not RESOURCE_FAILURE.search(log))
        result = BuildResult(key=key, ok=ok, cached=False, seconds=seconds, log=log, builds=builds,
                             fallback=fallback)
        if result.ok:
            write_marker(key, {"builds": [b.to_dict() for b in builds], "seconds": seconds,
                               "protocol": BUILD_PROTOCOL_VERSION}, cfg.cache_dir)
        elif _is_compile_error(value, result.log):
            _remember_compile_error(result)
        logger.info("build %s: ok=%s in %.1f s (%d extensions)", key[:12], result.ok, result.seconds,
                    len(builds))
        return result

    def _warm_lazy_builds(self, key: str, payload: dict[str, Any], instantiated: bool, limits: Limits,
                          env: dict[str, str]) -> tuple[tuple[ExtensionBuild, ...], float]:
        """(the lazy builds, the child's wall time) of one forward in a warm-up child. Whatever happens there
        (a crash, a timeout, a failed build or forward) is only logged: the evaluation decides about it."""
        try:
            with self._warm_slots:
                outcome = self._run(WARM_ENTRY, payload, key, limits, env)
            if outcome.value is None:
                clear_stale_locks(key, self.config.cache_dir)
                logger.info("build %s: warm-up forward gave no result (%s); lazy builds happen in the evaluation",
                            key[:12], outcome.describe_failure())
                return (), outcome.duration_s
            lazy = tuple(ExtensionBuild.from_dict(b, lazy=True)
                         for b in lazy_records(outcome.value.get("builds", []), instantiated))
            forward = "ok" if outcome.value.get("forward_ok") else f"failed ({outcome.value.get('forward_error')})"
        except Exception:  # noqa: BLE001 - a warm-up that goes wrong must not fail a build that succeeded
            logger.warning("build %s: warm-up forward failed; lazy builds happen in the evaluation", key[:12],
                           exc_info=True)
            return (), 0.0
        logger.info("build %s: warm-up forward %s in %.1f s, %d lazy builds (%d failed)", key[:12], forward,
                    outcome.duration_s, len(lazy), sum(not b.ok for b in lazy))
        return lazy, outcome.duration_s


def build_candidates(sources: Sequence[str], *, arch: str | None, threads: int | None = None,
                     timeout_s: float = 900.0, init_inputs: Sequence[list[Any] | None] | None = None,
                     device: str = "cuda:0", cache_dir: str | None = None,
                     levers: BuildLevers | None = None,
                     progress: ProgressCallback | None = None) -> list[BuildResult]:
    """Build `sources` in parallel (see `CompileService.build`); one `BuildResult` per source, in order."""
    config = CompileConfig(arch=arch, threads=threads, timeout_s=timeout_s, device=device,
                           cache_dir=cache_dir, levers=levers or BuildLevers())
    return CompileService(config).build(sources, init_inputs=init_inputs, progress=progress)


def json_init_inputs(task: Any) -> list[Any] | None:
    """The reference's init inputs when its syntax tree shows them as plain values (so lazy builds in
    `ModelNew.__init__` can happen in the compile pool); None otherwise. Runs no code at all: the reference
    may come from a client (`cudal1.tasks.static_inputs`)."""

    return static_init_inputs(task.source)
