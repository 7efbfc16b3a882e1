"""`reference_reuse`: ModelNew that is the reference under another name (peers' case `class ModelNew(Model):
pass` next to a copied reference got no flag)."""

from __future__ import annotations

import pytest

from cudal1.analysis.static import analyze_source

REF = """import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return torch.relu(x)
"""


@pytest.mark.parametrize("candidate", [
    REF + "\n\nclass ModelNew(Model):\n    pass\n",
    REF.replace("class Model(", "class Base(") + "\n\nclass ModelNew(Base):\n    pass\n",
    REF + "\n\nModelNew = Model\n",
], ids=["inherits", "renamed copy", "re-exported"])
def test_the_reference_under_another_name_is_reuse(candidate):
    rules = [f.rule for f in analyze_source(candidate, reference_source=REF).flags]
    assert rules == ["reference_reuse"]


@pytest.mark.parametrize("candidate", [
    REF + "\n\nclass ModelNew(Model):\n    def forward(self, x):\n        return x.clamp_min(0)\n",
    "import torch.nn as nn\n\n\nclass Base(nn.Module):\n    pass\n\n\nclass ModelNew(Base):\n"
    "    def forward(self, x):\n        return x.clamp_min(0)\n",
], ids=["own forward", "own base"])
def test_an_own_forward_is_not_reuse(candidate):
    assert "reference_reuse" not in [f.rule for f in analyze_source(candidate, reference_source=REF).flags]
