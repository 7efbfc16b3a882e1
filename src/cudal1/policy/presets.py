"""The rule sets of other harnesses as data (`Policy`), selectable by name or from a user's YAML/JSON file.

- `cuda-l1` (default): CUDA-L1's rules; any correct and faster module counts, so nothing is added.
- `kernelbench`: KernelBench's backend rule: a CUDA entry must compute its output with its own kernel; a
  decoy kernel (compiled but not what computes the output) and try/except fallbacks to PyTorch fail.
- `kernelgym`: KernelGYM's decoy rule: a decoy kernel, or a forward that runs no kernel of its own (CUDA
  or Triton), earns a negative reward (-1).
- `cuda-agent`: CUDA Agent's op rules: no `torch.nn.functional` or torch compute ops on the forward path,
  in Python or inside the C++ extension (allocation and shape helpers are allowed), and its own kernels
  must carry the forward's device time.
- `kernelbench-hard`: per-task forbidden ops (`F.softmax`, `torch.topk`, `torch.sort`, scaled-dot-product
  attention...): the task's own `FORBIDDEN_OPS` list, else the policy's.
- `sol-execbench`: SOL-ExecBench's build rule: no `load_inline` (or other compile call) inside `forward`.

A user file holds a mapping: `{"base": "kernelbench", "forbidden_ops": ["torch.bmm"], "violation_reward":
-0.5}`; keys are `Policy` fields, `base` a preset name (default `cuda-l1`).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from cudal1.core.errors import ConfigError
from cudal1.core.names import describe_choices
from cudal1.core.types import KernelClass

#: The default policy: the method this project reproduces.
DEFAULT_POLICY = "cuda-l1"

#: Ops forbidden by `kernelbench-hard` when a task names none (KernelBench-Hard's usual list).
HARD_FORBIDDEN_OPS = ("torch.softmax", "torch.nn.functional.softmax", "torch.topk", "torch.sort",
                      "torch.argsort", "torch.nn.functional.scaled_dot_product_attention")


@dataclass(frozen=True)
class Policy:
    """One harness's acceptance rules, decided from the evidence of an evaluation (`apply.apply_policy`)."""

    name: str = DEFAULT_POLICY
    own_kernel: bool = False  # the output must come from the candidate's own kernel (kernel class)
    own_kernel_classes: tuple[str, ...] = ("custom_cuda",)  # the kernel classes that count as its own
    reject_decoys: bool = False  # its kernels must run and carry the forward's time (profiled run)
    reject_fallbacks: bool = False  # no try/except fallback to PyTorch (static rule `exception_fallback`)
    no_torch_ops: bool = False  # no torch compute ops on the forward path, Python or C++
    forbidden_ops: tuple[str, ...] = ()  # ops that must not appear on the forward path (per task: FORBIDDEN_OPS)
    no_build_in_forward: bool = False  # no compile call on the forward path
    reject_reduced_precision: bool = False  # no fp16/bf16/TF32 arithmetic in a float32 task (run-time evidence)
    violation_reward: float | None = None  # the RL reward of a violation (None: that of hack_detected)
    notes: str = field(default="", compare=False)

    @property
    def is_identity(self) -> bool:
        """Whether the policy adds nothing to the evaluator's verdict."""
        return not (self.own_kernel or self.reject_decoys or self.reject_fallbacks or self.no_torch_ops
                    or self.forbidden_ops or self.no_build_in_forward or self.reject_reduced_precision)

    def to_dict(self) -> dict[str, Any]:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(self).items()}


PRESETS: dict[str, Policy] = {
    "cuda-l1": Policy("cuda-l1", notes="CUDA-L1: a faster PyTorch rewrite counts; the evaluator's verdict only"),
    "kernelbench": Policy("kernelbench", own_kernel=True, reject_decoys=True, reject_fallbacks=True,
                          notes="KernelBench backend rule: the output comes from the candidate's own kernel"),
    # KernelGYM profiles the forward: no custom (Triton or CUDA) kernel among the kernels it ran is a decoy.
    "kernelgym": Policy("kernelgym", own_kernel=True, own_kernel_classes=("custom_cuda", "triton"),
                        reject_decoys=True, violation_reward=-1.0,
                        notes="KernelGYM: a decoy kernel, or no kernel of its own, earns a negative reward"),
    "cuda-agent": Policy("cuda-agent", own_kernel=True, reject_decoys=True, no_torch_ops=True,
                         notes="CUDA Agent: no torch.nn.functional or torch compute ops on the forward path"),
    "kernelbench-hard": Policy("kernelbench-hard", forbidden_ops=HARD_FORBIDDEN_OPS,
                               notes="KernelBench-Hard: per-task forbidden ops (the task's FORBIDDEN_OPS)"),
    "sol-execbench": Policy("sol-execbench", no_build_in_forward=True,
                            notes="SOL-ExecBench: no load_inline build inside forward"),
}


def policy_choices() -> str:
    """The presets for help texts, ending with the file a user may give instead; a preset that adds nothing
    to the evaluator's verdict says so."""
    return describe_choices(((name, "adds nothing" if p.is_identity else "") for name, p in PRESETS.items()),
                            or_else="a YAML/JSON file")


def resolve_policy(spec: str | Policy | None) -> Policy:
    """A preset's name, a path to a YAML/JSON policy file, or a Policy; raises ConfigError otherwise."""
    if spec is None or spec == "":
        return PRESETS[DEFAULT_POLICY]
    if isinstance(spec, Policy):
        return spec
    if spec in PRESETS:
        return PRESETS[spec]
    path = Path(spec)
    if not path.is_file():
        raise ConfigError(f"unknown policy {spec!r}: one of {', '.join(PRESETS)}, or a YAML/JSON file")
    return _from_mapping(_read_mapping(path), str(path))


def _read_mapping(path: Path) -> dict[str, Any]:
    text = path.read_text(encoding="utf-8")
    try:
        data = json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as exc:
        raise ConfigError(f"policy file {path}: cannot be parsed ({exc})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"policy file {path}: a mapping of Policy fields is expected")
    return data


def _from_mapping(data: dict[str, Any], where: str) -> Policy:
    base = str(data.pop("base", DEFAULT_POLICY))
    if base not in PRESETS:
        raise ConfigError(f"policy file {where}: unknown base {base!r} (one of {', '.join(PRESETS)})")
    known = {f.name for f in dataclasses.fields(Policy)} - {"name"}
    unknown = sorted(set(data) - known)
    if unknown:
        raise ConfigError(f"policy file {where}: unknown field(s) {', '.join(unknown)} (known: {', '.join(sorted(known))})")
    for key in ("forbidden_ops", "own_kernel_classes"):
        if key in data:
            data[key] = tuple(str(v) for v in data[key] or ())
    unknown_classes = set(data.get("own_kernel_classes", ())) - {k.value for k in KernelClass}
    if unknown_classes:
        raise ConfigError(f"policy file {where}: unknown kernel class(es) {', '.join(sorted(unknown_classes))} "
                          f"(known: {', '.join(k.value for k in KernelClass)})")
    try:
        return dataclasses.replace(PRESETS[base], name=f"{base}+{Path(where).stem}", **data)
    except TypeError as exc:
        raise ConfigError(f"policy file {where}: {exc}") from None
