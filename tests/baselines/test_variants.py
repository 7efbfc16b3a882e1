"""Generated baseline candidates: they parse, wrap the reference exactly, and fail clearly where they cannot run."""

from __future__ import annotations

import ast
import types

import pytest
import torch

from cudal1.baselines.variants import baseline_source, eval_profile, parse_kinds, template_parameters
from cudal1.core.baselines import TEMPLATE_PARAMETERS, baseline_kind_names, reported_baseline_names
from cudal1.core.errors import ConfigError
from cudal1.tasks import Task, load_tasks

TINY = '''
import torch
import torch.nn as nn

SCALE = 3.0
DIM = 8
SMALL_SIZES = {"SCALE": 0.5}


class Model(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.lin = nn.Linear(dim, dim)

    def forward(self, x):
        return self.lin(x) * SCALE


def get_inputs():
    return [torch.randn(4, DIM)]


def get_init_inputs():
    return [DIM]
'''


def _module(source: str) -> types.ModuleType:
    module = types.ModuleType("generated_baseline")
    exec(compile(source, "<generated>", "exec"), module.__dict__)  # noqa: S102 - our own generated code
    return module


def test_every_kind_parses_for_every_builtin_task():
    for task in load_tasks("builtin"):
        for kind in baseline_kind_names():
            ast.parse(baseline_source(task, kind))


@pytest.mark.parametrize("sizes, scale", [("full", 3.0), ("small", 0.5)])
def test_eager_wrapper_equals_reference_with_the_harness_sizes(sizes, scale):
    task = Task(id="t/tiny", source=TINY)
    module = _module(baseline_source(task, "eager", sizes))
    ref = task.load(sizes=sizes)
    torch.manual_seed(0)
    model = ref.Model(8)
    torch.manual_seed(0)
    wrapped = module.ModelNew(8)
    x = torch.randn(4, 8)
    assert torch.equal(wrapped(x), model(x))
    assert torch.equal(wrapped(x), model.lin(x) * scale)


def test_source_with_quotes_and_backslashes_round_trips():
    source = TINY.replace("SCALE = 3.0", 'SCALE = 3.0\nNOTE = "a \\"quoted\\" \\\\ path"')
    module = _module(baseline_source(Task(id='t/"odd"\\id', source=source), "eager"))
    assert module._TASK_SOURCE == source


@pytest.mark.parametrize("kind", ["cuda_graph", "cudnn", "tf32"])
def test_cuda_only_kinds_name_the_reason_on_cpu(kind):
    module = _module(baseline_source(Task(id="t/tiny", source=TINY), kind))
    with pytest.raises(RuntimeError, match="needs CUDA tensors"):
        module.ModelNew(8)(torch.randn(4, 8))


def test_tf32_is_evaluated_under_the_loose_profile_only():
    assert eval_profile("tf32", "strict") == "kernelbench-v0"
    assert eval_profile("cuda_graph", "strict") == "strict"


def test_parse_kinds():
    assert parse_kinds("eager, cuda_graph,eager") == ["eager", "cuda_graph"]
    assert parse_kinds("all") == list(baseline_kind_names())
    assert parse_kinds(["eager,cudnn", "tf32"]) == ["eager", "cudnn", "tf32"]
    with pytest.raises(ConfigError, match="nope"):
        parse_kinds("eager,nope")
    with pytest.raises(ConfigError):
        baseline_source(Task(id="t/tiny", source=TINY), "nope")


class _EagerGraph:
    """Stands in for torch.cuda.CUDAGraph on CPU: capture runs the model once, replay counts."""

    def __init__(self):
        self.replays = 0

    def replay(self):
        self.replays += 1

    def capture_begin(self, capture_error_mode="global"):
        assert capture_error_mode == "thread_local"  # the harness's own threads may use CUDA meanwhile

    def capture_end(self):
        pass


def _graph_module_on_cpu(monkeypatch, source: str, clone: bool = True) -> types.ModuleType:
    """The generated CUDA-graph baseline of `source` with graph capture replaced by eager calls (CPU)."""
    import contextlib

    monkeypatch.setattr(torch.cuda, "CUDAGraph", _EagerGraph)
    monkeypatch.setattr(torch.cuda, "graph", lambda g: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "Stream", lambda: types.SimpleNamespace(wait_stream=lambda s: None))
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "current_stream", lambda: types.SimpleNamespace(wait_stream=lambda s: None))
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    module = _module(baseline_source(Task(id="t/tiny", source=source), "cuda_graph", clone_outputs=clone))
    monkeypatch.setattr(module, "_require_cuda", lambda inputs, what: None)
    return module


@pytest.mark.parametrize("clone", [True, False])
def test_cuda_graph_binds_reused_addresses_and_copies_one_off_inputs(monkeypatch, clone):
    # The bookkeeping of the CUDA-graph wrapper, on CPU: graph capture replaced by eager calls.
    module = _graph_module_on_cpu(monkeypatch, TINY, clone)
    model = module.ModelNew(8)

    kept = [torch.randn(4, 8) for _ in range(5)]  # kept alive: five distinct addresses
    for x in kept:  # inputs seen once where they lie: one copying graph, nothing bound
        model(x)
    assert len(model._graphs) == 1 and not model._bound

    # The evaluator's calls: new tensor objects each time, views of a few fixed input slots refilled in place.
    # A slot's address is bound from its second call on, whatever object the call passes.
    slots = torch.empty(2, 4, 8)
    for i in (0, 1, 0, 1, 0):
        slots[i].normal_()
        model(slots[i].view(4, 8))
    assert len(model._bound) == 2 and len(model._graphs) == 1
    assert all(graph.replays == 2 - n for n, (graph, _) in enumerate(model._bound.values()))

    sets = [torch.randn(4, 8) for _ in range(6)]
    for _ in range(3):  # more addresses that come back than bound graphs: the rest keep the copying graph
        outs = [model(x) for x in sets]
    assert len(model._bound) == module_max_bound() and len(model._graphs) == 1
    graph, static_out = next(v for k, v in model._bound.items() if k[1] == (sets[0].data_ptr(),))
    assert graph.replays >= 1
    # Without clones the bound path hands back the graph's own output buffer, as CUDA-L1's variants do.
    assert (outs[0] is static_out) is (not clone)
    # The copying path's outputs are shared by every unbound input set: each call gets its own copy, so two
    # calls' outputs held at once (a bracket of several calls) are not one buffer.
    a, b = model(torch.randn(4, 8)), model(torch.randn(4, 8))
    copying_out = model._graphs[next(iter(model._graphs))][2]
    assert a is not b and a is not copying_out and b is not copying_out

    with pytest.raises(module.CudaGraphCaptureError, match="input signatures"):
        for n in range(2, 8):  # more distinct shapes than MAX_GRAPHS
            model(torch.randn(n, 8))

    # A bound capture that fails (e.g. no memory for one more graph pool) falls back to the copying graph.
    fresh = module.ModelNew(8)

    def no_room(inputs):
        raise torch.cuda.OutOfMemoryError("no room for another graph pool")

    fresh._bind = no_room
    x = torch.randn(4, 8)
    for _ in range(3):
        fresh(x)
    assert not fresh._bound and len(fresh._unbindable) == 1 and len(fresh._graphs) == 1


def module_max_bound() -> int:
    from cudal1.baselines.variants import MAX_BOUND_GRAPHS

    return MAX_BOUND_GRAPHS


STATEFUL = TINY.replace("""        self.lin = nn.Linear(dim, dim)

    def forward(self, x):
        return self.lin(x) * SCALE""", """        self.lin = nn.Linear(dim, dim)
        self.hidden = torch.zeros(4, dim)
        self.register_buffer("steps", torch.zeros(1))
        self.cache = None

    def forward(self, x):
        self.hidden = self.hidden.to(x.device)  # a no-op after the first call
        if self.cache is None:
            self.cache = torch.ones(DIM)  # lazy init: set once
        self.hidden = torch.tanh(self.lin(x) + self.hidden)
        return self.hidden * SCALE + self.cache""")


def test_cuda_graph_refuses_a_forward_that_replaces_its_state(monkeypatch):
    # Level 3's vanilla RNNs keep `self.hidden = tanh(...)`: capture is legal, but every replay would read the
    # captured hidden state, so the baseline must be named illegal with the reason, not measured wrong.
    module = _graph_module_on_cpu(monkeypatch, STATEFUL)
    with pytest.raises(module.CudaGraphCaptureError, match=r"replaces module state on every call \(hidden\)"):
        module.ModelNew(8)(torch.randn(4, 8))
    # The same state kept in a tuple is found too.
    boxed = STATEFUL.replace("self.hidden = torch.tanh(self.lin(x) + self.hidden)",
                             "self.state = (torch.tanh(self.lin(x) + getattr(self, 'state', (self.hidden,))[0]),)")
    module = _graph_module_on_cpu(monkeypatch, boxed.replace("return self.hidden * SCALE", "return self.state[0] * SCALE"))
    with pytest.raises(module.CudaGraphCaptureError, match=r"\(state\)"):
        module.ModelNew(8)(torch.randn(4, 8))
    # Lazy init on the first call, in-place updates of buffers, and state recomputed from the parameters on
    # every call (weight norm's `module.weight = g * v / |v|`, a mask) replay fine.
    for settled in ("self.steps.add_(1)", "self.hidden = torch.tanh(self.lin.weight[:4] * 2)"):
        model = _graph_module_on_cpu(monkeypatch, STATEFUL.replace(
            "self.hidden = torch.tanh(self.lin(x) + self.hidden)", settled)).ModelNew(8)
        model(torch.randn(4, 8))
        assert len(model._graphs) == 1


def test_the_built_in_kinds_in_report_order():
    assert baseline_kind_names() == ("eager", "torch_compile", "torch_compile_reduce_overhead", "cuda_graph",
                                     "cudnn", "tf32")
    assert reported_baseline_names() == baseline_kind_names()[:-1]  # tf32 is an extra


@pytest.mark.parametrize("clone", [True, False])
def test_every_template_placeholder_is_filled(clone):
    assert template_parameters(clone).keys() == TEMPLATE_PARAMETERS.keys()
    for kind in baseline_kind_names():
        source = baseline_source(Task(id="t/tiny", source=TINY), kind, clone_outputs=clone)
        assert "$" not in source.replace(repr(TINY), "")
        body = source.split("def _require_cuda")[1]
        cloned = kind == "cuda_graph" or (clone and kind == "torch_compile_reduce_overhead")  # (its copying path)
        assert ("_clone_outputs(" in body) is cloned
        assert ("return _clone_outputs(bound[1])" in body) is (clone and kind == "cuda_graph")


def test_a_cuda_graph_can_be_bound_to_every_input_slot_of_the_evaluator():
    from cudal1.baselines.variants import MAX_BOUND_GRAPHS
    from cudal1.eval.planes import MAX_SLOTS

    assert MAX_BOUND_GRAPHS >= MAX_SLOTS
