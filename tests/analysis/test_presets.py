"""Presets as data: which rules reject under strict / cuda-l1 / kernelbench-v0, overrides, messages."""

from __future__ import annotations

import pytest

from cudal1.analysis import PRESETS, RULES, analyze_source, rejecting_flags, rejection_message, resolve_preset
from cudal1.core.errors import ConfigError

CHEAT = """
import threading
import torch
import torch.nn as nn

class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.s = torch.cuda.Stream()

    def forward(self, x):
        with torch.cuda.stream(self.s):
            return x.half().float()
"""


def test_every_rule_has_an_action_in_every_preset():
    for name, table in PRESETS.items():
        assert set(RULES) <= set(table), name
        assert set(table.values()) <= {"reject", "flag", "off"}


def test_strict_rejects_cheats_and_downcasts():
    strict = PRESETS["strict"]
    for rule in (
        "extra_cuda_stream",
        "threads_or_processes",
        "timer_patching",
        "global_backend_flags",
        "result_caching",
        "lazy_tensor",
        "input_mutation",
        "size_constants_redefined",
        "tampering",
        "precision_downcast",
        "reads_reference",
    ):
        assert strict[rule] == "reject", rule
    for rule in (
        "exception_fallback",
        "unused_kernel",
        "inner_compile_or_graph",
        "stale_memory",
        "env_or_io",
    ):
        assert strict[rule] == "flag", rule


def test_cuda_l1_and_kernelbench_presets():
    assert {r for r, a in PRESETS["cuda-l1"].items() if a == "reject"} == {
        "extra_cuda_stream",
        "result_caching",
    }
    assert set(PRESETS["kernelbench-v0"].values()) == {"flag"}


def test_rejecting_flags_depend_on_preset():
    report = analyze_source(CHEAT)
    strict = {f.rule for f in rejecting_flags(report, "strict")}
    assert {"threads_or_processes", "extra_cuda_stream", "precision_downcast"} <= strict
    assert {f.rule for f in rejecting_flags(report, "cuda-l1")} == {"extra_cuda_stream"}
    assert rejecting_flags(report, "kernelbench-v0") == []


def test_override_mapping_and_off_rules():
    table = resolve_preset({"base": "strict", "precision_downcast": "flag"})
    assert table["precision_downcast"] == "flag" and table["extra_cuda_stream"] == "reject"
    report = analyze_source(CHEAT, preset={"threads_or_processes": "off"})
    assert report.preset == "custom(base=strict)"
    assert "threads_or_processes" not in {f.rule for f in report.flags}
    assert "threads_or_processes" not in {
        f.rule for f in rejecting_flags(report, {"threads_or_processes": "off"})
    }


@pytest.mark.parametrize("bad", ["nope", {"not_a_rule": "reject"}, {"extra_cuda_stream": "maybe"}])
def test_bad_presets_raise(bad):
    with pytest.raises(ConfigError):
        resolve_preset(bad)


def test_rejection_message_names_rule_evidence_and_line():
    report = analyze_source(CHEAT)
    msg = rejection_message(report)
    assert msg.startswith("threads_or_processes: imports threading") and "(line 2)" in msg
    assert "more)" in msg
    clean = analyze_source(
        "import torch.nn as nn\nclass ModelNew(nn.Module):\n    def forward(self, x):\n        return x + 1\n"
    )
    assert rejection_message(clean) == ""
