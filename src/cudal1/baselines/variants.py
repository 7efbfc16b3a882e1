"""Baselines as generated candidates: module sources defining `ModelNew` around a task's reference `Model`.

A baseline is timed exactly like an LLM-written candidate (same isolated runner, same paired protocol
against eager), so `baseline_source(task, kind)` returns the text of a candidate module. The module never
imports the harness: it embeds the task source as a string literal and executes it into a private
namespace to obtain `Model` (applying the task's `SMALL_SIZES` when generated for `sizes="small"`, as the
harness does for the reference). The harness seeds the RNG before constructing `ModelNew`, and the
wrapper's first action is to construct `Model`, so the weights equal the reference's.

Each kind is one `BaselineKind` record in `cudal1.core.baselines` (its template, profile, CUDA-only mark,
published key, whether reports list it); here a module is assembled from the header (the embedded task) and
the kind's template, its placeholders filled in. `register_baseline_kind` adds a kind at run time.

Built-in kinds, in report order (`tf32` is an extra the reports leave out):
- `eager`: the reference itself (its speedup vs eager measures the protocol's noise);
- `torch_compile`: `torch.compile(model)` (inductor, default mode, static shapes, one compile thread so the
  thread guard stays quiet);
- `torch_compile_reduce_overhead`: `torch.compile(model, mode="reduce-overhead")` (inductor + CUDA graph
  trees); each call marks a new step and returns clones of the outputs;
- `cuda_graph`: the reference captured once per input signature with `torch.cuda.graph` after a warm-up on
  a side stream (PyTorch's recipe). Inputs that come back to the same addresses (the evaluator's few input
  slots, refilled each call; a caller's reused buffers) get a graph bound to those addresses from their
  second call on (at most `MAX_BOUND_GRAPHS`), whose replays copy nothing: the graph is timed on the same
  terms as a candidate, which reads its inputs where they lie. Inputs seen once at an address are copied
  into the signature graph's static buffers before its replay, and get clones of its outputs (which every
  such input set shares). With `clone_outputs` (the default) a bound graph's calls return clones of its static
  outputs too, so callers never alias graph memory; the baseline runner turns it off (CUDA-L1's convention):
  a bound graph's outputs are its address's own, and the evaluator consumes them before that address's
  next call. Capture errors
  raise `CudaGraphCaptureError` naming the reason (CPU sync such as `.item()`, data-dependent shapes, CPU
  tensors);
- `cudnn`: CUDA-L1's cuDNN variant: the call runs under `torch.backends.cudnn.flags(enabled=True,
  benchmark=True, deterministic=False)`; cuDNN's TF32 stays as the evaluator set it (off under profiles
  with `exact_fp32`, such as strict; PyTorch's default, on, otherwise);
- `tf32`: cuDNN benchmark plus TF32 for matmuls and convolutions.

A kind's record may name the profile it is evaluated under instead of the caller's (`eval_profile`): `tf32`
is not fp32-exact by construction, so it uses the looser `kernelbench-v0`; the torch.compile kinds use
`trusted` (strict tolerances; their cold-cache helper thread only warns).

Flag changes are made inside `forward` and restored before it returns: the evaluator's guards flag global
state that persists across its phase boundaries, and restoring keeps the reference unaffected.

Limits: the CUDA-graph wrapper assumes static shapes per signature (a new shape/dtype or non-tensor
argument value captures a new graph, at most `MAX_GRAPHS`); a reference whose forward replaces a tensor it
keeps (an RNN's `self.hidden = ...`) after its first call is refused with that reason, but one whose
forward depends on other host-side state that changes between calls (counters, Python randomness) replays
the first call's behaviour.
"""

from __future__ import annotations

import string

from cudal1.core import baseline_templates
from cudal1.core.baselines import baseline_kind, baseline_kind_names, eval_profile_overrides
from cudal1.core.errors import ConfigError
from cudal1.tasks.task import Task

#: Graphs kept per wrapper (one per distinct input signature).
MAX_GRAPHS = 4

#: Graphs bound to input addresses that come back (the evaluator's input slots: at most 4, `planes.MAX_SLOTS`).
MAX_BOUND_GRAPHS = 4

#: Warm-up calls on a side stream before capture (PyTorch's recipe uses a few; 3 absorbs lazy init). At least
#: 3: the state check compares the module's tensors after the first and the last, and the last two outputs.
GRAPH_WARMUP_CALLS = 3

_HEADER = string.Template(baseline_templates.HEADER)


def template_parameters(clone_outputs: bool) -> dict[str, str]:
    """The values of a kind template's placeholders (`cudal1.core.baselines.TEMPLATE_PARAMETERS`)."""
    # Without clones `$clone(out)` becomes `(out)`: the same code as a bare `out`, with no extra call.
    return {"clone": "_clone_outputs" if clone_outputs else "", "warmup": str(GRAPH_WARMUP_CALLS),
            "max_graphs": str(MAX_GRAPHS), "max_bound": str(MAX_BOUND_GRAPHS)}


def baseline_source(task: Task, kind: str, sizes: str = "full", *, clone_outputs: bool = True) -> str:
    """The source of a candidate module whose `ModelNew` is the `kind` baseline of `task`.

    Args:
        task: the task whose reference `Model` is wrapped (its source is embedded as a literal).
        kind: a registered kind (`cudal1.core.baselines.baseline_kind_names()`).
        sizes: `full` or `small`; must match the evaluator's resolved sizes, because the wrapper's own copy
            of the reference module gets the same `SMALL_SIZES` overrides as the harness's copy.
        clone_outputs: whether the graph-replaying kinds return clones of their static outputs (default,
            safe for any caller) or the static buffers themselves (CUDA-L1's convention).

    Raises:
        ConfigError: unknown `kind` or `sizes`.
    """
    if sizes not in ("full", "small"):
        raise ConfigError(f"sizes must be 'full' or 'small', not {sizes!r}")
    body = string.Template(baseline_kind(kind).template).substitute(template_parameters(clone_outputs))
    safe_id = task.id.replace('"', "'").replace("\\", "/")
    return _HEADER.substitute(kind=kind, task_id=safe_id, source=repr(task.source),
                              filename=repr(f"<reference {task.id}>"), sizes=repr(sizes)) + body


def eval_profile(kind: str, default: str) -> str:
    """The correctness profile a baseline of `kind` is evaluated under (`default` unless overridden)."""
    return eval_profile_overrides().get(kind, default)


def parse_kinds(text: str | list[str] | tuple[str, ...]) -> list[str]:
    """Comma-separated (or listed) kinds, validated, deduplicated, in the given order; `all` means every kind."""
    items = text.split(",") if isinstance(text, str) else [p for t in text for p in t.split(",")]
    names = [p.strip() for p in items if p.strip()]
    known = baseline_kind_names()
    if names == ["all"]:
        return list(known)
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ConfigError(f"unknown baseline kind(s) {', '.join(unknown)}: choose from {', '.join(known)}")
    return list(dict.fromkeys(names))
