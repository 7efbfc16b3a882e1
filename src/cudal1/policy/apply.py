"""Deciding a policy (`presets.Policy`) from an evaluation's evidence.

Only a `correct` verdict can be turned down; every other verdict stands. The evidence:
- the kernel class and the static rules' flags the evaluator recorded (`exception_fallback`);
- the first trial's precision evidence (`guard.reduced_precision`: the candidate's error far above the float32
  reference's own against a float64 run), for `reject_reduced_precision`;
- the profiled run's flags (GPU): `guard.decoy_kernel` and `guard.kernels_not_run` (the candidate's kernels
  did not compute the output), `guard.low_custom_share` (they carried little of the forward's device time);
- whether it builds kernels at all (extensions, CUDA strings, Triton kernels): built kernels with a kernel
  class that is not custom are decoys (never launched, or launched only inside a fallback);
- the candidate's forward path read from its syntax tree (`analysis.context`): torch calls and the ops the
  compiled C++/CUDA strings call through `torch::`/`at::`, compile calls reachable from `forward`. A kernel-form
  candidate (a launch spec, `kernel_form.spec.is_kernel_form`) has no host code: its own kernels are all that
  runs, with no torch op, fallback or build on its forward path.
Each violation is a `policy.*` flag; the verdict becomes `hack_detected` with the policy's name, and the
result records the policy (and the reward it gives a violation) in its protocol.

Limits: the static op check sees calls written as `torch.x(...)`, `F.x(...)` (aliases resolved) and, for
forbidden ops, methods by name (`t.softmax(...)`); ops reached through computed names are not seen, which
the profiled run's own-kernel share covers on a GPU (CUDA Agent's rule) and not on the CPU.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Mapping
from typing import Any

from cudal1.analysis.context import AnalysisContext, build_context, call_name
from cudal1.core import flags as F
from cudal1.core.errors import ConfigError
from cudal1.core.forms import is_kernel_form
from cudal1.core.syntax import parse as parse_python
from cudal1.core.types import CUSTOM_CLASSES, EvalResult, Flag, Severity, Status
from cudal1.policy.presets import HARD_FORBIDDEN_OPS, Policy, resolve_policy

#: torch calls that allocate or describe tensors, or manage devices and streams, not compute: CUDA Agent
#: allows them around its own kernels.
ALLOWED_TORCH_CALLS = frozenset({
    "empty", "empty_like", "empty_strided", "zeros", "zeros_like", "ones", "ones_like", "full", "full_like",
    "tensor", "as_tensor", "from_numpy", "arange", "device", "dtype", "Size", "is_tensor", "no_grad",
    "inference_mode", "manual_seed", "get_default_dtype", "finfo", "iinfo", "broadcast_shapes",
    "set_grad_enabled",
})
ALLOWED_TORCH_PREFIXES = ("torch.cuda.", "torch.utils.", "torch.nn.Parameter", "torch.nn.Module",
                          "torch.nn.init.", "torch.Tensor", "torch.jit.", "torch.library.")
ALLOWED_CPP_OPS = frozenset({"empty", "empty_like", "zeros", "zeros_like", "ones", "full", "empty_strided",
                             "TensorOptions", "kCUDA", "kFloat", "kHalf", "kBFloat16", "kInt", "kLong",
                             "Tensor", "ScalarType", "Device", "IntArrayRef"})
_CPP_OP = re.compile(r"\b(?:torch|at)::(?:native::)?([A-Za-z_]\w*)\s*\(")
DECOY_RULES = ("guard.decoy_kernel", "guard.kernels_not_run")


def apply_policy(result: EvalResult, source: str, policy: str | Policy | None = None, *,
                 task_source: str | None = None) -> EvalResult:
    """`result` judged under `policy` (a preset name, a file or a Policy): a correct verdict with violations
    becomes `hack_detected`; the result records `policy`, its base rules (`policy_rules`: the static preset
    and whether guards reject) and `policy_violation_reward` in its protocol."""
    rules = resolve_policy(policy)
    protocol = {**result.protocol, **recorded_policy(rules)}
    if rules.violation_reward is not None:
        protocol["policy_violation_reward"] = rules.violation_reward
    if result.status is not Status.CORRECT or rules.is_identity:
        return result.replace(protocol=protocol)
    found = violations(result, source, rules, task_source=task_source)
    if not found:
        return result.replace(protocol=protocol)
    message = f"policy {rules.name}: " + "; ".join(f.message for f in found[:3])
    return result.replace(status=Status.HACK_DETECTED, message=message, flags=[*result.flags, *found],
                          speedup=None, timing=None, protocol=protocol)


def recorded_policy(rules: Policy) -> dict[str, Any]:
    """What a result records of the policy that judged it: its name and its base rules (a row without
    `policy_rules` predates them: its profile's policy judged its static flags and guards)."""
    return {"policy": rules.name, "policy_rules": {"static_preset": rules.static_preset,
                                                   "reject_runtime_guards": rules.reject_runtime_guards}}


def violations(result: EvalResult, source: str, rules: Policy, *, task_source: str | None = None) -> list[Flag]:
    """Every rule of `rules` the evaluation's evidence breaks, as `policy.*` flags (ERROR)."""
    return violations_from_facts(result, source_facts(source, task_source, rules.forbidden_ops), rules)


def source_facts(source: str, task_source: str | None = None,
                 forbidden_ops: tuple[str, ...] = HARD_FORBIDDEN_OPS) -> dict[str, Any]:
    """What the policies read from the candidate's source, as JSON-ready data, so that a verdict under any
    preset can be decided again from a record without the source (`violations_from_facts`): whether it
    builds kernels, its first torch compute calls on the forward path, its uses of forbidden ops (the
    task's `FORBIDDEN_OPS` and `forbidden_ops`; `ops_checked` names them), a compile call inside forward."""
    task_ops = task_forbidden_ops(task_source)
    ops = tuple(dict.fromkeys((*task_ops, *forbidden_ops)))
    if is_kernel_form(source):  # no host code: its kernels, nothing else, on the forward path
        return {"parsed": True, "form": "kernel", "builds_kernels": True, "torch_compute_calls": [],
                "task_forbidden_ops": list(task_ops), "ops_checked": list(ops), "forbidden_calls": [],
                "build_in_forward": None}
    try:
        ctx = build_context(source)
    except SyntaxError:
        return {"parsed": False}
    build = next(((ext.origin, ext.line) for ext in ctx.extensions
                  if ext.node is not None and ctx.in_reachable(ext.node)), None)
    return {"parsed": True, "builds_kernels": bool(ctx.extensions or ctx.cuda_strings or ctx.triton_kernels),
            "torch_compute_calls": [[name, line] for name, line in torch_compute_calls(ctx)[:3]],
            "task_forbidden_ops": list(task_ops), "ops_checked": list(ops),
            "forbidden_calls": [[op, line] for op, line in forbidden_calls(ctx, ops)],
            "build_in_forward": None if build is None else [build[0], build[1]]}


def violations_from_facts(result: EvalResult, facts: Mapping[str, Any], rules: Policy) -> list[Flag]:
    """`violations` from the evaluation's evidence and the source's `source_facts`. `ConfigError` when the
    policy forbids ops the facts did not look for (decide it from the source then)."""
    out: list[Flag] = []
    rule_names = {f.rule for f in result.flags}
    kind = result.kernel_class.value if result.kernel_class else "unknown"

    def add(rule: str, message: str, line: int | None = None) -> None:
        out.append(Flag(f"policy.{rule}", Severity.ERROR, message, line=line, source="policy"))

    if rules.own_kernel and kind not in rules.own_kernel_classes:
        own = " or ".join(rules.own_kernel_classes)
        add("own_kernel", f"the output is not computed by the candidate's own kernel ({own}; kernel class {kind})")
    runtime_decoy = next((f for f in result.flags if f.rule in DECOY_RULES), None)
    if rules.reject_decoys and runtime_decoy is not None:
        add("decoy_kernel", f"a decoy kernel: {runtime_decoy.message}")
    if rules.reject_reduced_precision:
        reduced = next((f for f in result.flags if f.rule == F.REDUCED_PRECISION), None)
        if reduced is not None:
            add("reduced_precision", reduced.message)
    if rules.reject_fallbacks and "exception_fallback" in rule_names:
        line = next(f.line for f in result.flags if f.rule == "exception_fallback")
        add("fallback", "a try/except fallback to PyTorch on the forward path", line)
    if not facts.get("parsed"):
        return out
    if (rules.reject_decoys and runtime_decoy is None and facts["builds_kernels"]
            and result.kernel_class not in CUSTOM_CLASSES):
        # Kernels that are built but not guaranteed to run (never launched, or only inside a fallback): the
        # profiler's decoy check covers custom-classified candidates only, so this case is decided here.
        add("decoy_kernel", f"builds kernels that its forward is not guaranteed to run (kernel class {kind})")
    if rules.no_torch_ops:
        for name, line in facts["torch_compute_calls"][:1]:
            add("torch_op", f"calls {name} on the forward path", line)
        if "guard.low_custom_share" in rule_names:
            add("torch_op", "its own kernels carried little of the forward's device time (profiled run)")
    forbidden = tuple(facts["task_forbidden_ops"]) or rules.forbidden_ops
    unchecked = sorted(set(forbidden) - set(facts["ops_checked"]))
    if unchecked:
        raise ConfigError(f"the source facts did not look for {', '.join(unchecked)}: decide {rules.name} from the "
                          "source")
    for name, line in [c for c in facts["forbidden_calls"] if c[0] in forbidden][:1]:
        add("forbidden_op", f"uses {name}, which this task forbids", line)
    if rules.no_build_in_forward and facts["build_in_forward"] is not None:
        origin, line = facts["build_in_forward"]
        add("build_in_forward", f"compiles an extension ({origin}) inside forward", line)
    return out


def torch_compute_calls(ctx: AnalysisContext) -> list[tuple[str, int]]:
    """(name, line) of torch compute calls on the forward path: Python calls and `torch::`/`at::` calls in
    the compiled strings; allocation, shape and device helpers excepted."""
    found = []
    for node in _forward_calls(ctx):
        name = call_name(node, ctx.imports) or ""
        if name.startswith("torch.") and not _allowed_torch(name):
            found.append((name, node.lineno))
    for string in ctx.cuda_strings:
        for i, text in enumerate(string.text.splitlines(), start=1):
            for op in _CPP_OP.findall(text):
                if op not in ALLOWED_CPP_OPS:
                    found.append((f"torch::{op} (C++)", string.py_line_of(i)))
    return found


def forbidden_calls(ctx: AnalysisContext, ops: tuple[str, ...]) -> list[tuple[str, int]]:
    """(op, line) for each use of a forbidden op on the forward path: the qualified call, a method of that
    name (`t.softmax(...)`), or a `torch::`/`at::` call of it in the compiled strings."""
    if not ops:
        return []
    short = {op.rsplit(".", 1)[-1]: op for op in ops}
    found = []
    for node in _forward_calls(ctx):
        name = call_name(node, ctx.imports) or ""
        if name in ops:
            found.append((name, node.lineno))
        elif isinstance(node.func, ast.Attribute) and node.func.attr in short and not name.startswith("torch."):
            found.append((short[node.func.attr], node.lineno))
    for string in ctx.cuda_strings:
        for i, text in enumerate(string.text.splitlines(), start=1):
            found += [(short[op], string.py_line_of(i)) for op in _CPP_OP.findall(text) if op in short]
    return found


def task_forbidden_ops(task_source: str | None) -> tuple[str, ...]:
    """The task's own `FORBIDDEN_OPS = [...]` (a literal list of qualified names), if it has one."""
    if not task_source:
        return ()
    try:
        tree = parse_python(task_source)
    except SyntaxError:
        return ()
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "FORBIDDEN_OPS"
                                                for t in node.targets):
            try:
                value = ast.literal_eval(node.value)
            except ValueError:
                return ()
            return tuple(str(v) for v in value) if isinstance(value, list | tuple) else ()
    return ()


def _forward_calls(ctx: AnalysisContext) -> list[ast.Call]:
    return [node for fn in ctx.reachable for node in ast.walk(fn) if isinstance(node, ast.Call)]


def _allowed_torch(name: str) -> bool:
    return name.removeprefix("torch.") in ALLOWED_TORCH_CALLS or name.startswith(ALLOWED_TORCH_PREFIXES)
