"""Extraction of the ModelNew module and the three sections from tricky completions."""

from __future__ import annotations

import ast

from cudal1.llm.extract import extract_completion

CODE = "import torch\n\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n        return x * 2\n"
DRAFT = "class ModelNew:\n    pass  # draft\n"


def test_single_python_block_with_prose_after():
    text = f"Here you go:\n```python\n{CODE}```\nThis doubles the input. Hope it helps!"
    ex = extract_completion(text)
    assert ex.code == CODE and ex.error is None and ex.ok


def test_last_block_defining_modelnew_wins_over_drafts_and_other_blocks():
    text = (f"Draft:\n```python\n{DRAFT}```\nFinal:\n```python\n{CODE}```\n"
            "And the kernel alone:\n```cuda\n__global__ void k() {}\n```\nUsage:\n```python\nm = ModelNew()\n```\n")
    assert extract_completion(text).code == CODE


def test_python_tag_preferred_over_untagged():
    text = f"```python\n{CODE}```\nalso\n```\n{DRAFT}```\n"
    assert extract_completion(text).code == CODE


def test_untagged_fence_and_tilde_fence_accepted():
    assert extract_completion(f"```\n{CODE}```").code == CODE
    assert extract_completion(f"~~~py\n{CODE}~~~\n").code == CODE


def test_missing_closing_fence_in_truncated_completion():
    text = f"## Code\n```python\n{CODE}    # trailing thought that was cut"
    ex = extract_completion(text)
    assert ex.code is not None and "return x * 2" in ex.code and ex.error is None


def test_think_preamble_is_ignored():
    text = f"<think>\nMaybe:\n```python\n{DRAFT}```\nno, better idea\n</think>\n```python\n{CODE}```"
    assert extract_completion(text).code == CODE


def test_code_inside_unclosed_think_is_used_as_last_resort():
    text = f"<think>\nI will write it now\n```python\n{CODE}```\n"
    assert extract_completion(text).code == CODE


def test_raw_completion_without_fence_that_parses():
    ex = extract_completion(CODE)
    assert ex.code == CODE and ast.parse(ex.code)


def test_failures_have_messages():
    assert extract_completion("").error == "the completion is empty"
    assert "defines class ModelNew" in extract_completion("```python\nprint(1)\n```").error
    no_code = extract_completion("I cannot help with that.")
    assert no_code.code is None and "no code block" in no_code.error
    broken = extract_completion("class ModelNew(:\n  oops")
    assert broken.code is None and "does not parse" in broken.error


def test_sections_are_extracted_outside_code():
    text = ("## Performance Analysis\nImpl 2 is faster: fused kernel.\n\n"
            "## Algorithm Design:\nTile in shared memory.\n\n"
            f"## Code\n```python\n# Code\n## Code inside a string is ignored\n{CODE}```\n")
    ex = extract_completion(text)
    assert ex.sections["Performance Analysis"] == "Impl 2 is faster: fused kernel."
    assert ex.sections["Algorithm Design"] == "Tile in shared memory."
    assert ex.sections["Code"].startswith("```python") and ex.code.startswith("# Code\n")
    assert set(ex.sections) == {"Performance Analysis", "Algorithm Design", "Code"}


def test_sections_tolerate_bold_and_other_levels():
    text = "### **Performance Analysis**\nslow\n# algorithm design\nfast\n"
    ex = extract_completion(text)
    assert ex.sections == {"Performance Analysis": "slow", "Algorithm Design": "fast"} and ex.code is None


# ----------------------------------------------------------------------------------------------------
# Kernel-form specs (JSON)
# ----------------------------------------------------------------------------------------------------

def _spec_text() -> str:
    import json

    from cudal1.kernel_form.examples import RELU_SPEC

    return json.dumps(RELU_SPEC, indent=2)


def test_a_json_spec_block_is_extracted():
    import json

    from cudal1.kernel_form.examples import RELU_SPEC

    spec = _spec_text()
    reply = f"## Performance Analysis\nx\n## Code\n```json\n{spec}\n```\n"
    got = extract_completion(reply)
    assert got.ok and json.loads(got.code) == RELU_SPEC and "Performance Analysis" in got.sections
    untagged = extract_completion(f"```\n{spec}\n```")
    assert json.loads(untagged.code) == RELU_SPEC


def test_the_last_json_spec_wins_over_other_json_and_a_python_module_wins_over_a_spec():
    other = '{"shapes": [1, 2]}'
    first = _spec_text().replace('"block": 256', '"block": 128')
    got = extract_completion(f"```json\n{first}\n```\n```json\n{other}\n```\n```json\n{_spec_text()}\n```")
    assert '"block": 256' in got.code
    module = "class ModelNew:\n    pass"
    assert extract_completion(f"```json\n{_spec_text()}\n```\n```python\n{module}\n```").code == module + "\n"


def test_an_unfenced_spec_and_one_inside_prose_are_extracted():
    spec = _spec_text()
    assert extract_completion(spec).code == spec + "\n"
    assert extract_completion(f"Here is the answer: {spec} Hope it helps.").code == spec + "\n"
    assert extract_completion(f"<think>plan</think>\n{spec}").code == spec + "\n"


def test_a_malformed_spec_is_still_extracted_for_the_evaluator_to_name_its_field():
    broken = '{"format": 1, "steps": [{"kernel": "relu",}]}'
    assert extract_completion(f"```json\n{broken}\n```").code == broken + "\n"
    got = extract_completion('```json\n{"shapes": [1, 2]}\n```')
    assert not got.ok and "defines class ModelNew or holds a kernel-form spec" in got.error
