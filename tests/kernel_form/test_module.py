"""The module the evaluator generates for a kernel-form candidate (`module.module_source`) and its `ModelNew`
(`runtime.KernelFormModel`), on the CPU with the launcher's fake driver backend: the module is cudal1's code with
the candidate's text as string constants only (hostile specs cannot inject Python), its weights are the
reference's under the runner's seed, its outputs have the reference's shapes and dtypes, and its launches are
planned as the launcher plans them."""

from __future__ import annotations

import ast
import base64
import copy
import json
from pathlib import Path

import pytest
import torch

from cudal1.kernel_form import runtime
from cudal1.kernel_form.errors import KernelLaunchError
from cudal1.kernel_form.examples import RELU_SPEC, SCALE_ADD_SPEC
from cudal1.kernel_form.launcher import TrustedLauncher
from cudal1.kernel_form.module import MAX_CUBIN_BYTES, TEMPLATE, module_source
from tests.kernel_form.test_launcher import FakeBackend

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
RELU_REF = (FIXTURES / "candidates" / "refs" / "relu.py").read_text()
SCALE_ADD_REF = (FIXTURES / "tasks" / "tiny_scale_add.py").read_text()
CUBIN = b"\x7fELF fake cubin \x00\xff"


def _generate(spec: dict | str, reference: str = RELU_REF, cubin: bytes = CUBIN) -> str:
    text = spec if isinstance(spec, str) else json.dumps(spec, indent=2)
    return module_source(text, cubin, reference_source=reference, task_id="test/relu", sizes="full")


def _shape_of(source: str) -> str:
    """The module's syntax tree with every string constant blanked: what is code, not data."""
    tree = ast.parse(source)
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            node.value = ""
    return ast.dump(tree)


HOSTILE = [
    '"""\nimport os\nos.system("echo pwned")\n"""',
    "'''\n import os\n'''",
    '\\" + __import__("os").getcwd() + \\"',
    "{_SPEC_JSON}\n{cubin}\n\u2028import os\u2029\x0c\r\nexec('1')",
    "\\N{LATIN SMALL LETTER A}\\x00",
]


@pytest.mark.parametrize("planted", HOSTILE)
def test_a_hostile_spec_is_data_in_the_generated_module_never_code(planted):
    spec = copy.deepcopy(RELU_SPEC)
    spec["source"] = planted + spec["source"] + planted
    text = json.dumps(spec) + "\n" + planted  # even text that is not the spec's JSON stays a string
    source = module_source(text, CUBIN, reference_source=RELU_REF + planted, task_id=planted, sizes=planted)
    assert _shape_of(source) == _shape_of(_generate(RELU_SPEC))
    namespace: dict = {}
    exec(compile(ast.parse(source), "<generated>", "exec"), namespace)  # noqa: S102 - the module under test
    assert namespace["_SPEC_JSON"] == text and namespace["_TASK_ID"] == planted and namespace["_SIZES"] == planted
    assert namespace["_REFERENCE_SOURCE"] == RELU_REF + planted
    assert base64.b64decode(namespace["_CUBIN_B64"]) == CUBIN
    assert issubclass(namespace["ModelNew"], runtime.KernelFormModel)


def test_the_generated_module_is_the_template_with_five_constants():
    tree = ast.parse(_generate(RELU_SPEC))
    assigned = [node.targets[0].id for node in tree.body if isinstance(node, ast.Assign)]
    assert assigned == ["_SPEC_JSON", "_CUBIN_B64", "_REFERENCE_SOURCE", "_TASK_ID", "_SIZES"]
    assert TEMPLATE.count("{") == 5  # the five placeholders, nothing else formatted
    with pytest.raises(KernelLaunchError, match="the cubin is 2097153 bytes; the kernel form takes at most"):
        _generate(RELU_SPEC, cubin=b"\0" * (MAX_CUBIN_BYTES + 1))


@pytest.fixture
def fake_launcher(monkeypatch):
    """The generated ModelNew on the CPU: the trusted launcher over the fake driver backend, tensors' real
    addresses; the backend of the last launcher made is kept for the test to read."""
    made: list[FakeBackend] = []

    def launcher(cubin, spec, device_index=0):
        backend = FakeBackend()
        made.append(backend)
        return TrustedLauncher(cubin, spec, backend=backend, tensor_pointer=lambda t: t.data_ptr(),
                               allocate=lambda n: torch.zeros(n, dtype=torch.uint8))

    monkeypatch.setattr(runtime, "TrustedLauncher", launcher)
    monkeypatch.setattr(runtime.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(runtime.torch.cuda, "current_device", lambda: 0)
    return made


def _model_new(spec: dict, reference: str, *init_inputs):
    namespace: dict = {}
    exec(compile(module_source(json.dumps(spec), CUBIN, reference_source=reference, task_id="test/t", sizes="full"),
                 "<generated>", "exec"), namespace)  # noqa: S102
    return namespace["ModelNew"](*init_inputs)


def test_forward_allocates_the_references_outputs_and_plans_the_relu_launch(fake_launcher):
    model = _model_new(RELU_SPEC, RELU_REF)
    x = torch.randn(16, 100)
    y = model(x)
    assert isinstance(y, torch.Tensor) and y.shape == (16, 100) and y.dtype == torch.float32
    launches = [c for c in fake_launcher[-1].calls if c[0] == "launch"]
    assert launches == [("launch", "func:relu", 77, (7, 1, 1), (x.data_ptr(), y.data_ptr(), 1600))]
    assert fake_launcher[-1].calls[0] == ("load", len(CUBIN), ("relu",))


def test_weights_are_the_references_under_the_same_seed_and_sizes_come_from_its_constants(fake_launcher):
    torch.manual_seed(1234)
    model = _model_new(SCALE_ADD_SPEC, SCALE_ADD_REF, 128)  # the runner seeds, then constructs ModelNew(*init)
    torch.manual_seed(1234)
    namespace: dict = {}
    exec(compile(SCALE_ADD_REF, "<ref>", "exec"), namespace)  # noqa: S102 - the test task
    reference = namespace["Model"](128)
    assert torch.equal(model.reference.bias, reference.bias)
    x = torch.randn(64, 128)
    y = model(x)
    (launch,) = [c for c in fake_launcher[-1].calls if c[0] == "launch"]
    bias = model.reference.state_dict()["bias"]
    assert launch[3] == (1, 64, 1)  # grid [ceil_div(DIM, 128), BATCH] from the task's constants
    assert launch[4] == (x.data_ptr(), bias.data_ptr(), y.data_ptr(), 64, 128, 2.0)


TUPLE_REF = RELU_REF.replace("return torch.relu(x)", "return torch.relu(x), x.sum(dim=1, keepdim=True).double()")
VALUE_READ_REF = RELU_REF.replace("return torch.relu(x)", "return torch.relu(x) if float(x.sum()) > -1e30 else x")

TWO_OUT_SPEC = {
    "format": 1,
    "source": RELU_SPEC["source"] + 'extern "C" __global__ void rows(const float* x, double* s, long long n) {}\n',
    "buffers": {"x": {"input": 0}, "y": {"output": 0}, "s": {"output": 1}},
    "steps": [RELU_SPEC["steps"][0], {"kernel": "rows", "grid": "x_dim0", "block": 32,
                                     "args": [{"buf": "x"}, {"buf": "s"}, {"scalar": "x_dim1", "type": "int64"}]}],
}


def test_outputs_follow_the_references_structure_and_dtypes(fake_launcher):
    y, s = _model_new(TWO_OUT_SPEC, TUPLE_REF)(torch.randn(4, 8))
    assert (y.shape, y.dtype, s.shape, s.dtype) == ((4, 8), torch.float32, (4, 1), torch.float64)
    with pytest.raises(KernelLaunchError, match=r"the spec binds 1 output\(s\) but the reference returns 2"):
        _model_new(RELU_SPEC, TUPLE_REF)(torch.randn(4, 8))


def test_a_reference_that_cannot_run_on_meta_tensors_is_run_once_to_learn_its_outputs(fake_launcher, monkeypatch):
    model = _model_new(RELU_SPEC, VALUE_READ_REF)
    calls = []
    real = model.reference.forward
    monkeypatch.setattr(model.reference, "forward", lambda x: calls.append(x.device.type) or real(x))
    for _ in range(3):
        assert model(torch.randn(4, 8)).shape == (4, 8)
    assert calls == ["meta", "cpu"]  # meta failed (a value read), one real run; then the shapes are known
    model(torch.randn(2, 8))
    assert calls == ["meta", "cpu", "meta", "cpu"]  # a new input shape is learnt again


def test_a_weight_the_model_lacks_and_a_non_tensor_buffer_are_named(fake_launcher):
    spec = copy.deepcopy(SCALE_ADD_SPEC)
    spec["buffers"]["bias"] = {"weight": "nope"}
    with pytest.raises(KernelLaunchError, match=r"buffers.bias: the task has no weight 'nope' \(weights: none\)"):
        _model_new(spec, SCALE_ADD_REF, 128)(torch.randn(64, 128))
    spec = copy.deepcopy(RELU_SPEC)
    spec["buffers"]["x"] = {"input": 1}
    two_args = RELU_REF.replace("def forward(self, x: torch.Tensor)", "def forward(self, x: torch.Tensor, n: int)")
    with pytest.raises(KernelLaunchError, match="buffers.x: a int, not a tensor"):
        _model_new(spec, two_args)(torch.randn(4, 8), 3)


def test_without_a_gpu_the_model_says_so():
    namespace: dict = {}
    exec(compile(_generate(RELU_SPEC), "<generated>", "exec"), namespace)  # noqa: S102
    if torch.cuda.is_available():
        pytest.skip("checks the refusal on a machine without a GPU")
    with pytest.raises(KernelLaunchError, match="the kernel form runs its kernels on a CUDA GPU"):
        namespace["ModelNew"]()
