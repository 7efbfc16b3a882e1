"""Which form a candidate's text is, from its content: a kernel-form spec (JSON) against a Python module against
JSON that is not a spec."""

from __future__ import annotations

import json

import pytest

from cudal1.core.forms import candidate_form, is_kernel_form
from cudal1.kernel_form.examples import RELU_SPEC

MODULE = "import torch\nimport torch.nn as nn\n\nclass ModelNew(nn.Module):\n    def forward(self, x):\n        return x\n"


@pytest.mark.parametrize(("text", "kernel"), [
    (json.dumps(RELU_SPEC), True),
    (json.dumps(RELU_SPEC, indent=2), True),
    ("\ufeff\n  " + json.dumps(RELU_SPEC) + "\n", True),  # a byte-order mark and blank lines around it
    ('{"format": 2, "steps": []}', True),  # a spec of another version: parse_spec says why
    ('{"steps": [{"kernel": "k"}]}', True),  # format missing: still meant as a spec
    ('{"format": 1, "steps": [', True),  # broken JSON that names the spec's fields: its JSON error is the verdict
    ('{"format": 1, "steps": [], }', True),  # a trailing comma, as LLMs write
    ('{"a": 1}', False),  # JSON, not a spec
    ("[1, 2, 3]", False),
    ('"format"', False),
    ("{broken", False),
    (MODULE, False),
    ('SPEC = {"format": 1, "steps": []}\n' + MODULE, False),  # a module holding a spec-like dict is a module
    ("", False),
])
def test_a_spec_is_told_from_a_module_by_its_content(text, kernel):
    assert is_kernel_form(text) is kernel
    if kernel:
        assert candidate_form(text) == "kernel"


def test_a_specs_cuda_comments_do_not_make_it_another_form():
    spec = dict(RELU_SPEC, source="// not torch.utils.cpp_extension.load_inline nor cudal1.raw_cuda load_kernels\n"
                + RELU_SPEC["source"])
    assert candidate_form(json.dumps(spec)) == "kernel"
    assert candidate_form(MODULE) == "torch"
    assert candidate_form(MODULE + "from torch.utils.cpp_extension import load_inline\n") == "load_inline"
    assert candidate_form(MODULE + "from cudal1.raw_cuda import load_kernels\n") == "raw_cuda"
