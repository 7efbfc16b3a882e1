"""Plain and contrastive prompts: content, scores, sections, restrictions, forms, token budgeting."""

from __future__ import annotations

import pytest

from cudal1.exemplars.db import ScoredCode
from cudal1.llm.prompts import (
    FORM_INSTRUCTIONS,
    RESTRICTIONS,
    SECTION_HEADINGS,
    build_contrastive_prompt,
    build_plain_prompt,
    count_prompt_tokens,
    strip_code_comments,
    truncate_middle,
)

REFERENCE = '''import torch
import torch.nn as nn

# a reference comment that must survive trimming
class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.relu(x)

N = 4096

def get_inputs():
    return [torch.randn(N, N)]

def get_init_inputs():
    return []
'''


def exemplar(tag: str, score: float, body_lines: int = 5) -> ScoredCode:
    body = "\n".join(f"    y{i} = x + {i}  # comment {tag} {i}\n" for i in range(body_lines))
    code = f"# exemplar {tag}\nclass ModelNew:\n    MARK_{tag} = 1\n{body}\n    def forward(self, x):\n        return x\n"
    return ScoredCode(code=code, score=score, meta={"tag": tag})


def user_text(messages) -> str:
    assert [m["role"] for m in messages] == ["system", "user"]
    return messages[1]["content"]


def test_plain_prompt_contains_reference_form_and_output_format():
    text = user_text(build_plain_prompt(REFERENCE, form="raw_cuda", feedback="error: 'foo' undeclared"))
    assert REFERENCE.strip() in text
    assert FORM_INSTRUCTIONS["raw_cuda"] in text and "load_kernels(SOURCE)" in text
    assert "```python" in text and "ModelNew" in text
    assert "Feedback on your previous attempt\nerror: 'foo' undeclared" in text
    assert "Feedback" not in user_text(build_plain_prompt(REFERENCE))
    assert FORM_INSTRUCTIONS["load_inline"] in user_text(build_plain_prompt(REFERENCE))
    with pytest.raises(ValueError, match="form"):
        build_plain_prompt(REFERENCE, form="triton")


def test_contrastive_prompt_shows_codes_with_scores_sections_and_restrictions():
    shown = [exemplar("A", 0.87), exemplar("B", 1.5), exemplar("C", 2.345)]
    text = user_text(build_contrastive_prompt(REFERENCE, shown, token_budget=None))
    assert REFERENCE.strip() in text
    for i, (ex, score) in enumerate(zip(shown, ["0.87x", "1.50x", "2.35x"], strict=True), 1):
        assert ex.code.strip() in text
        assert f"Implementation {i} (speedup {score} over the reference)" in text
    assert text.index("MARK_A") < text.index("MARK_B") < text.index("MARK_C")  # given order is kept
    for heading in SECTION_HEADINGS:
        assert f"\n{heading}\n" in text
    for restriction in RESTRICTIONS:
        assert restriction in text
    lowered = text.lower()
    for phrase in ("same outputs", "compile", "no caching", "hyperparameters", "streams or threads", "fp32"):
        assert phrase in lowered


def test_contrastive_prompt_without_exemplars_and_with_feedback():
    text = user_text(build_contrastive_prompt(REFERENCE, [], form="raw_cuda", feedback="output 0 mismatch"))
    assert "None yet." in text and "output 0 mismatch" in text and FORM_INSTRUCTIONS["raw_cuda"] in text


def test_budget_first_strips_comments():
    shown = [exemplar("A", 1.1, 30), exemplar("B", 1.9, 30)]
    full = build_contrastive_prompt(REFERENCE, shown, token_budget=None)
    no_comments = [ScoredCode(strip_code_comments(e.code), e.score) for e in shown]
    budget = count_prompt_tokens(build_contrastive_prompt(REFERENCE, no_comments, token_budget=None))
    assert count_prompt_tokens(full) > budget
    trimmed = build_contrastive_prompt(REFERENCE, shown, token_budget=budget)
    text = user_text(trimmed)
    assert count_prompt_tokens(trimmed) <= budget
    assert "# comment A" not in text and "MARK_A" in text and "MARK_B" in text and "omitted" not in text
    assert REFERENCE.strip() in text  # the reference's own comment survives


def test_budget_then_truncates_longest_middle():
    shown = [exemplar("A", 1.1, 20), exemplar("B", 1.9, 400)]
    base = count_prompt_tokens(build_contrastive_prompt(REFERENCE, [exemplar("A", 1.1, 20)], token_budget=None))
    budget = base + 700
    trimmed = build_contrastive_prompt(REFERENCE, shown, token_budget=budget)
    text = user_text(trimmed)
    assert count_prompt_tokens(trimmed) <= budget
    assert "lines omitted to fit the prompt" in text
    assert "MARK_B" in text and "return x" in text  # head and tail of B kept
    assert "y5 = x + 5" in text  # A untouched apart from comments
    assert REFERENCE.strip() in text


def test_budget_then_drops_lowest_scored():
    shown = [exemplar("A", 1.1, 60), exemplar("B", 3.0, 60), exemplar("C", 0.5, 60)]
    one = count_prompt_tokens(build_contrastive_prompt(REFERENCE, [], token_budget=None))
    budget = one + 350  # room for one truncated exemplar (>= 200 tokens), not three
    trimmed = build_contrastive_prompt(REFERENCE, shown, token_budget=budget)
    text = user_text(trimmed)
    assert count_prompt_tokens(trimmed) <= budget
    assert "MARK_B" in text and "MARK_C" not in text and "MARK_A" not in text
    assert REFERENCE.strip() in text and all(r in text for r in RESTRICTIONS)


def test_budget_too_small_keeps_reference_and_instructions():
    trimmed = build_contrastive_prompt(REFERENCE, [exemplar("A", 2.0)], token_budget=10)
    text = user_text(trimmed)
    assert REFERENCE.strip() in text and "MARK_A" not in text and SECTION_HEADINGS[2] in text


def test_tokenizer_counts_are_used():
    calls = []

    def count(text: str) -> int:
        calls.append(text)
        return len(text.split())

    msgs = build_contrastive_prompt(REFERENCE, [exemplar("A", 2.0)], token_budget=100000, tokenizer=count)
    assert calls and "MARK_A" in user_text(msgs)


def test_strip_and_truncate_helpers():
    code = 'x = "# not a comment"  # a comment\n\n\n\n# whole line\ns = """\n  // cuda comment\n  int a;\n"""\n'
    stripped = strip_code_comments(code)
    assert '"# not a comment"' in stripped and "a comment" not in stripped.replace("not a comment", "")
    assert "whole line" not in stripped and "cuda comment" not in stripped and "int a;" in stripped
    assert "\n\n\n" not in stripped
    long = "\n".join(f"line {i}" for i in range(100))
    cut = truncate_middle(long, 20, lambda t: len(t.splitlines()))
    assert cut.startswith("line 0\n") and cut.endswith("line 99") and "omitted" in cut
    assert len(cut.splitlines()) < 30


# ----------------------------------------------------------------------------------------------------
# The kernel-only form
# ----------------------------------------------------------------------------------------------------

def test_the_kernel_forms_prompt_describes_the_spec_with_the_relu_example_itself():
    import json

    from cudal1.kernel_form.examples import RELU_SPEC
    from cudal1.llm.prompts import FORMS, KERNEL_FORM, KERNEL_OUTPUT_FORMAT, KERNEL_RESTRICTIONS, resolve_form

    assert "kernel" in FORMS and FORM_INSTRUCTIONS["kernel"] is KERNEL_FORM
    text = user_text(build_plain_prompt(REFERENCE, form="kernel"))
    assert KERNEL_FORM in text and KERNEL_OUTPUT_FORMAT in text and all(r in text for r in KERNEL_RESTRICTIONS)
    for field in ('"format": 1', '"source"', '"options"', '"buffers"', '{"input": i}', '{"output": i}',
                  '{"weight": "KEY"}', '"workspaces"', '"steps"', '"dyn_smem"', '{"scalar": VALUE, "type": T}',
                  "int32 (int)", "int64 (long long)", "float32 (float)", "ceil_div(a, b)", '"b_numel"', '"b_dim0"'):
        assert field in KERNEL_FORM, field
    example = KERNEL_FORM.split("```json\n", 1)[1].split("\n```", 1)[0]
    assert json.loads(example) == RELU_SPEC  # the example is the tested one, not a copy that can drift
    assert "```python code block" not in text and "Name the new module `ModelNew`" not in text
    assert resolve_form("auto", "cuda") == "raw_cuda" and resolve_form("kernel", "cpu") == "kernel"


def test_exemplars_are_fenced_by_their_own_form():
    import json

    from cudal1.kernel_form.examples import RELU_SPEC, SCALE_ADD_SPEC

    spec = ScoredCode(json.dumps(SCALE_ADD_SPEC), 1.7, {})
    text = user_text(build_contrastive_prompt(REFERENCE, [spec, exemplar("A", 1.2)], form="kernel"))
    assert "### Implementation 1 (speedup 1.70x over the reference)\n```json\n{\n  \"format\": 1," in text
    assert '"buffers": {"x": {"input": 0}, "bias": {"weight": "bias"}, "y": {"output": 0}}' in text
    assert "### Implementation 2 (speedup 1.20x over the reference)\n```python\n# exemplar A" in text
    assert "## Code\nFinish with exactly one ```json code block" in text
    shown = text.split("### Implementation 1 (speedup 1.70x over the reference)\n```json\n", 1)[1].split("\n```")[0]
    assert json.loads(shown) == SCALE_ADD_SPEC
    broken = ScoredCode('{"format": 1, "steps": [', 1.1, {})  # not JSON: shown as it is
    assert '```json\n{"format": 1, "steps": [\n```' in user_text(build_contrastive_prompt(REFERENCE, [broken],
                                                                                         form="kernel"))
    assert json.loads(json.dumps(RELU_SPEC)) == RELU_SPEC


def test_a_kernel_form_exemplar_trimmed_to_fit_the_budget_stays_a_valid_spec():
    """Over budget, a spec's CUDA source loses its comments and then its middle (a `//` marker), never the
    JSON around it: the policy is shown a spec it could have written."""
    import json

    from cudal1.kernel_form.examples import RELU_SPEC

    body = "\n".join(f"    float v{i} = x[i] * {i}.0f;  // step {i}" for i in range(400))
    source = RELU_SPEC["source"].rstrip() + "\n// a long helper\n__device__ void helper(const float* x, int i) {\n" \
        + body + "\n}\n"
    spec = {**RELU_SPEC, "source": source}
    long = ScoredCode(json.dumps(spec), 1.5, {})
    text = user_text(build_contrastive_prompt(REFERENCE, [long], form="kernel", token_budget=2500))
    shown = text.split("### Implementation 1 (speedup 1.50x over the reference)\n```json\n", 1)[1].split("\n```")[0]
    trimmed = json.loads(shown)
    assert {k: v for k, v in trimmed.items() if k != "source"} == {k: v for k, v in spec.items() if k != "source"}
    assert "lines omitted to fit the prompt] ..." in trimmed["source"] and "// ..." in trimmed["source"]
    assert "// a long helper" not in trimmed["source"] and "# ..." not in trimmed["source"]
    assert trimmed["source"].startswith(RELU_SPEC["source"].strip().splitlines()[0])


def test_a_spec_nested_past_the_json_parser_is_shown_as_text_not_a_crash():
    """An exemplar that opens like a spec but nests deeper than the JSON parser goes (a policy can write one):
    taken for a malformed spec, fenced as it is, trimmed like code; the prompt is built."""
    deep = '{"format": 1, "steps": ' + "[" * 100_000 + "]" * 100_000 + "}"
    shown = [ScoredCode(code=deep, score=1.2, meta={})]
    assert deep in user_text(build_contrastive_prompt(REFERENCE, shown, token_budget=None))
    assert build_contrastive_prompt(REFERENCE, shown, token_budget=2_000)  # trimmed by lines, not parsed
