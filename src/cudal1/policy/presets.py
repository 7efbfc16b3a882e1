"""What rejects, as data (`Policy`), selectable by name or from a user's YAML/JSON file.

A policy holds every rule that turns evidence into a rejection: the static preset whose `reject` rules end an
evaluation before it runs (`cudal1.analysis.presets`), whether runtime guards reject
(`reject_runtime_guards`; the findings `cudal1.core.flags.RUNTIME_FLAGS` marks `always_rejects` reject under
every policy) and the harness rules decided from the recorded evidence (`apply.py`). The correctness
profile (`cudal1.eval.config`) only says how to measure. `decide.decide(flags, policy)` is the one rule.

- `guarded` (the `strict` profile's): the strict static preset (the cheats and downcasts reject) and every
  runtime guard rejects.
- `cuda-l1` (the `loose` profile's): CUDA-L1's rules; its static preset rejects only side streams and result
  caching, guards are recorded; any correct and faster module counts.
- `kernelbench-v0` (the `trusted` and `evidence` profiles'): KernelBench's published rule: the output alone
  decides; every static rule and guard is recorded, only what rejects under every policy rejects.
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

The harness presets (`kernelbench` to `sol-execbench`) sit on `kernelbench-v0`: what they add is their own rule.
A user file holds a mapping: `{"base": "kernelbench", "forbidden_ops": ["torch.bmm"], "violation_reward":
-0.5}`; keys are `Policy` fields (`static_preset` and `reject_runtime_guards` too), `base` a preset name
(default `kernelbench-v0`).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from cudal1.analysis.presets import PRESETS as STATIC_PRESETS
from cudal1.core.errors import ConfigError
from cudal1.core.names import describe_choices
from cudal1.core.types import KernelClass

#: The policy of the default profile (`strict`).
DEFAULT_POLICY = "guarded"

#: The base of a user's policy file that names none: nothing rejects but what rejects under every policy.
FILE_BASE = "kernelbench-v0"

#: Ops forbidden by `kernelbench-hard` when a task names none (KernelBench-Hard's usual list).
HARD_FORBIDDEN_OPS = ("torch.softmax", "torch.nn.functional.softmax", "torch.topk", "torch.sort",
                      "torch.argsort", "torch.nn.functional.scaled_dot_product_attention")


@dataclass(frozen=True)
class Policy:
    """What rejects: the static preset, the runtime guards, one harness's acceptance rules (`decide.decide`,
    `apply.apply_policy`)."""

    name: str = FILE_BASE
    static_preset: str = "kernelbench-v0"  # the static preset whose `reject` rules end an evaluation unrun
    reject_runtime_guards: bool = False  # whether runtime findings of severity ERROR reject (hack_detected)
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
        """Whether the policy adds no harness rule to its static preset and guards (nothing to decide after the
        evaluation, `apply.apply_policy`)."""
        return not (self.own_kernel or self.reject_decoys or self.reject_fallbacks or self.no_torch_ops
                    or self.forbidden_ops or self.no_build_in_forward or self.reject_reduced_precision)

    def to_dict(self) -> dict[str, Any]:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(self).items()}


PRESETS: dict[str, Policy] = {
    "guarded": Policy("guarded", static_preset="strict", reject_runtime_guards=True,
                      notes="the strict static rules (cheats, downcasts) and every runtime guard reject"),
    "cuda-l1": Policy("cuda-l1", static_preset="cuda-l1",
                      notes="CUDA-L1: side streams and result caching reject; a faster PyTorch rewrite counts"),
    "kernelbench-v0": Policy("kernelbench-v0",
                             notes="KernelBench's published rule: the output decides; every check recorded"),
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


#: One line per preset for help texts.
POLICY_HELP: dict[str, str] = {
    "guarded": "the strict profile's: cheats and guards reject",
    "cuda-l1": "the loose profile's: side streams, caching reject",
    "kernelbench-v0": "trusted's and evidence's: the output decides",
}


def policy_choices() -> str:
    """The presets for help texts, ending with the file a user may give instead."""
    return describe_choices(((name, POLICY_HELP.get(name, "")) for name in PRESETS), or_else="a YAML/JSON file")


def resolve_policy(spec: str | Policy | None) -> Policy:
    """A preset's name, a path to a YAML/JSON policy file, or a Policy; raises ConfigError otherwise. None or
    "": `DEFAULT_POLICY` (a config's empty policy means its profile's: `cudal1.eval.config.resolve_judging`)."""
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
    base = str(data.pop("base", FILE_BASE))
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
    if "static_preset" in data and data["static_preset"] not in STATIC_PRESETS:
        raise ConfigError(f"policy file {where}: unknown static_preset {data['static_preset']!r} (one of "
                          f"{', '.join(STATIC_PRESETS)})")
    try:
        return dataclasses.replace(PRESETS[base], name=f"{base}+{Path(where).stem}", **data)
    except TypeError as exc:
        raise ConfigError(f"policy file {where}: {exc}") from None
