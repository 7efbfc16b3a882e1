"""The trusted launcher: planning and argument marshalling on the CPU (sizes, order, scalar types, limits), the
order of driver calls with a fake backend, and on a GPU the example against torch with event timing."""

from __future__ import annotations

import copy
import ctypes

import pytest
import torch

from cudal1.kernel_form.errors import KernelLaunchError
from cudal1.kernel_form.examples import RELU_SPEC, SCALE_ADD_SPEC
from cudal1.kernel_form.launcher import TrustedLauncher, bind_buffers, plan_launches, workspace_sizes
from cudal1.kernel_form.spec import parse_spec, task_dims

X, BIAS, Y, WS = 0x7000_0000, 0x7100_0000, 0x7200_0000, 0x7300_0000


def test_the_relu_example_plans_one_launch_with_its_arguments_in_order():
    spec = parse_spec(RELU_SPEC)
    (launch,) = plan_launches(spec, {"x_numel": 1000}, {"x": X, "y": Y}, {"x": "float32", "y": "float32"})
    assert (launch.kernel, launch.grid, launch.block, launch.dyn_smem) == ("relu", (4, 1, 1), (256, 1, 1), 0)
    assert [(a.ctype, a.value) for a in launch.cargs] == [("pointer", X), ("pointer", Y), ("int64", 1000)]
    assert launch.arg_layout() == [("pointer", 8), ("pointer", 8), ("int64", 8)]


def test_scalar_types_follow_the_spec_and_the_kernel():
    spec = parse_spec(SCALE_ADD_SPEC)
    dims = task_dims({"x": (64, 128), "bias": (128,), "y": (64, 128)}, {"BATCH": 64, "DIM": 128})
    (launch,) = plan_launches(spec, dims, {"x": X, "bias": BIAS, "y": Y}, dict.fromkeys(("x", "bias", "y"), "float32"))
    assert launch.grid == (1, 64, 1) and launch.block == (128, 1, 1)
    assert [(a.ctype, a.value) for a in launch.cargs] == [
        ("pointer", X), ("pointer", BIAS), ("pointer", Y), ("int32", 64), ("int32", 128), ("float32", 2.0)]
    assert [size for _, size in launch.arg_layout()] == [8, 8, 8, 4, 4, 4]
    assert ctypes.sizeof(ctypes.c_float) == 4


def _relu_with(**step):
    data = copy.deepcopy(RELU_SPEC)
    data["steps"][0].update(step)
    return parse_spec(data)


@pytest.mark.parametrize(("spec", "dims", "dtypes", "message"), [
    (parse_spec(RELU_SPEC), {"x_numel": 10}, {"x": "float16", "y": "float32"},
     "steps[0].args[0]: buffer 'x' holds float16 but the kernel reads float"),
    (_relu_with(block="x_numel"), {"x_numel": 2048}, None, "steps[0].block[0] is 2048; CUDA allows 1 to 1024"),
    (_relu_with(block=[32, 32, 2]), {"x_numel": 1}, None, "steps[0].block (32, 32, 2) has 2048 threads"),
    (_relu_with(grid=[1, "x_numel"]), {"x_numel": 70000}, None, "steps[0].grid[1] is 70000; CUDA allows 0 to 65535"),
    (_relu_with(grid="x_numel - 2"), {"x_numel": 1}, None, "steps[0].grid[0] is -1"),
    (_relu_with(dyn_smem="x_numel"), {"x_numel": 10**6}, None, "steps[0].dyn_smem is 1000000; allowed 0 to"),
    (_relu_with(grid="ceil_div(x_numel, 0)"), {"x_numel": 1}, None, "steps[0].grid[0]: 'ceil_div(x_numel, 0)': "
                                                                   "ceil_div by zero"),
    (_relu_with(grid=1, args=[{"buf": "x"}, {"buf": "y"}, {"scalar": "x_numel * x_numel", "type": "int64"}]),
     {"x_numel": 2**40}, None, "steps[0].args[2].scalar: 'x_numel * x_numel': a value leaves the 64-bit range"),
    (_relu_with(grid="N"), {"x_numel": 1}, None, "steps[0].grid[0]: 'N': unknown name 'N'"),
])
def test_bad_sizes_and_types_are_refused_naming_the_field(spec, dims, dtypes, message):
    with pytest.raises(KernelLaunchError) as info:
        plan_launches(spec, dims, {"x": X, "y": Y}, dtypes or {"x": "float32", "y": "float32"})
    assert str(info.value).startswith(message), str(info.value)


def test_an_integer_scalar_out_of_its_type_is_refused():
    data = copy.deepcopy(SCALE_ADD_SPEC)
    spec = parse_spec(data)
    with pytest.raises(KernelLaunchError, match=r"steps\[0\]\.args\[4\]\.scalar is 4294967296, outside int32"):
        plan_launches(spec, {"BATCH": 1, "DIM": 2**32}, {"x": X, "bias": BIAS, "y": Y},
                      dict.fromkeys(("x", "bias", "y"), "float32"))


def test_a_zero_grid_plans_an_empty_launch():
    (launch,) = plan_launches(parse_spec(RELU_SPEC), {"x_numel": 0}, {"x": X, "y": Y}, {"x": "float32", "y": "float32"})
    assert launch.grid == (0, 1, 1) and launch.empty


def test_buffers_bind_by_role_and_a_missing_one_is_named():
    spec = parse_spec(SCALE_ADD_SPEC)
    x, y, b = torch.zeros(2, 3), torch.zeros(2, 3), torch.zeros(3)
    assert bind_buffers(spec, [x], [y], {"bias": b}) == {"x": x, "bias": b, "y": y}
    with pytest.raises(KernelLaunchError, match="buffers.bias: the task has no weight 'bias' \\(weights: none\\)"):
        bind_buffers(spec, [x], [y])
    with pytest.raises(KernelLaunchError, match="buffers.x: the task has no input 0 \\(inputs: 0\\)"):
        bind_buffers(spec, [], [y], {"bias": b})


class FakeBackend:
    """Records the driver calls in order."""

    def __init__(self):
        self.calls: list[tuple] = []
        self.events = 0

    def load(self, cubin, names):
        self.calls.append(("load", len(cubin), tuple(names)))
        return {n: f"func:{n}" for n in names}

    def create_stream(self):
        return 77

    def allow_dynamic_shared(self, func, nbytes, kernel):
        self.calls.append(("smem", kernel, nbytes))

    def launch(self, func, launch, stream):
        self.calls.append(("launch", func, stream, launch.grid, tuple(a.value for a in launch.cargs)))

    def memset(self, address, nbytes, stream):
        self.calls.append(("memset", address, nbytes, stream))

    def new_event(self):
        self.events += 1
        return self.events

    def record(self, event, stream):
        self.calls.append(("record", event, stream))

    def elapsed_ms(self, start, end):
        return 0.5 * (end - start)

    def synchronize(self):
        self.calls.append(("sync",))


def _fake_launcher(spec):
    backend = FakeBackend()
    addresses = {}  # fake device addresses: X for the first tensor seen, Y for the second

    def pointer(t):
        return addresses.setdefault(id(t), (X, Y)[len(addresses)])

    launcher = TrustedLauncher(b"cubin", spec, backend=backend, tensor_pointer=pointer,
                               allocate=lambda n: torch.zeros(n, dtype=torch.uint8))
    return launcher, backend


def test_the_launcher_runs_the_steps_on_its_own_stream_after_clearing_workspaces():
    data = copy.deepcopy(RELU_SPEC)
    data["workspaces"] = {"scratch": {"bytes": "x_numel * 4", "zero": True}, "keep": {"bytes": 64}}
    data["steps"].append({"kernel": "relu", "grid": 1, "block": 32, "dyn_smem": 64 * 1024,
                          "args": [{"workspace": "scratch"}, {"buf": "y"}, {"scalar": 6, "type": "int64"}]})
    launcher, backend = _fake_launcher(parse_spec(data))
    x, y = torch.randn(2, 3), torch.empty(2, 3)
    buffers = bind_buffers(launcher.spec, [x], [y])
    dims = launcher.dims_for(buffers)
    assert dims == {"x_dim0": 2, "x_dim1": 3, "x_numel": 6, "y_dim0": 2, "y_dim1": 3, "y_numel": 6}
    assert workspace_sizes(launcher.spec, dims, 1024) == {"scratch": 24, "keep": 64}
    call = launcher.prepare(buffers, dims)
    scratch = call.workspaces["scratch"].data_ptr()
    launcher.run(call)
    assert backend.calls == [
        ("load", 5, ("relu",)), ("smem", "relu", 65536), ("sync",), ("memset", scratch, 24, 77),
        ("launch", "func:relu", 77, (1, 1, 1), (X, Y, 6)), ("launch", "func:relu", 77, (1, 1, 1), (scratch, Y, 6)),
        ("sync",)]


def test_timing_brackets_each_rep_with_events_on_the_launcher_stream():
    launcher, backend = _fake_launcher(parse_spec(RELU_SPEC))
    call = launcher.prepare({"x": torch.randn(6), "y": torch.empty(6)}, {"x_numel": 6})
    backend.calls.clear()
    timing = launcher.time(call, reps=2, warmup=1, l2_flush_bytes=128)
    kinds = [c[0] for c in backend.calls]
    assert kinds == ["sync", "launch", "memset", "record", "launch", "record", "memset", "record", "launch", "record",
                     "sync"]
    assert all(c[-1] == 77 for c in backend.calls if c[0] in ("record", "memset"))
    assert timing.times_ms == [0.5, 0.5] and timing.median_ms == 0.5
    with pytest.raises(KernelLaunchError, match="reps=0"):
        launcher.time(call, reps=0)


def test_a_missing_buffer_is_named():
    launcher, _ = _fake_launcher(parse_spec(RELU_SPEC))
    with pytest.raises(KernelLaunchError, match="buffers.y: no tensor was given"):
        launcher.prepare({"x": torch.randn(6)}, {"x_numel": 6})


# ----------------------------------------------------------------------------------------------------
# On a GPU
# ----------------------------------------------------------------------------------------------------

def _gpu_launcher(spec_data):
    from cudal1.kernel_form.build import build_here
    from cudal1.raw_cuda.compiler import device_arch

    spec = parse_spec(spec_data)
    build = build_here(spec, arch=device_arch())
    return TrustedLauncher(build.cubin, spec, device_index=torch.cuda.current_device())


@pytest.mark.gpu
def test_relu_through_the_launcher_matches_torch_and_is_timed():
    launcher = _gpu_launcher(RELU_SPEC)
    x = torch.randn(4096, 1001, device="cuda")
    y = torch.full_like(x, float("nan"))
    buffers = bind_buffers(launcher.spec, [x], [y])
    call = launcher.prepare(buffers, launcher.dims_for(buffers))
    launcher.run(call)
    torch.testing.assert_close(y, torch.relu(x), rtol=0, atol=0)
    timing = launcher.time(call, reps=20, warmup=5)
    assert len(timing.times_ms) == 20 and all(0 < t < 100 for t in timing.times_ms)


@pytest.mark.gpu
def test_scale_add_with_a_weight_matches_torch():
    launcher = _gpu_launcher(SCALE_ADD_SPEC)
    x, bias = torch.randn(64, 128, device="cuda"), torch.randn(128, device="cuda")
    y = torch.empty_like(x)
    buffers = bind_buffers(launcher.spec, [x], [y], {"bias": bias})
    launcher.run(launcher.prepare(buffers, launcher.dims_for(buffers, {"BATCH": 64, "DIM": 128})))
    torch.testing.assert_close(y, 2.0 * x + bias)


def test_enqueue_on_a_callers_stream_makes_no_stream_of_its_own():
    """The evaluator's module queues the steps on torch's current stream: the memsets and launches go there, and
    the launcher creates no stream (it does only when its own run or timing needs one)."""
    data = copy.deepcopy(RELU_SPEC)
    data["workspaces"] = {"scratch": {"bytes": 64, "zero": True}}
    launcher, backend = _fake_launcher(parse_spec(data))
    created = []
    backend.create_stream = lambda: created.append(1) or 77
    call = launcher.prepare({"x": torch.randn(6), "y": torch.empty(6)}, {"x_numel": 6})
    launcher.enqueue(call, stream=1234)
    assert [(c[0], c[-2] if c[0] == "memset" else c[2]) for c in backend.calls[1:]] == [("memset", 64),
                                                                                    ("launch", 1234)]
    assert backend.calls[1][-1] == 1234 and created == []
    launcher.run(call)
    assert created == [1] and backend.calls[-2][2] == 77


def test_a_shape_signature_is_planned_once_and_each_call_gets_its_own_addresses(monkeypatch):
    from cudal1.kernel_form import launcher as module

    launcher = TrustedLauncher(b"cubin", parse_spec(RELU_SPEC), backend=FakeBackend(),
                               tensor_pointer=lambda t: t.data_ptr())
    planned = []
    real = module.plan_launches
    monkeypatch.setattr(module, "plan_launches", lambda *a, **k: planned.append(1) or real(*a, **k))
    calls = []
    for n in (6, 6, 7):
        x, y = torch.randn(n), torch.empty(n)
        calls.append((launcher.prepare({"x": x, "y": y}, {"x_numel": n}), x, y))
    assert len(planned) == 2  # n = 6 twice, then n = 7
    for call, x, y in calls:
        (launch,) = call.launches
        assert [a.value for a in launch.cargs] == [x.data_ptr(), y.data_ptr(), x.numel()]
