"""Static rules about the run-time environment: streams, threads, patched timers, global flags,
harness tampering, environment and I/O, inner torch.compile / CUDA graphs.

Covered: direct references through any import alias (`import torch.cuda as tc; tc.Stream()`), `setattr`
on the same objects, CUDA/C++ API names in every compiled source string.
Not covered: names built at run time (`getattr(torch, "cu" + "da")`), code reached through `exec` (the
`tampering` rule flags exec/eval themselves), native libraries loaded with ctypes (flagged by
`env_or_io`). The runtime guards are the backstop for all of these.
"""

from __future__ import annotations

import ast

from cudal1.analysis._base import calls, cuda_ident_flags, flag, is_self_attr, matches
from cudal1.analysis.context import AnalysisContext
from cudal1.analysis.cuda_source import CToken
from cudal1.core.types import Flag

# Rationale: every Python API that creates, enters or selects a CUDA stream other than the current one.
PY_STREAM_APIS = (
    "torch.cuda.Stream",
    "torch.cuda.stream",
    "torch.cuda.StreamContext",
    "torch.cuda.set_stream",
    "torch.cuda.ExternalStream",
    "torch.cuda.default_stream",
    "torch.cuda.streams",
    "torch.Stream",
    "torch.cuda.StreamContext",
    "cupy.cuda.Stream",
    "cupy.cuda.stream",
    "cupy.cuda.ExternalStream",
    "triton.runtime.driver.active.get_current_stream.__set__",
)
# Rationale: CUDA runtime/driver and ATen calls that make or select a non-current stream.
CUDA_STREAM_IDENTS = {
    "cudaStreamCreate": "creates a CUDA stream",
    "cudaStreamCreateWithFlags": "creates a CUDA stream",
    "cudaStreamCreateWithPriority": "creates a CUDA stream",
    "cuStreamCreate": "creates a CUDA stream",
    "getStreamFromPool": "takes a stream from the pool",
    "cudaStreamPerThread": "uses the per-thread stream",
    "CU_STREAM_PER_THREAD": "uses the per-thread stream",
    "setCurrentCUDAStream": "switches the current stream",
    "cudaStreamNonBlocking": "makes a non-blocking stream",
}
# Rationale: launch stream arguments that are the current (or legacy default) stream.
CURRENT_STREAM_WORDS = ("getCurrentCUDAStream", "getCurrentStream", "current_stream", "getDefaultCUDAStream")
SAFE_STREAM_ARGS = {"0", "nullptr", "NULL", "cudaStreamLegacy", "0ULL"}
# Rationale: modules whose only use in a kernel candidate is running work concurrently with the timer.
THREAD_MODULES = (
    "threading",
    "_thread",
    "multiprocessing",
    "concurrent",
    "subprocess",
    "asyncio",
    "torch.multiprocessing",
    "joblib",
)
THREAD_CALLS = (
    "os.fork",
    "os.forkpty",
    "os.system",
    "os.popen",
    "os.posix_spawn",
    "os.spawnv",
    "os.spawnl",
    "os.spawnlp",
    "os.spawnvp",
    "pty.spawn",
)
# Rationale: objects whose attributes define the measurement (timers, events, sync, comparisons).
PATCHABLE_ROOTS = ("torch", "time", "timeit", "builtins", "triton", "numpy", "cudal1", "unittest.mock")
# Rationale: torch attributes that are settings, judged by other rules (global flags, inner compile).
NOT_TIMERS = ("torch.backends", "torch._inductor.config", "torch._dynamo.config")
# Rationale: global switches that change numerics (precision, dtype, denormals) or algorithm choice. The
# candidate runs in a process of its own, so none reaches the reference; they are split by their effect on
# the candidate's own numbers (`ALGORITHM_SWITCHES`).
FLAG_SETTERS = (
    "torch.set_float32_matmul_precision",
    "torch.set_default_dtype",
    "torch.set_default_tensor_type",
    "torch.set_default_device",
    "torch.use_deterministic_algorithms",
    "torch.set_flush_denormal",
    "torch.set_num_threads",
    "torch.set_num_interop_threads",
    "torch.backends.cudnn.flags",
    "torch.backends.cuda.enable_flash_sdp",
    "torch.backends.cuda.enable_mem_efficient_sdp",
    "torch.backends.cuda.enable_math_sdp",
    "torch.backends.cuda.enable_cudnn_sdp",
    "torch.backends.cuda.preferred_linalg_library",
    "torch.backends.cuda.preferred_blas_library",
    "torch.backends.cudnn.set_flags",
    "torch._C._set_cublas_allow_tf32",
    "torch._C._set_cudnn_allow_tf32",
    "torch._C._set_cudnn_benchmark",
    "torch._C._set_float32_matmul_precision",
    "torch._C._set_cudnn_deterministic",
)
# Rationale: reaching into the harness (its modules, frames, objects) or hiding code from this analysis.
# Rationale: a candidate needs nothing from cudal1 but its raw-CUDA launcher; importing the evaluator
# (to raise its verdicts, read its state or patch it) is only useful for cheating.
HARNESS_MODULES = ("cudal1.eval", "cudal1.analysis", "cudal1.store", "cudal1.judge", "cudal1.service")
# Rationale: `type.__setattr__(torch.Tensor, ...)` patches a class while hiding the attribute name from
# the plain-assignment rules; honest kernels never need it.
RAW_SETATTR = ("type.__setattr__", "object.__setattr__", "type.__delattr__", "object.__delattr__")

TAMPER_NAMES = (
    "sys.modules",
    "sys._getframe",
    "sys.settrace",
    "sys.setprofile",
    "inspect",
    "gc.get_objects",
    "gc.get_referrers",
    "gc.get_referents",
    "exec",
    "eval",
    "compile",
    "__import__",
    "globals",
    "__builtins__",
    "builtins.exec",
    "builtins.eval",
)
TAMPER_ATTRS = {
    "f_back",
    "f_locals",
    "f_globals",
    "f_code",
    "tb_frame",
    "gi_frame",
    "__globals__",
    "__closure__",
    "__code__",
    "__subclasses__",
}
# Rationale: I/O, network and native-code modules have no place in a kernel; honest code rarely uses them.
IO_MODULES = (
    "socket",
    "requests",
    "urllib",
    "http",
    "httpx",
    "aiohttp",
    "ftplib",
    "smtplib",
    "ctypes",
    "cffi",
    "importlib",
    "pickle",
    "marshal",
    "dill",
    "shutil",
)
IO_CALLS = (
    "os.putenv",
    "os.unsetenv",
    "os.remove",
    "os.unlink",
    "os.rmdir",
    "os.rename",
    "os.environ.update",
    "os.environ.setdefault",
    "os.environ.pop",
    "os.environ.__setitem__",
    "os.environ.clear",
)
# Rationale: whole-graph compilers and graph capture are baselines of their own.
COMPILE_APIS = (
    "torch.compile",
    "torch.jit",
    "torch.cuda.graph",
    "torch.cuda.CUDAGraph",
    "torch.cuda.graphs",
    "torch.cuda.make_graphed_callables",
    "torch._dynamo",
    "torch._inductor",
    "torch.export",
)


def _refs(ctx: AnalysisContext):
    """Every Name/Attribute reference with its qualified name (outermost attribute chains only)."""
    for node in ast.walk(ctx.tree):
        if isinstance(node, ast.Attribute | ast.Name) and not isinstance(
            ctx.parents.get(node), ast.Attribute
        ):
            name = ctx.qual(node)
            if name:
                yield node, name


def _import_flags(ctx: AnalysisContext, rule: str, modules: tuple[str, ...], what: str) -> list[Flag]:
    out: list[Flag] = []
    for node in ast.walk(ctx.tree):
        mods: list[str] = []
        if isinstance(node, ast.Import):
            mods = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            mods = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        hit = next((m for m in mods if matches(m, modules)), None)
        if hit:
            out.append(flag(rule, f"imports {hit} ({what})", node.lineno))
    return out


def _stream_arg_kind(node: ast.AST, ctx: AnalysisContext) -> str:
    """'current', 'side' or 'unknown' for a Python `stream=` argument."""
    if isinstance(node, ast.Constant) and node.value in (None, 0):
        return "current"
    text = ast.unparse(node)
    if "current_stream" in text:
        return "current"
    if isinstance(node, ast.Name) and node.id in ctx.module_assigns:
        kinds = {_stream_arg_kind(v, ctx) for v in ctx.module_assigns[node.id]}
        return "current" if kinds == {"current"} else "side" if "side" in kinds else "unknown"
    if is_self_attr(node) and ctx.model_new is not None:
        values = [
            n.value
            for n in ast.walk(ctx.model_new)
            if isinstance(n, ast.Assign) and any(is_self_attr(t) and t.attr == node.attr for t in n.targets)
        ]
        kinds = {_stream_arg_kind(v, ctx) for v in values}
        return "current" if kinds == {"current"} else "side" if "side" in kinds else "unknown"
    if any(matches(ctx.qual(c.func), PY_STREAM_APIS) for c in calls(node)):
        return "side"
    return "unknown"


def _cuda_stream_vars(tokens: list[CToken]) -> tuple[set[str], set[str]]:
    """Identifiers assigned a current-stream expression, and those made side streams."""
    current, side = set(), set()
    for i, tok in enumerate(tokens):
        if tok.kind != "ident" or i + 1 >= len(tokens) or tokens[i + 1].value != "=":
            continue
        stmt = []
        for t in tokens[i + 2 : i + 40]:
            if t.value == ";":
                break
            stmt.append(t.value)
        if any(w in v for v in stmt for w in CURRENT_STREAM_WORDS):
            current.add(tok.value)
        elif any(v in CUDA_STREAM_IDENTS for v in stmt):
            side.add(tok.value)
    for i, tok in enumerate(tokens):  # cudaStreamCreate(&s) / cudaStreamCreateWithFlags(&s, ...)
        if tok.value.startswith(("cudaStreamCreate", "cuStreamCreate")) and i + 3 < len(tokens):
            if tokens[i + 2].value == "&" and tokens[i + 3].kind == "ident":
                side.add(tokens[i + 3].value)
    return current, side


def _launch_stream_flags(ctx: AnalysisContext) -> list[Flag]:
    out: list[Flag] = []
    for cs in ctx.cuda_strings:
        current, side = _cuda_stream_vars(cs.info.tokens)
        for launch in cs.info.launches:
            arg = launch.stream_arg
            if arg is None or arg in SAFE_STREAM_ARGS or any(w in arg for w in CURRENT_STREAM_WORDS):
                continue
            base = arg.split(".")[0].split("(")[0].strip()
            line = cs.py_line_of(launch.line)
            if base in current:
                continue
            if base in side or base in CUDA_STREAM_IDENTS:
                out.append(
                    flag("extra_cuda_stream", f"launches {launch.kernel} on side stream `{arg}`", line)
                )
            else:
                out.append(
                    flag(
                        "unverified_launch_stream",
                        f"launches {launch.kernel} on stream `{arg}`, not provably the current one",
                        line,
                    )
                )
    return out


# What a joinable side stream may be made and used with; anything else among PY_STREAM_APIS is not provable.
_JOINABLE_APIS = ("torch.cuda.Stream", "torch.cuda.stream")


def _stream_names(ctx: AnalysisContext) -> set[str] | None:
    """The targets (`s`, `self.side`) of every `torch.cuda.Stream()` the source makes, or None when a stream
    API is used in a way a join cannot be proven for (an unassigned stream, another stream API, CUDA streams)."""
    names: set[str] = set()
    for node, name in _refs(ctx):
        if not matches(name, PY_STREAM_APIS):
            continue
        if not matches(name, _JOINABLE_APIS):
            return None
        if name.endswith(".Stream"):
            call = ctx.parents.get(node)
            assign = ctx.parents.get(call) if isinstance(call, ast.Call) else None
            if not (isinstance(assign, ast.Assign) and len(assign.targets) == 1):
                return None
            names.add(ast.unparse(assign.targets[0]))
    return names if not any(cs.info.idents().keys() & set(CUDA_STREAM_IDENTS) for cs in ctx.cuda_strings) else None


def _is_current_stream(node: ast.AST, ctx: AnalysisContext) -> bool:
    """`torch.cuda.current_stream()`, or a plain name that is only ever bound (`x = ...`) to that call."""
    def current(value: ast.AST | None) -> bool:
        return isinstance(value, ast.Call) and matches(ctx.qual(value.func), ("torch.cuda.current_stream",))

    if current(node):
        return True
    if not isinstance(node, ast.Name):
        return False
    if any(isinstance(a, ast.arg) and a.arg == node.id for a in ast.walk(ctx.tree)):
        return False
    stores = [n for n in ast.walk(ctx.tree) if isinstance(n, ast.Name) and n.id == node.id and isinstance(n.ctx, ast.Store)]
    binds = [ctx.parents.get(n) for n in stores]
    return bool(stores) and all(isinstance(b, ast.Assign) and b.targets == [n] and current(b.value)
                                for n, b in zip(stores, binds, strict=True))


def _joins(call: ast.AST, ctx: AnalysisContext) -> tuple[str, str] | None:
    """("stream"|"event", what) for `torch.cuda.current_stream().wait_stream(X)` / `.wait_event(X)` (or the
    same on a name bound to the current stream)."""
    if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and len(call.args) == 1):
        return None
    if call.func.attr not in ("wait_stream", "wait_event") or not _is_current_stream(call.func.value, ctx):
        return None
    return ("stream" if call.func.attr == "wait_stream" else "event"), ast.unparse(call.args[0])


def _waits_for_current(node: ast.AST, ctx: AnalysisContext) -> bool:
    """`S.wait_stream(<the current stream>)`: a side stream waiting for its inputs, which moves no work out."""
    parent, grand = ctx.parents.get(node), ctx.parents.get(ctx.parents.get(node))
    return (isinstance(parent, ast.Attribute) and parent.attr == "wait_stream" and isinstance(grand, ast.Call)
            and grand.func is parent and len(grand.args) == 1 and _is_current_stream(grand.args[0], ctx))


def _joined_in(function: ast.FunctionDef, stream: str, ctx: AnalysisContext) -> bool:
    """Whether every use of `stream` in `function` is followed, on every path to its end or to a return, by a
    wait of the current stream on it (directly, or on an event recorded on it): a statement of the function's
    own body, after the last use and before any return."""
    in_joins = {id(n) for stmt in function.body if isinstance(stmt, ast.Expr) and _joins(stmt.value, ctx)
                for n in ast.walk(stmt)}
    uses = [n.end_lineno or n.lineno for n in ast.walk(function) if isinstance(n, ast.Attribute | ast.Name)
            and id(n) not in in_joins and ast.unparse(n) == stream]
    if not uses:
        return True
    events = {ast.unparse(c.func.value) for c in calls(function) if isinstance(c.func, ast.Attribute)
              and c.func.attr == "record" and [ast.unparse(a) for a in c.args] == [stream]}
    events |= {ast.unparse(a.targets[0]) for a in ast.walk(function) if isinstance(a, ast.Assign)
               and len(a.targets) == 1 and isinstance(a.value, ast.Call) and isinstance(a.value.func, ast.Attribute)
               and a.value.func.attr == "record_event" and ast.unparse(a.value.func.value) == stream}
    for stmt in function.body:
        join = _joins(stmt.value, ctx) if isinstance(stmt, ast.Expr) else None
        if join and (join[1] == stream if join[0] == "stream" else join[1] in events) and stmt.lineno > max(uses):
            returns = [r.lineno for r in ast.walk(function) if isinstance(r, ast.Return)]
            return all(line > stmt.lineno for line in returns)
    return False


def _plain_uses(ctx: AnalysisContext, names: set[str]) -> bool:
    """Whether every stream is used only in ways the join check follows: made (`s = torch.cuda.Stream()`),
    entered (`with torch.cuda.stream(s)`), recorded (`s.record_event()`, `e.record(s)`) or waited on. An
    alias, an argument to anything else, or `torch.cuda.stream(X)` of an unknown X could carry it past."""
    for node in ast.walk(ctx.tree):
        if isinstance(node, ast.Call) and matches(ctx.qual(node.func), ("torch.cuda.stream",)):
            if not (len(node.args) == 1 and ast.unparse(node.args[0]) in names):
                return False
        if not (isinstance(node, ast.Attribute | ast.Name) and ast.unparse(node) in names):
            continue
        parent = ctx.parents.get(node)
        grand = ctx.parents.get(parent)
        made = isinstance(parent, ast.Assign) and node in parent.targets
        entered = isinstance(parent, ast.Call) and matches(ctx.qual(parent.func), ("torch.cuda.stream",))
        recorded = (isinstance(parent, ast.Attribute) and parent.attr == "record_event" and isinstance(grand, ast.Call)) \
            or (isinstance(parent, ast.Call) and isinstance(parent.func, ast.Attribute) and parent.func.attr == "record")
        waited = isinstance(parent, ast.Call) and _joins(parent, ctx) is not None
        if not (made or entered or recorded or waited or _waits_for_current(node, ctx)):
            return False
    return True


def joined_side_streams(ctx: AnalysisContext) -> bool:
    """Every side stream is joined back before the function using it returns: its work is inside the
    measured span, so the stream is legitimate (SOL-ExecBench times it); unjoined or unprovable ones are not."""
    names = _stream_names(ctx)
    if not names or not _plain_uses(ctx, names):
        return False
    functions = [f for f in ast.walk(ctx.tree) if isinstance(f, ast.FunctionDef) and f.name != "__init__"]
    return all(_joined_in(f, name, ctx) for name in names for f in functions)


def check_extra_cuda_stream(ctx: AnalysisContext) -> list[Flag]:
    """Side streams in Python (torch/cupy APIs, `stream=` launch arguments) and in CUDA sources. Streams that
    are provably joined back before return are only noted (`joined_cuda_stream`)."""
    if joined_side_streams(ctx):
        lines = sorted({node.lineno for node, name in _refs(ctx) if matches(name, PY_STREAM_APIS)})
        note = "side streams unused, or joined back to the current stream before the function returns"
        return [flag("joined_cuda_stream", note, lines[0] if lines else None)] + _launch_stream_flags(ctx)
    out = [
        flag("extra_cuda_stream", f"uses {name}", node.lineno)
        for node, name in _refs(ctx)
        if matches(name, PY_STREAM_APIS)
    ]
    for call in calls(ctx.tree):
        for kw in call.keywords:
            if kw.arg == "stream" and _stream_arg_kind(kw.value, ctx) == "side":
                out.append(
                    flag(
                        "extra_cuda_stream", f"launches on side stream `{ast.unparse(kw.value)}`", call.lineno
                    )
                )
    out += cuda_ident_flags(ctx, "extra_cuda_stream", CUDA_STREAM_IDENTS)
    for node in ast.walk(ctx.tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and "default-stream" in node.value:
            out.append(flag("extra_cuda_stream", "compiles with a per-thread default stream", node.lineno))
    return out + _launch_stream_flags(ctx)


def check_threads_or_processes(ctx: AnalysisContext) -> list[Flag]:
    """Threads, processes, async loops in Python; std::thread / std::async / pthreads in CUDA sources."""
    out = _import_flags(ctx, "threads_or_processes", THREAD_MODULES, "concurrent work hides from the timer")
    out += [
        flag("threads_or_processes", f"calls {ctx.qual(c.func)}", c.lineno)
        for c in calls(ctx.tree)
        if matches(ctx.qual(c.func), THREAD_CALLS)
    ]
    for cs in ctx.cuda_strings:
        toks = cs.info.tokens
        for i, tok in enumerate(toks):
            std_call = (
                tok.value in ("thread", "jthread", "async")
                and i >= 2
                and toks[i - 1].value == "::"
                and toks[i - 2].value == "std"
            )
            if std_call or tok.value in ("pthread_create", "cudaLaunchHostFunc"):
                what = f"std::{tok.value}" if std_call else tok.value
                out.append(
                    flag("threads_or_processes", f"uses {what} in CUDA source", cs.py_line_of(tok.line))
                )
    return out


def _patch_targets(ctx: AnalysisContext):
    """(node, qualified target) for assignments/deletes/setattr on attributes of other objects."""
    for node in ast.walk(ctx.tree):
        targets: list[ast.AST] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets = [node.target]
        elif isinstance(node, ast.Delete):
            targets = list(node.targets)
        for t in targets:
            if isinstance(t, ast.Attribute):
                yield node, ctx.qual(t) or ast.unparse(t), t
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("setattr", "delattr")
        ):
            if node.args:
                base = ctx.qual(node.args[0]) or ast.unparse(node.args[0])
                attr = (
                    node.args[1].value
                    if len(node.args) > 1 and isinstance(node.args[1], ast.Constant)
                    else "?"
                )
                yield node, f"{base}.{attr}", node.args[0]


def check_timer_patching(ctx: AnalysisContext) -> list[Flag]:
    """Assignments, setattr/delattr on torch / time / builtins attributes (timers, events, sync, allclose)."""
    out: list[Flag] = []
    for node, target, _ in _patch_targets(ctx):
        if matches(target, PATCHABLE_ROOTS) and not matches(target, NOT_TIMERS):
            out.append(flag("timer_patching", f"patches {target}", node.lineno))
        elif "sys.modules" in target or target.startswith("__builtins__"):
            out.append(flag("timer_patching", f"patches {target}", node.lineno))
    out += _import_flags(ctx, "timer_patching", ("unittest.mock", "mock"), "monkeypatching")
    return out


# Rationale: switches that choose among algorithms (cuDNN autotuning, determinism, attention backends,
# thread counts) and keep float32 arithmetic: a legitimate optimisation of the candidate's own process (CUDA-L1
# measures a `cudnn` baseline with the same switch), judged by the precision check like any code. Everything
# else under torch.backends, and every other setter, can change precision (TF32, reduced-precision
# reductions, matmul precision, default dtype, denormals).
ALGORITHM_SWITCHES = (
    "torch.backends.cudnn.benchmark",
    "torch.backends.cudnn.benchmark_limit",
    "torch.backends.cudnn.deterministic",
    "torch.backends.cudnn.enabled",
    "torch.backends.mkldnn.enabled",
    "torch.use_deterministic_algorithms",
    "torch.set_num_threads",
    "torch.set_num_interop_threads",
    "torch.backends.cuda.enable_flash_sdp",
    "torch.backends.cuda.enable_mem_efficient_sdp",
    "torch.backends.cuda.enable_math_sdp",
    "torch.backends.cuda.enable_cudnn_sdp",
    "torch.backends.cuda.preferred_linalg_library",
    "torch.backends.cuda.preferred_blas_library",
    "torch._C._set_cudnn_benchmark",
    "torch._C._set_cudnn_deterministic",
)


def _backend_switches(ctx: AnalysisContext) -> list[tuple[int, str, bool]]:
    """(line, what, algorithm only) for every write to torch.backends.* and call of a global setter."""
    out = [(node.lineno, f"sets {target}", matches(target, ALGORITHM_SWITCHES))
           for node, target, _ in _patch_targets(ctx) if matches(target, ("torch.backends",))]
    for call in calls(ctx.tree):
        name = ctx.qual(call.func) or ""
        if not (matches(name, FLAG_SETTERS) or name.startswith("torch._C._set_")):
            continue
        algorithm = matches(name, ALGORITHM_SWITCHES)
        if matches(name, ("torch.backends.cudnn.flags",)):
            # The context manager: algorithm switches unless it turns TF32 on (anything but a literal False).
            tf32 = next((k.value for k in call.keywords if k.arg == "allow_tf32"), None)
            algorithm = tf32 is None or (isinstance(tf32, ast.Constant) and tf32.value is False) or (
                isinstance(tf32, ast.Attribute) and ctx.qual(tf32) == "torch.backends.cudnn.allow_tf32")
        out.append((call.lineno, f"calls {name}", algorithm))
    return out


def check_global_backend_flags(ctx: AnalysisContext) -> list[Flag]:
    """Writes to torch.backends.* and calls of global setters that can change precision (not `algorithm_flags`)."""
    return [flag("global_backend_flags", what, line) for line, what, algorithm in _backend_switches(ctx)
            if not algorithm]


def check_algorithm_flags(ctx: AnalysisContext) -> list[Flag]:
    """Global switches that only choose algorithms and keep float32 arithmetic (`ALGORITHM_SWITCHES`)."""
    return [flag("algorithm_flags", what, line) for line, what, algorithm in _backend_switches(ctx) if algorithm]


def check_tampering(ctx: AnalysisContext) -> list[Flag]:
    """sys.modules, frame walking, gc object scans, exec/eval/compile/__import__, globals()."""
    out: list[Flag] = []
    for node, name in _refs(ctx):
        if matches(name, TAMPER_NAMES) and not (isinstance(node, ast.Name) and name in ctx.functions):
            out.append(flag("tampering", f"uses {name}", node.lineno))
    for node in ast.walk(ctx.tree):
        if isinstance(node, ast.Attribute) and node.attr in TAMPER_ATTRS:
            out.append(flag("tampering", f"reads .{node.attr} (frame/closure introspection)", node.lineno))
    out += _import_flags(ctx, "tampering", ("inspect",), "frame introspection")
    out += _import_flags(ctx, "tampering", HARNESS_MODULES, "the evaluator's own internals")
    for node in ast.walk(ctx.tree):
        if isinstance(node, ast.Call) and ctx.qual(node.func) in RAW_SETATTR:
            out.append(flag("tampering", f"calls {ctx.qual(node.func)} (bypasses attribute guards on classes)",
                            node.lineno))
    return out


def _is_write_open(call: ast.Call) -> bool:
    mode = (
        call.args[1]
        if len(call.args) > 1
        else next((k.value for k in call.keywords if k.arg == "mode"), None)
    )
    return (
        isinstance(mode, ast.Constant)
        and isinstance(mode.value, str)
        and any(c in mode.value for c in "wax+")
    )


def check_env_or_io(ctx: AnalysisContext) -> list[Flag]:
    """os.environ writes, file writes, network/native/dynamic-import modules."""
    out = _import_flags(ctx, "env_or_io", IO_MODULES, "I/O, network or native code")
    for node in ast.walk(ctx.tree):
        if isinstance(node, ast.Assign | ast.AugAssign | ast.Delete):
            targets = node.targets if isinstance(node, ast.Assign | ast.Delete) else [node.target]
            for t in targets:
                if isinstance(t, ast.Subscript) and ctx.qual(t.value) == "os.environ":
                    out.append(flag("env_or_io", f"writes os.environ[{ast.unparse(t.slice)}]", node.lineno))
        elif isinstance(node, ast.Call):
            name = ctx.qual(node.func) or ""
            if matches(name, IO_CALLS) or name.rsplit(".", 1)[-1] in ("write_text", "write_bytes"):
                out.append(flag("env_or_io", f"calls {name}", node.lineno))
            elif name in ("open", "io.open") and _is_write_open(node):
                out.append(flag("env_or_io", "opens a file for writing", node.lineno))
    return out


def check_inner_compile_or_graph(ctx: AnalysisContext) -> list[Flag]:
    """torch.compile, TorchScript, dynamo/inductor and CUDA graph capture inside the candidate."""
    out = [
        flag("inner_compile_or_graph", f"uses {name}", node.lineno)
        for node, name in _refs(ctx)
        if matches(name, COMPILE_APIS)
    ]
    out += cuda_ident_flags(
        ctx,
        "inner_compile_or_graph",
        {"cudaStreamBeginCapture": "captures a CUDA graph", "cudaGraphLaunch": "launches a CUDA graph"},
    )
    return out
