"""Baseline kinds as records: one `BaselineKind` per kind, in one live table.

A kind is everything the project knows about one baseline: its name, the template of its generated
`ModelNew` (`cudal1.core.baseline_templates`), the correctness profile it is evaluated under when not the
caller's, whether it needs CUDA, the CUDA-L1 release's score key for it, and whether the reports list it.
The table lives on the ground floor so that `metrics` and `report` read the same records that
`cudal1.baselines` generates and times. Every view of it (`baseline_kind_names`, `reported_baseline_names`,
`published_key_by_baseline`, `cuda_only_kinds`, `eval_profile_overrides`) is computed on each call, so a kind
added with `register_baseline_kind` shows up everywhere at once:

    register_baseline_kind(BaselineKind("channels_last", TEMPLATE, published_key="score_channels_last"))

Report order is registration order: the built-in kinds first, then the added ones.

A template is a `string.Template` appended to the module header, which defines `_Model` (the reference
class), `_clone_outputs` and `_require_cuda`; its placeholders are `TEMPLATE_PARAMETERS`, and `$$` is a dollar.

Limits: the table is process-wide and not locked; register kinds before starting threads that read it. A
kind's profile name is checked only when a baseline is evaluated (the profiles live above this floor).
"""

from __future__ import annotations

import string
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from cudal1.core import baseline_templates as templates
from cudal1.core.errors import ConfigError

#: Placeholders a kind's template may use (filled in by `cudal1.baselines.variants.baseline_source`).
TEMPLATE_PARAMETERS: dict[str, str] = {
    "clone": "`_clone_outputs` when the caller wants outputs cloned, empty otherwise (`$clone(out)`)",
    "warmup": "calls before a CUDA graph capture",
    "max_graphs": "CUDA graphs kept per wrapper (one per input signature)",
    "max_bound": "CUDA graphs bound to caller buffers that come back",
}

# `all` selects every kind in `parse_kinds`; `eager_warm` is the metrics' pseudo-baseline.
_RESERVED = frozenset({"all", "eager_warm"})


@dataclass(frozen=True)
class BaselineKind:
    """One baseline kind.

    Attributes:
        name: what users type and results record (a Python identifier).
        template: the module text after the header, defining `ModelNew` (`string.Template` syntax).
        profile: the correctness profile it is evaluated under instead of the caller's, or None.
        cuda_only: whether it can only run on a CUDA device (on CPU the runner records a failure).
        published_key: the CUDA-L1 release's score key for this baseline (`score_*`), or None.
        reported: whether the reports list it among their baselines.
    """

    name: str
    template: str
    profile: str | None = None
    cuda_only: bool = False
    published_key: str | None = None
    reported: bool = True

    def __post_init__(self) -> None:
        if not self.name.isidentifier() or self.name in _RESERVED:
            raise ConfigError(f"baseline kind name {self.name!r} must be a Python identifier other than "
                              f"{' or '.join(sorted(_RESERVED))}")
        try:
            string.Template(self.template).substitute({p: "" for p in TEMPLATE_PARAMETERS})
        except (KeyError, ValueError) as exc:
            raise ConfigError(f"baseline kind {self.name!r}: bad template placeholder ({exc}); the placeholders "
                              f"are {', '.join('$' + p for p in TEMPLATE_PARAMETERS)}, and $$ is a dollar") from None


_BUILTIN: tuple[BaselineKind, ...] = (
    BaselineKind("eager", templates.EAGER, published_key="score_default"),
    # Rationale (torch.compile kinds): on a cold inductor cache, compiling starts a Python helper thread even
    # with one compile thread, which the strict profile's thread guard rejects as a hack. Our generated code
    # is trusted, so these kinds use a profile whose runtime guards only warn; drop the override once a
    # "strict tolerances, non-rejecting guards" profile exists in `cudal1.eval.config.PROFILES`.
    BaselineKind("torch_compile", templates.TORCH_COMPILE, profile="trusted",
                 published_key="score_torch_compile_default"),
    BaselineKind("torch_compile_reduce_overhead", templates.TORCH_COMPILE_REDUCE_OVERHEAD, profile="trusted",
                 published_key="score_torch_compile_reduce_overhead"),
    BaselineKind("cuda_graph", templates.CUDA_GRAPH, cuda_only=True, published_key="score_cuda_graph"),
    BaselineKind("cudnn", templates.CUDNN, cuda_only=True, published_key="score_cudnn"),
    # Rationale: TF32 rounds fp32 matmul/conv inputs to 10-bit mantissas (~1e-3 relative error), which the
    # strict fp32 tolerance (1e-4) rejects by design; kernelbench-v0's 1e-2 is what published numbers used.
    # The release scores no TF32 variant, and the reports leave it out: it is an extra.
    BaselineKind("tf32", templates.TF32, profile="kernelbench-v0", cuda_only=True, reported=False),
)

_KINDS: dict[str, BaselineKind] = {kind.name: kind for kind in _BUILTIN}


def register_baseline_kind(kind: BaselineKind) -> BaselineKind:
    """Add `kind` to the table (after every kind already there) and return it.

    Raises:
        ConfigError: a kind of that name is already registered.
    """
    if kind.name in _KINDS:
        raise ConfigError(f"baseline kind {kind.name!r} is already registered")
    _KINDS[kind.name] = kind
    return kind


def unregister_baseline_kind(name: str) -> BaselineKind:
    """Remove the added kind `name` from the table and return it.

    Raises:
        ConfigError: `name` is not registered, or is a built-in kind (results and reports rely on those).
    """
    if any(kind.name == name for kind in _BUILTIN):
        raise ConfigError(f"baseline kind {name!r} is built in and cannot be unregistered")
    if name not in _KINDS:
        raise ConfigError(f"baseline kind {name!r} is not registered")
    return _KINDS.pop(name)


@contextmanager
def registered_baseline_kind(kind: BaselineKind) -> Iterator[BaselineKind]:
    """Register `kind` for the duration of a `with` block (tests, one-off runs), then remove it."""
    register_baseline_kind(kind)
    try:
        yield kind
    finally:
        unregister_baseline_kind(kind.name)


def baseline_kind(name: str) -> BaselineKind:
    """The registered kind called `name`.

    Raises:
        ConfigError: unknown `name` (the message lists the known kinds).
    """
    try:
        return _KINDS[name]
    except KeyError:
        raise ConfigError(f"unknown baseline kind {name!r}: choose from {', '.join(_KINDS)}") from None


def baseline_kinds() -> tuple[BaselineKind, ...]:
    """Every registered kind, in report order."""
    return tuple(_KINDS.values())


def baseline_kind_names() -> tuple[str, ...]:
    """The names of every registered kind, in report order (extras such as `tf32` included)."""
    return tuple(_KINDS)


def reported_baseline_names() -> tuple[str, ...]:
    """The baselines the reports list, in their order (eager first; design section 4, *Baselines*)."""
    return tuple(kind.name for kind in _KINDS.values() if kind.reported)


def published_key_by_baseline() -> dict[str, str]:
    """Baseline -> the CUDA-L1 release's score key for it, for the kinds that have one, in report order."""
    return {kind.name: kind.published_key for kind in _KINDS.values() if kind.published_key}


def cuda_only_kinds() -> frozenset[str]:
    """The kinds that can only run on a CUDA device."""
    return frozenset(kind.name for kind in _KINDS.values() if kind.cuda_only)


def eval_profile_overrides() -> dict[str, str]:
    """Kind -> the correctness profile it is evaluated under instead of the caller's."""
    return {kind.name: kind.profile for kind in _KINDS.values() if kind.profile}
