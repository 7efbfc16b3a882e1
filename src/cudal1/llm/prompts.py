"""Prompts: the plain one (reference -> faster ModelNew) and CUDA-L1's contrastive one (with scored exemplars).

The contrastive prompt (design section 5) shows the task, the reference code, previous implementations
each with its speedup, asks for three sections with fixed headings (`## Performance Analysis`,
`## Algorithm Design`, `## Code`) and states the restrictions. `form` selects the instructions for
KernelBench `load_inline` candidates, for cudal1's raw-CUDA form, for cudal1's kernel-only form (`kernel`: a
JSON launch spec, no host code; its example is `kernel_form.examples.RELU_SPEC` itself), or for a PyTorch-only
rewrite (`torch`: what can run where candidates are evaluated on a CPU); each form's text lives in one constant
(`FORM_INSTRUCTIONS`; the kernel form's answer format and restrictions in `KERNEL_OUTPUT_FORMAT` and
`KERNEL_RESTRICTIONS`) so it is updated in one place. `resolve_form("auto", device)` picks the form for where
candidates are evaluated (never `kernel`: it is asked for by name). Exemplars are fenced by their own form
(a kernel-form spec as ```json).

Token budgeting: tokens are counted with a tokenizer when one is given (an object with `encode`, or a
callable returning a count), else estimated at ~4 characters per token. Over budget, exemplars are trimmed
in this order: comments and blank-line runs are removed from all exemplar code; then the longest exemplar
has its middle cut (a marker says how many lines went) down to `MIN_EXEMPLAR_TOKENS` (a kernel-form spec in its
CUDA source only, so that it stays a valid spec); if that is not
enough, the lowest-scored exemplar is dropped and trimming restarts from the others. The reference code,
the instructions and the feedback are never trimmed: a prompt without exemplars that is still over budget
is returned as is, with a warning in the log.
"""

from __future__ import annotations

import json
import logging
import math
import re
from collections.abc import Callable, Sequence
from typing import Any

from cudal1.core.forms import is_kernel_form, kernel_spec_data
from cudal1.exemplars.db import ScoredCode, comment_columns
from cudal1.kernel_form.examples import RELU_SPEC

logger = logging.getLogger(__name__)

FORMS = ("load_inline", "raw_cuda", "torch", "kernel")
FORM_CHOICES = ("auto", *FORMS)  # what users may set: auto resolves by the evaluation device
DEFAULT_PROMPT_TOKEN_BUDGET = 16384  # leaves room for an 8k completion in a 32k-context model
MIN_EXEMPLAR_TOKENS = 200  # below this an exemplar is no longer worth showing; drop one instead
CHARS_PER_TOKEN = 4  # rough average for code with English prose (BPE tokenizers)
SECTION_HEADINGS = ("## Performance Analysis", "## Algorithm Design", "## Code")

SYSTEM_MESSAGE = ("You are an expert in CUDA programming and GPU performance optimization. You rewrite "
                  "PyTorch modules with custom CUDA kernels so that they run faster and compute exactly "
                  "the same results.")
TORCH_SYSTEM_MESSAGE = ("You are an expert in PyTorch performance optimization. You rewrite PyTorch modules "
                        "so that they run faster and compute exactly the same results.")

LOAD_INLINE_FORM = """\
Implementation form: KernelBench `load_inline`.
- Write the CUDA kernels and their C++ launcher functions as Python strings and compile them at import
  with `torch.utils.cpp_extension.load_inline(name=..., cpp_sources=..., cuda_sources=..., functions=[...])`.
- The launchers take and return `torch::Tensor`; `ModelNew.forward` calls the compiled functions."""

RAW_CUDA_FORM = """\
Implementation form: cudal1 raw CUDA (compiles in under a second).
- Put the kernels in one Python string of plain CUDA C: every kernel you launch is an `extern "C" __global__`
  function (templates only as `__device__` helpers); include CUDA headers only (no torch, ATen, pybind11
  or other host C++ headers; `<cstdint>`, `<cmath>`, `<cfloat>` and `<climits>` are available). Use CUDA
  math builtins (`fmaxf`, `expf`, ...), not `std::` functions.
- Compile it once at import, at module level:
      from cudal1.raw_cuda import load_kernels
      kernels = load_kernels(SOURCE)
- Launch from `ModelNew.forward` with
      kernels.<name>(grid=(gx, gy, gz), block=(bx, by, bz), args=(tensor, ..., int, float))
  `grid` and `block` are an int or a tuple of 1-3 ints. Tensors are passed as device pointers: they must be
  contiguous and their dtype must match the pointer type (allocate outputs with torch, e.g.
  `torch.empty`); Python ints and floats are converted to the kernel's declared parameter types. Launches
  run on torch's current CUDA stream.
- Do not use `torch.utils.cpp_extension` (`load_inline` takes about a minute per build)."""

TORCH_FORM = """\
Implementation form: PyTorch only (candidates are evaluated on a CPU here, where CUDA kernels cannot run).
- Write `ModelNew` with PyTorch operations: fewer passes over memory, fused or cheaper equivalent operations,
  intermediates updated in place, no redundant copies or allocations.
- Do not compile or load C++ or CUDA code (no `torch.utils.cpp_extension`, no `cudal1.raw_cuda`) and do not
  use `torch.compile`."""

def spec_text(spec: dict[str, Any]) -> str:
    """A kernel-form spec as prompts show it: one top-level field per line, one step per line, compact JSON."""
    def field(key: str, value: Any) -> str:
        if key == "steps" and isinstance(value, list) and value:
            return '  "steps": [\n' + ",\n".join(f"    {json.dumps(s)}" for s in value) + "\n  ]"
        return f"  {json.dumps(key)}: {json.dumps(value)}"

    return "{\n" + ",\n".join(field(k, v) for k, v in spec.items()) + "\n}"


KERNEL_FORM = """\
Implementation form: cudal1 kernel-only: CUDA source plus a launch spec, one JSON object; no Python, no host code.
cudal1 compiles the source with NVRTC and launches the steps you list, in order, on the current CUDA stream. It
allocates the outputs with the shapes and dtypes of Model's outputs; Model's weights are available by their
state_dict key; every tensor is contiguous.
The JSON object's fields:
- "format": 1.
- "source": the CUDA C++ source (a JSON string: escape newlines and quotes). Every kernel you launch is an
  `extern "C" __global__` function (templates only as `__device__` helpers); CUDA headers only (`<cstdint>`,
  `<cmath>`, `<cfloat>`, `<climits>` are available); CUDA math builtins (`fmaxf`, `expf`), no `std::` math.
- "options" (optional): NVRTC options, only --use_fast_math, -maxrregcount=N, --ftz=true|false,
  --prec-div=true|false, --prec-sqrt=true|false, --fmad=true|false, -lineinfo, --extra-device-vectorization,
  -DNAME[=VALUE], -std=c++17 or -std=c++20.
- "buffers": names for the task's tensors: {"input": i} (the i-th argument of forward), {"output": i} (the i-th
  output of forward; numbered 0, 1, ... without gaps, each passed to some step), {"weight": "KEY"} (an entry of
  Model's state_dict, e.g. "linear.weight").
- "workspaces" (optional): scratch memory per call, {"NAME": {"bytes": SIZE, "zero": true}} (zero: cleared
  before the steps).
- "steps": 1 to 64 launches, run in order: {"kernel": NAME, "grid": SIZE or a list of 1-3 SIZEs, "block": SIZE or
  a list of 1-3 SIZEs (at most 1024 threads), "dyn_smem": SIZE (bytes of dynamic shared memory, default 0),
  "args": [...]}, one arg per kernel parameter, in order: {"buf": NAME} or {"workspace": NAME} (a pointer; its
  element type must match the tensor's dtype: float* for float32), or {"scalar": VALUE, "type": T} with T the
  parameter's exact C type: int32 (int), uint32 (unsigned), int64 (long long), uint64, float32 (float),
  float64 (double).
- A SIZE (and an integer scalar's VALUE) is an integer or a string expression over the task's module-level
  integer constants (e.g. "BATCH") and, per buffer b, "b_numel", "b_dim0", "b_dim1", ...: integers, + - * // %,
  parentheses, min(a, b, ...), max(a, b, ...), ceil_div(a, b); nothing else.
Example, a complete answer for a Model whose forward(x) returns torch.relu(x):
```json
{example}
```""".replace("{example}", spec_text(RELU_SPEC))

FORM_INSTRUCTIONS = {"load_inline": LOAD_INLINE_FORM, "raw_cuda": RAW_CUDA_FORM, "torch": TORCH_FORM,
                     "kernel": KERNEL_FORM}


def resolve_form(form: str, device: str) -> str:
    """The candidate form to ask for: `form` itself, or for `auto` the one that runs where candidates are
    evaluated: `torch` on a CPU (`device` "cpu"), `raw_cuda` on a GPU or elsewhere (a pool, a server)."""
    if form != "auto":
        return form
    return "torch" if device.startswith("cpu") else "raw_cuda"  # the kernel form only when asked for by name


def _system(form: str) -> dict[str, str]:
    return {"role": "system", "content": TORCH_SYSTEM_MESSAGE if form == "torch" else SYSTEM_MESSAGE}

RESTRICTIONS = (
    "Identical function: ModelNew must return the same outputs as Model (within floating-point tolerance) "
    "for any valid input, not only for the inputs of get_inputs().",
    "The code must compile and run without errors.",
    "No caching: do not cache or reuse results across calls; every forward call computes its outputs from "
    "its inputs.",
    "Do not change hyperparameters, sizes, get_inputs() or get_init_inputs(); ModelNew takes the same "
    "constructor and forward arguments as Model.",
    "No extra CUDA streams or threads: all work runs on the current CUDA stream.",
    "Keep FP32 precision: no FP16/BF16/TF32 arithmetic and no changes to global precision settings.",
)

OUTPUT_FORMAT = ("Finish with exactly one ```python code block holding the complete new module: all imports, "
                 "the kernel sources and `class ModelNew(nn.Module)` with the same `__init__` and `forward` "
                 "signatures as `Model`. You need not repeat get_inputs()/get_init_inputs(); if you do, keep "
                 "them unchanged.")

KERNEL_RESTRICTIONS = (
    "Identical function: the outputs must equal Model's (within floating-point tolerance) for any valid input, "
    "not only for the inputs of get_inputs().",
    "The source must compile and every step must launch without errors.",
    "No caching: do not keep results in device memory across calls; every call computes its outputs from its "
    "inputs.",
    "Do not write to the inputs or the weights.",
    "No device-side kernel launches and no reads of %globaltimer or %clock.",
    "Keep FP32 precision: no FP16/BF16/TF32 arithmetic.",
)

KERNEL_OUTPUT_FORMAT = ("Finish with exactly one ```json code block holding the complete JSON object (\"format\": 1, "
                        "\"source\", \"buffers\", \"steps\"), and no Python.")

CONTRASTIVE_SECTIONS = f"""\
Answer in exactly three sections with these headings:
{SECTION_HEADINGS[0]}
Compare the previous implementations: which ones are faster and why, what the remaining bottlenecks are,
and which optimization techniques have not been exploited yet.
{SECTION_HEADINGS[1]}
Describe the algorithm of your new implementation and why it should be faster than all of them.
{SECTION_HEADINGS[2]}
{{output_format}}"""

TokenCounter = Callable[[str], int]


def make_token_counter(tokenizer: Any = None) -> TokenCounter:
    """A function text -> token count: the tokenizer's when given, else ceil(len / 4)."""
    if tokenizer is None:
        return lambda text: math.ceil(len(text) / CHARS_PER_TOKEN)
    if hasattr(tokenizer, "encode"):
        def count(text: str) -> int:
            try:
                return len(tokenizer.encode(text, add_special_tokens=False))
            except TypeError:
                return len(tokenizer.encode(text))
        return count
    if callable(tokenizer):
        return lambda text: int(tokenizer(text))
    raise TypeError("tokenizer must have an encode() method or be a callable returning a token count")


def count_prompt_tokens(messages: Sequence[dict[str, str]], tokenizer: Any = None) -> int:
    """Token count of a chat prompt: its contents plus ~4 tokens of role markup per message."""
    counter = make_token_counter(tokenizer)
    return sum(counter(m["content"]) + 4 for m in messages)


def _form_text(form: str) -> str:
    if form not in FORM_INSTRUCTIONS:
        raise ValueError(f"unknown candidate form {form!r}; choose one of {FORMS}")
    return FORM_INSTRUCTIONS[form]


def _restrictions_text(form: str) -> str:
    rules = KERNEL_RESTRICTIONS if form == "kernel" else RESTRICTIONS
    return "Restrictions:\n" + "\n".join(f"{i}. {r}" for i, r in enumerate(rules, 1))


def _output_format(form: str) -> str:
    return KERNEL_OUTPUT_FORMAT if form == "kernel" else OUTPUT_FORMAT


def _what(form: str) -> str:
    """What the answer is: a module named ModelNew, or the kernel form's spec."""
    if form == "kernel":
        return "Answer with CUDA kernels and their launch spec (the kernel-only form below)."
    return "Name the new module `ModelNew`."


def _feedback_text(feedback: str | None) -> str:
    return f"## Feedback on your previous attempt\n{feedback.strip()}" if feedback and feedback.strip() else ""


def _fence(code: str) -> str:
    """A fenced block tagged by the code's form: python, or json for a kernel-form spec (pretty-printed)."""
    if is_kernel_form(code):
        data = kernel_spec_data(code)
        shown = spec_text(data) if data is not None else code.rstrip()
        return f"```json\n{shown}\n```"
    return f"```python\n{code.rstrip()}\n```"


def build_plain_prompt(task_source: str, *, form: str = "load_inline", feedback: str | None = None) -> list[dict]:
    """System + user messages asking for a faster `ModelNew` for the reference module `task_source`."""
    how = "" if form == "torch" else ", using custom CUDA kernels where they help"
    parts = [
        f"Task: write a faster implementation of the PyTorch module below{how}. {_what(form)}",
        "## Reference implementation\n" + _fence(task_source),
        _form_text(form),
        _restrictions_text(form),
        _feedback_text(feedback),
        _output_format(form),
    ]
    return [_system(form), {"role": "user", "content": "\n\n".join(p for p in parts if p)}]


def format_exemplar(index: int, exemplar: ScoredCode) -> str:
    """'### Implementation i (speedup 1.83x over the reference)' and the code block."""
    return f"### Implementation {index} (speedup {exemplar.score:.2f}x over the reference)\n{_fence(exemplar.code)}"


def _contrastive_messages(task_source: str, exemplars: Sequence[ScoredCode], form: str,
                          feedback: str | None) -> list[dict]:
    if exemplars:
        shown = "\n\n".join(format_exemplar(i, e) for i, e in enumerate(exemplars, 1))
        previous = ("## Previous implementations\nEach was measured against the reference (speedup > 1 is "
                    "faster; higher is better):\n\n" + shown)
    else:
        previous = "## Previous implementations\nNone yet."
    parts = [
        "Task: write a new implementation of the PyTorch module below that is faster than the reference and "
        f"than every previous implementation shown with its score. Study what made the faster ones fast. {_what(form)}",
        "## Reference implementation\n" + _fence(task_source),
        previous,
        _form_text(form),
        _restrictions_text(form),
        _feedback_text(feedback),
        CONTRASTIVE_SECTIONS.format(output_format=_output_format(form)),
    ]
    return [_system(form), {"role": "user", "content": "\n\n".join(p for p in parts if p)}]


def build_contrastive_prompt(task_source: str, exemplars: Sequence[ScoredCode], *, form: str = "load_inline",
                             feedback: str | None = None, token_budget: int | None = DEFAULT_PROMPT_TOKEN_BUDGET,
                             tokenizer: Any = None) -> list[dict]:
    """CUDA-L1's contrastive prompt; exemplars are shown in the given order (samplers put the best last).

    `token_budget=None` disables trimming; see the module docstring for how trimming works.
    """
    _form_text(form)
    exemplars = list(exemplars)
    if token_budget is None:
        return _contrastive_messages(task_source, exemplars, form, feedback)
    counter = make_token_counter(tokenizer)

    def size(shown: Sequence[ScoredCode]) -> int:
        return sum(counter(m["content"]) + 4 for m in _contrastive_messages(task_source, shown, form, feedback))

    if size(exemplars) <= token_budget:
        return _contrastive_messages(task_source, exemplars, form, feedback)
    stripped = [ScoredCode(strip_exemplar(e.code), e.score, e.meta) for e in exemplars]
    while stripped:
        fitted = _truncate_to_budget(stripped, size, counter, token_budget)
        if fitted is not None:
            return _contrastive_messages(task_source, fitted, form, feedback)
        lowest = min(range(len(stripped)), key=lambda i: stripped[i].score)
        logger.debug("prompt over budget: dropping exemplar with score %.3f", stripped[lowest].score)
        stripped.pop(lowest)
    messages = _contrastive_messages(task_source, [], form, feedback)
    logger.warning("contrastive prompt needs %d tokens without any exemplar, over the budget of %d",
                   size([]), token_budget)
    return messages


def _truncate_to_budget(exemplars: list[ScoredCode], size: Callable[[Sequence[ScoredCode]], int],
                        counter: TokenCounter, budget: int) -> list[ScoredCode] | None:
    """Cut the middle of the longest exemplar until the prompt fits; None when all are at the minimum."""
    current = list(exemplars)
    while True:
        over = size(current) - budget
        if over <= 0:
            return current
        lengths = [counter(e.code) for e in current]
        longest = max(range(len(current)), key=lambda i: lengths[i])
        target = max(MIN_EXEMPLAR_TOKENS, lengths[longest] - over)
        if lengths[longest] <= MIN_EXEMPLAR_TOKENS:
            return None
        code = truncate_exemplar(current[longest].code, target, counter)
        if code == current[longest].code:
            return None
        current[longest] = ScoredCode(code, current[longest].score, current[longest].meta)


def _trimmable_spec(code: str) -> dict[str, Any] | None:
    """A kernel-form exemplar's spec whose CUDA source (a string) can be trimmed, else None."""
    spec = kernel_spec_data(code)
    return spec if spec is not None and isinstance(spec.get("source"), str) else None


def strip_exemplar(code: str) -> str:
    """An exemplar without comments (`strip_code_comments`); a kernel-form spec stays a valid spec, its CUDA
    source stripped of whole-line `//` comments and blank runs."""
    spec = _trimmable_spec(code)
    if spec is None:
        return strip_code_comments(code)
    lines: list[str] = []
    for line in spec["source"].splitlines():
        line = line.rstrip()
        if _CUDA_LINE_COMMENT.match(line) or (not line and lines and not lines[-1]):
            continue
        lines.append(line)
    return json.dumps({**spec, "source": "\n".join(lines).strip("\n")})


def truncate_exemplar(code: str, target_tokens: int, counter: TokenCounter) -> str:
    """`truncate_middle` of an exemplar; for a kernel-form spec, of its CUDA source only (a `//` marker), so
    that what the prompt shows is still a valid spec."""
    spec = _trimmable_spec(code)
    if spec is None:
        return truncate_middle(code, target_tokens, counter)
    source = spec["source"]
    rest = max(0, counter(code) - counter(source))
    cut = truncate_middle(source, max(1, target_tokens - rest), counter, comment="//")
    return code if cut == source else json.dumps({**spec, "source": cut})


def truncate_middle(code: str, target_tokens: int, counter: TokenCounter, comment: str = "#") -> str:
    """Keep the first and last lines of `code` (about `target_tokens` in all) and replace the middle with a
    marker line (a `comment` of the code's language). Removes at least one line when there is more than one."""
    lines = code.splitlines()
    if len(lines) <= 2:
        return code
    total = max(1, counter(code))
    keep = min(len(lines) - 1, max(2, int(len(lines) * target_tokens / total)))
    head = (keep + 1) // 2
    tail = keep - head
    omitted = len(lines) - keep
    after = lines[len(lines) - tail] if tail else ""
    indent = after[:len(after) - len(after.lstrip())]  # align with the code that follows
    marker = f"{indent}{comment} ... [{omitted} lines omitted to fit the prompt] ..."
    return "\n".join(lines[:head] + [marker] + (lines[len(lines) - tail:] if tail else []))


_CUDA_LINE_COMMENT = re.compile(r"^\s*//")


def strip_code_comments(code: str) -> str:
    """Drop Python `#` comments, whole-line `//` comments (CUDA sources inside strings), trailing whitespace
    and runs of blank lines (collapsed to one blank line)."""
    lines = code.splitlines()
    cuts = comment_columns(code)
    out: list[str] = []
    for i, line in enumerate(lines):
        had_text = bool(line.strip())
        line = (line[:cuts[i]] if i in cuts else line).rstrip()
        if _CUDA_LINE_COMMENT.match(line) or (had_text and not line.strip()):
            continue  # a comment-only line disappears entirely
        if not line.strip() and out and not out[-1].strip():
            continue  # collapse blank runs
        out.append(line)
    return "\n".join(out).strip("\n")
