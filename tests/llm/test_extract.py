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
