"""The launch spec: the examples parse and match their sources; each kind of bad spec gives one error naming the
field; the task's dimensions."""

from __future__ import annotations

import copy
import importlib.util
import json
from pathlib import Path

import pytest

from cudal1.kernel_form.errors import SpecError
from cudal1.kernel_form.examples import RELU_SPEC, SCALE_ADD_SPEC
from cudal1.kernel_form.spec import (
    Arg,
    Buffer,
    check_against_source,
    check_names,
    parse_spec,
    task_dims,
)

TASKS = Path(__file__).resolve().parents[1] / "fixtures" / "tasks"


def _tiny_task():
    spec = importlib.util.spec_from_file_location("tiny_scale_add", TASKS / "tiny_scale_add.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_examples_parse_and_match_their_sources():
    relu = parse_spec(RELU_SPEC)
    assert relu.buffers == (Buffer("x", "input", 0), Buffer("y", "output", 0))
    assert relu.steps[0].grid == ("ceil_div(x_numel, 256)",) and relu.steps[0].block == (256,)
    assert relu.steps[0].args[2] == Arg("scalar", value="x_numel", type="int64")
    check_against_source(relu)
    scale_add = parse_spec(json.dumps(SCALE_ADD_SPEC))  # the JSON text parses too
    check_against_source(scale_add)
    assert [f for f, _ in scale_add.expressions()] == ["steps[0].grid[0]", "steps[0].grid[1]",
                                                       "steps[0].args[3].scalar", "steps[0].args[4].scalar"]


def test_task_dims_come_from_the_task_constants_and_the_buffer_shapes():
    task = _tiny_task()
    dims = task_dims({"x": (task.BATCH, task.DIM), "bias": (task.DIM,)}, vars(task))
    assert dims == {"BATCH": 64, "DIM": 128, "x_dim0": 64, "x_dim1": 128, "x_numel": 8192, "bias_dim0": 128,
                    "bias_numel": 128}
    check_names(parse_spec(SCALE_ADD_SPEC), set(dims))
    with pytest.raises(SpecError, match=r"^steps\[0\]\.grid\[0\]: 'ceil_div\(x_numel, 256\)': unknown name 'x_numel'"):
        check_names(parse_spec(RELU_SPEC), {"N"})


def _broken(path: str, value, base=RELU_SPEC):
    """A copy of `base` with the field at `path` ("steps.0.grid", "-buffers.y" deletes) set to `value`."""
    spec = copy.deepcopy(base)
    delete = path.startswith("-")
    keys = [int(k) if k.isdigit() else k for k in path.lstrip("-").split(".")]
    node = spec
    for k in keys[:-1]:
        node = node[k]
    if delete:
        del node[keys[-1]]
    else:
        node[keys[-1]] = value
    return spec


BAD = [
    (_broken("format", 2), "format: 2 is not 1"),
    (_broken("-source", None), "source: is missing"),
    (_broken("source", "  "), "source: expected the CUDA C++ source"),
    (_broken("colour", "red"), "colour: unknown field (allowed: format, source, buffers, steps, options, workspaces)"),
    (_broken("options", ["-rdc=true"]), 'options[0]: "-rdc=true" is not an allowed NVRTC option'),
    (_broken("options", ["--gpu-architecture=sm_80"]), "options[0]: "),
    (_broken("options", ["-I/etc"]), "options[0]: "),
    (_broken("buffers", {}), "buffers: expected an object of named buffers"),
    (_broken("buffers.x", {"input": -1}), "buffers.x.input: expected an index >= 0, got -1"),
    (_broken("buffers.x", {"tensor": 0}), 'buffers.x: expected one of {"input": INDEX}'),
    (_broken("buffers.x", {"output": 0}), "buffers.y: binds output 0 like buffers.x"),
    (_broken("buffers.y", {"output": 1}), "buffers: outputs [1] must be numbered 0, 1, ... without gaps"),
    (_broken("buffers.y", {"input": 1}), 'buffers: no output: bind at least {"output": 0}'),
    (_broken("buffers.z", {"output": 1}), "buffers.z: an output that no step passes to a kernel"),
    (_broken("buffers.x", {"weight": "a b"}), "buffers.x.weight: expected a state_dict key"),
    (_broken("workspaces", {"w": {"bytes": 0}}), "workspaces.w.bytes: 0 is below 1"),
    (_broken("workspaces", {"w": {"bytes": "2 ** 40"}}), "workspaces.w.bytes: '2 ** 40': '**' is not allowed"),
    (_broken("workspaces", {"w": {"bytes": 4, "zero": 1}}), "workspaces.w.zero: expected true or false"),
    (_broken("workspaces", {"x": {"bytes": 4}}), "workspaces.x: a buffer has the same name"),
    (_broken("workspaces", {"w": {"size": 4}}), "workspaces.w.size: unknown field (allowed: bytes, zero)"),
    (_broken("steps", []), "steps: expected a list of 1 to 64 steps"),
    (_broken("steps.0.kernel", "relu; rm"), 'steps[0].kernel: "relu; rm" is not an identifier'),
    (_broken("steps.0.grid", [1, 1, 1, 1]), "steps[0].grid: expected 1 to 3 extents, got 4"),
    (_broken("steps.0.grid", [1, 0]), "steps[0].grid[1]: 0 is below 1"),
    (_broken("steps.0.block", "x.shape"), "steps[0].block: 'x.shape': Attribute"),
    (_broken("steps.0.block", 2.5), "steps[0].block: expected an integer or a size expression string, got a number"),
    (_broken("steps.0.dyn_smem", "__import__('os')"), "steps[0].dyn_smem: \"__import__('os')\": calling '__import__'"),
    (_broken("steps.0.cluster", [2]), "steps[0].cluster: unknown field (allowed: kernel, grid, block, args, dyn_smem)"),
    (_broken("-steps.0.args", None), "steps[0].args: is missing"),
    (_broken("steps.0.args.0", {"buf": "q"}), "steps[0].args[0].buf: no buffer 'q' (buffers: x, y)"),
    (_broken("steps.0.args.0", {"workspace": "w"}), "steps[0].args[0].workspace: no workspace 'w' (workspaces: none)"),
    (_broken("steps.0.args.0", {"buf": "x", "scalar": 1}), 'steps[0].args[0]: expected one of {"buf": NAME}'),
    (_broken("steps.0.args.2", {"scalar": 1, "type": "int128"}), 'steps[0].args[2].type: "int128" is not one of'),
    (_broken("steps.0.args.2", {"scalar": 1.5, "type": "int64"}),
     "steps[0].args[2].scalar: a int64 takes an integer or a size expression, got a number"),
    (_broken("steps.0.args.2", {"scalar": "x_numel"}), "steps[0].args[2].type: is missing"),
]


@pytest.mark.parametrize(("data", "message"), BAD, ids=[m.split(":")[0] + str(i) for i, (_, m) in enumerate(BAD)])
def test_each_bad_spec_gives_one_line_naming_the_field(data, message):
    with pytest.raises(SpecError) as info:
        parse_spec(data)
    text = str(info.value)
    assert text.startswith(message), text
    assert "\n" not in text


def test_text_that_is_not_json_is_refused_with_its_position():
    with pytest.raises(SpecError, match="the spec is not JSON: Expecting value at line 1 column 1"):
        parse_spec("not json")
    with pytest.raises(SpecError, match="expected an object, got a list"):
        parse_spec("[]")


SOURCE_MISMATCHES = [
    (_broken("steps.0.kernel", "gelu"), "steps[0].kernel: no extern \"C\" __global__ 'gelu' in the source; defined: "
                                        "relu"),
    (_broken("steps.0.args", [{"buf": "x"}, {"buf": "y"}]),
     "steps[0].args: 2 argument(s) for relu(const float* __restrict__ x, float* __restrict__ y, long long n)"),
    (_broken("steps.0.args.2", {"scalar": "x_numel", "type": "int32"}),
     'steps[0].args[2].type: int32 but the kernel declares 2 ("n", long long)'),
    (_broken("steps.0.args.2", {"buf": "y"}), 'steps[0].args[2]: a buf pointer for the by-value parameter 2 ("n"'),
    (_broken("steps.0.args.0", {"scalar": 0, "type": "int64"}), 'steps[0].args[0]: a scalar for the pointer parameter'),
    (_broken("source", "template <typename T> __global__ void relu(T* x, T* y, long long n) {}"),
     "steps[0].kernel: no extern \"C\" __global__ 'relu' in the source (declare it extern \"C\", not a template)"),
]


@pytest.mark.parametrize(("data", "message"), SOURCE_MISMATCHES)
def test_steps_are_checked_against_the_kernel_signatures(data, message):
    with pytest.raises(SpecError) as info:
        check_against_source(parse_spec(data))
    assert str(info.value).startswith(message), str(info.value)


def test_the_examples_conform_to_the_json_schema_and_structural_mistakes_do_not():
    from cudal1.core.schemas import schema_problems

    assert schema_problems("kernel_form_spec", RELU_SPEC) == []
    assert schema_problems("kernel_form_spec", SCALE_ADD_SPEC) == []
    structural = [_broken("format", 2), _broken("-source", None), _broken("colour", "red"),
                  _broken("options", ["-rdc=true"]), _broken("buffers.x", {"input": -1}),
                  _broken("buffers.x", {"tensor": 0}), _broken("workspaces", {"w": {"bytes": 0}}),
                  _broken("steps", []), _broken("steps.0.grid", [1, 1, 1, 1]), _broken("steps.0.cluster", [2]),
                  _broken("steps.0.args.0", {"buf": "x", "scalar": 1}),
                  _broken("steps.0.args.2", {"scalar": 1, "type": "int128"})]
    for data in structural:
        assert schema_problems("kernel_form_spec", data) != [], data


def test_the_documented_example_is_the_examples_module():
    doc = (Path(__file__).resolve().parents[2] / "docs" / "kernel_form.md").read_text()
    block = doc.split("```json\n", 1)[1].split("```", 1)[0]
    assert json.loads(block) == RELU_SPEC
    assert "**Status: accepted by `cudal1 eval`" in doc and "its GPU run owed" in doc
