"""Adding a baseline kind is one record: once registered, every part of the project sees it (kinds parsed,
modules generated, CPU refusal, report order, published-key audits), and once removed, none does."""

from __future__ import annotations

import dataclasses
import types

import pytest
import torch

from cudal1.audit.summary import audit_entries, tasks_markdown
from cudal1.baselines import runner
from cudal1.baselines.runner import measure_baseline
from cudal1.baselines.variants import baseline_source, eval_profile, parse_kinds
from cudal1.core.baselines import (
    BaselineKind,
    baseline_kind_names,
    published_key_by_baseline,
    register_baseline_kind,
    registered_baseline_kind,
    reported_baseline_names,
    unregister_baseline_kind,
)
from cudal1.core.errors import ConfigError
from cudal1.eval.config import EvalConfig
from cudal1.metrics import ResultRow, audit_published, baselines_present
from cudal1.report.document import Table, build_document
from cudal1.tasks import load_tasks

# The whole of a new kind: its name, its wrapper, and what it means to the reports.
CHANNELS_LAST = BaselineKind(
    name="channels_last",
    template='''

class ModelNew(nn.Module):
    """The reference fed channels-last (NHWC) copies of its 4-d inputs."""

    def __init__(self, *args, **kwargs):
        super().__init__()
        self.model = _Model(*args, **kwargs)

    def forward(self, *inputs):
        return self.model(*[x.contiguous(memory_format=torch.channels_last)
                            if isinstance(x, torch.Tensor) and x.dim() == 4 else x for x in inputs])
''',
    published_key="score_channels_last",  # made up: the release scores no such variant
)


@pytest.fixture
def channels_last():
    with registered_baseline_kind(CHANNELS_LAST) as kind:
        yield kind
    assert "channels_last" not in baseline_kind_names()


def _conv_task():
    return next(t for t in load_tasks("builtin") if t.id == "builtin/level1/conv2d_3x3")


def test_a_registered_kind_is_parsed_and_generated_and_matches_the_reference(channels_last):
    assert parse_kinds("eager,channels_last") == ["eager", "channels_last"]
    assert parse_kinds("all")[-1] == "channels_last"
    assert eval_profile("channels_last", "strict") == "strict"  # no override in its record

    task = _conv_task()
    source = baseline_source(task, "channels_last", "small")
    module = types.ModuleType("generated_baseline")
    exec(compile(source, "<generated>", "exec"), module.__dict__)  # noqa: S102 - our own generated code
    ref = task.load(sizes="small")
    torch.manual_seed(0)
    model = ref.Model(*ref.get_init_inputs())
    torch.manual_seed(0)
    wrapped = module.ModelNew(*ref.get_init_inputs())
    seen = []
    wrapped.model.conv.register_forward_pre_hook(
        lambda m, args: seen.append(args[0].is_contiguous(memory_format=torch.channels_last)))
    torch.manual_seed(1)
    (x,) = ref.get_inputs()
    assert not x.is_contiguous(memory_format=torch.channels_last)
    torch.testing.assert_close(wrapped(x), model(x), rtol=1e-5, atol=1e-5)
    assert seen == [True]


def test_a_registered_cuda_only_kind_is_refused_on_cpu_without_evaluating(monkeypatch):
    def boom(*args, **kwargs):
        raise AssertionError("must not evaluate")

    monkeypatch.setattr(runner, "evaluate_baseline_source", boom)
    with registered_baseline_kind(dataclasses.replace(CHANNELS_LAST, name="channels_last_gpu", cuda_only=True)):
        record = measure_baseline(_conv_task(), "channels_last_gpu", EvalConfig(device="cpu"))
    assert not record.ok and record.reason == "channels_last_gpu needs a CUDA device"


def _rows() -> list[ResultRow]:
    published = {"score_default": 2.0, "score_channels_last": 1.5}
    return [ResultRow(task_id="t/1", speedup=2.0, published=published,
                      baselines={"aaa_other": 1.1, "channels_last": 1.6, "cuda_graph": 1.2}),
            ResultRow(task_id="t/2", speedup=2.0, published=published, baselines={"channels_last": 1.0})]


def test_a_registered_kind_is_ordered_and_audited_by_its_published_key(channels_last):
    assert reported_baseline_names()[-1] == "channels_last"
    assert published_key_by_baseline()["channels_last"] == "score_channels_last"
    # Report order, not the alphabetical order of baselines nobody registered.
    assert baselines_present(_rows()) == ["eager", "cuda_graph", "channels_last", "aaa_other"]

    audit = audit_published(_rows(), baseline="channels_last")
    assert audit.published_key == "score_channels_last" and audit.n_published == 2 and audit.n_survive == 1
    entries = audit_entries(_rows())
    assert [e["survives_vs"]["channels_last"] for e in entries] == [True, False]
    assert "vs channels_last (ours / published)" in tasks_markdown(entries, "T")
    survival = [b for b in build_document(_rows(), title="T", meta={}) if isinstance(b, Table)
                and b.header[:3] == ["Run", "Baseline", "Published key"]][0]
    assert ["channels_last", "score_channels_last"] in [row[1:3] for row in survival.rows]


def test_duplicates_and_bad_records_are_refused(channels_last):
    with pytest.raises(ConfigError, match="'channels_last' is already registered"):
        register_baseline_kind(CHANNELS_LAST)
    with pytest.raises(ConfigError, match="'eager' is already registered"):
        register_baseline_kind(dataclasses.replace(CHANNELS_LAST, name="eager"))
    with pytest.raises(ConfigError, match="built in"):
        unregister_baseline_kind("eager")
    with pytest.raises(ConfigError, match=r"placeholder.*\$clone"):
        BaselineKind("odd", "class ModelNew(_Model):\n    price = '$5'\n")
    with pytest.raises(ConfigError, match="identifier"):
        BaselineKind("all", CHANNELS_LAST.template)


def test_an_unregistered_kind_is_gone_everywhere():
    with registered_baseline_kind(CHANNELS_LAST):
        pass
    assert "channels_last" not in published_key_by_baseline()
    assert baselines_present(_rows()) == ["eager", "cuda_graph", "aaa_other", "channels_last"]
    with pytest.raises(ConfigError, match="channels_last"):
        parse_kinds("channels_last")
    with pytest.raises(ConfigError, match="unknown baseline kind 'channels_last'"):
        baseline_source(_conv_task(), "channels_last")
