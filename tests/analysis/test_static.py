"""Each static rule on small positive and negative snippets, plus classification and the report API."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from cudal1.analysis import analyze_source, format_report
from cudal1.analysis.cuda_source import scan_cuda_source, strip_comments_and_strings
from cudal1.core.types import KernelClass, Severity

HEAD = "import torch\nimport torch.nn as nn\n"


def rules_of(src: str, ref: str | None = None) -> set[str]:
    return {f.rule for f in analyze_source(HEAD + textwrap.dedent(src), ref).flags}


def model(forward_body: str, init_body: str = "pass", params: str = "x", prelude: str = "") -> str:
    fwd = textwrap.indent(textwrap.dedent(forward_body).strip(), " " * 8)
    init = textwrap.indent(textwrap.dedent(init_body).strip(), " " * 8)
    return (
        textwrap.dedent(prelude) + "\nclass ModelNew(nn.Module):\n    def __init__(self):\n"
        "        super().__init__()\n" + init + f"\n\n    def forward(self, {params}):\n" + fwd + "\n"
    )


LOAD_INLINE = '''
from torch.utils.cpp_extension import load_inline
cuda_src = r"""
__global__ void k(const float* x, float* y, int n) {{ int i = threadIdx.x; if (i < n) y[i] = x[i]; }}
torch::Tensor run(torch::Tensor x) {{
    auto y = torch::empty_like(x);
    {launch}
    return y;
}}
"""
ext = load_inline(name="e", cpp_sources="torch::Tensor run(torch::Tensor x);", cuda_sources=cuda_src,
                  functions=["run"])
'''


def inline(launch: str = "k<<<1, 256>>>(x.data_ptr<float>(), y.data_ptr<float>(), x.numel());") -> str:
    return LOAD_INLINE.format(launch=launch)


POSITIVE = {
    "extra_cuda_stream": [
        model("with torch.cuda.stream(self.s):\n    return torch.relu(x)", "self.s = torch.cuda.Stream()"),
        inline("cudaStream_t s; cudaStreamCreate(&s); k<<<1, 256, 0, s>>>(nullptr, nullptr, 0);")
        + model("return ext.run(x)"),
        inline("k<<<1, 256, 0, at::cuda::getStreamFromPool()>>>(nullptr, nullptr, 0);")
        + model("return ext.run(x)"),
        inline("k<<<1, 256, 0, cudaStreamPerThread>>>(nullptr, nullptr, 0);") + model("return ext.run(x)"),
        model(
            "return K.k(grid=1, block=1, args=(x,), stream=S)",
            prelude="from cudal1.raw_cuda import load_kernels\nS = torch.cuda.Stream()\n"
            "K = load_kernels('extern \"C\" __global__ void k(float* x) {}')\n",
        ),
    ],
    "threads_or_processes": [
        "import threading\n" + model("return torch.relu(x)"),
        "from concurrent.futures import ThreadPoolExecutor\n" + model("return torch.relu(x)"),
        "import os\n" + model("os.fork()\nreturn x"),
        inline("std::thread t([]{}); t.join(); k<<<1, 1>>>(nullptr, nullptr, 0);")
        + model("return ext.run(x)"),
    ],
    "timer_patching": [
        "torch.cuda.synchronize = lambda: None\n" + model("return x"),
        "import time\ntime.perf_counter = lambda: 0.0\n" + model("return x"),
        "setattr(torch.cuda.Event, 'elapsed_time', lambda s, e: 0.0)\n" + model("return x"),
        "import builtins\nbuiltins.print = None\n" + model("return x"),
    ],
    "global_backend_flags": [
        "torch.backends.cuda.matmul.allow_tf32 = True\n" + model("return x"),
        "torch.set_float32_matmul_precision('high')\n" + model("return x"),
        "torch.set_default_dtype(torch.float16)\n" + model("return x"),
        model("with torch.backends.cudnn.flags(enabled=True, allow_tf32=True):\n    return x"),
    ],
    "algorithm_flags": [
        model("return x", "torch.backends.cudnn.benchmark = True"),
        model("return x", "torch.backends.cudnn.deterministic = False"),
        "torch.set_num_threads(1)\n" + model("return x"),
        "torch.use_deterministic_algorithms(True)\n" + model("return x"),
        model("with torch.backends.cudnn.flags(enabled=True, benchmark=True, allow_tf32=False):\n    return x"),
    ],
    "precision_downcast": [
        model("return (x.half() * 2).float()"),
        model("return x.to(torch.bfloat16).float()"),
        model("with torch.autocast('cuda'):\n    return x @ x"),
        model("return torch.zeros(3, dtype=torch.float16)"),
        inline("__half h = __float2half(1.0f); k<<<1, 1>>>(nullptr, nullptr, 0);")
        + model("return ext.run(x)"),
        inline("cublasSetMathMode(h, CUBLAS_TF32_TENSOR_OP_MATH); k<<<1, 1>>>(0, 0, 0);")
        + model("return ext.run(x)"),
    ],
    "result_caching": [
        model("if self.out is None:\n    self.out = torch.relu(x)\nreturn self.out", "self.out = None"),
        model(
            "k = x.data_ptr()\nif k in self.c:\n    return self.c[k]\nself.c[k] = torch.relu(x)\n"
            "return self.c[k]",
            "self.c = {}",
        ),
        "import functools\n"
        + model(
            "return f(x)",
            prelude="import functools\n@functools.lru_cache(None)\ndef f(x):\n    return torch.relu(x)\n",
        ),
        model("global _LAST\n_LAST = torch.relu(x)\nreturn _LAST", prelude="_LAST = None\n"),
    ],
    "exception_fallback": [
        inline() + model("try:\n    return ext.run(x)\nexcept Exception:\n    return torch.relu(x)"),
        model("try:\n    y = torch.relu(x)\nexcept:\n    pass\nreturn y"),
    ],
    "unbuildable_extension": [
        inline().replace('cpp_sources="torch::Tensor run(torch::Tensor x);"', 'cpp_sources=""')
        + model("return ext.run(x)"),
        "CPP = ''\n" + inline().replace('cpp_sources="torch::Tensor run(torch::Tensor x);"', "cpp_sources=CPP")
        + model("return ext.run(x)"),
    ],
    "unused_kernel": [
        inline() + model("return torch.relu(x)"),
    ],
    "inner_compile_or_graph": [
        model("return self.f(x)", "self.f = torch.compile(torch.relu)"),
        model("return x", "self.g = torch.cuda.CUDAGraph()"),
        model("return torch.jit.script(torch.relu)(x)"),
    ],
    "lazy_tensor": [
        "class T(torch.Tensor):\n    pass\n" + model("return x.as_subclass(T)"),
        model("return Box(x)", prelude="class Box:\n    def __init__(self, t):\n        self.t = t\n"),
    ],
    "input_mutation": [
        model("x.add_(1)\nreturn x"),
        model("x[0] = 0\nreturn x * 2"),
        model("torch.relu(x, out=x)\nreturn x"),
        model("y = x.view(-1)\ny.mul_(2)\nreturn y"),
        model("x += 1\nreturn x"),
        model("x.copy_(x * 2)\nreturn x"),
    ],
    "stale_memory": [
        model("out = torch.empty_like(x)\nreturn out"),
        model("return torch.empty(x.shape, device=x.device)"),
    ],
    "constant_output": [
        model("return torch.zeros_like(x)"),
        model("out = torch.zeros(4)\nreturn out"),
    ],
    "reads_reference": [
        model("return self.ref(x)", "self.ref = Model()"),
        model("return x", "self.inputs = get_inputs()"),
        "from __main__ import Model\n" + model("return x"),
    ],
    "env_or_io": [
        "import os\nos.environ['TORCH_CUDA_ARCH_LIST'] = '9.0'\n" + model("return x"),
        "import socket\n" + model("return x"),
        model("open('/tmp/log', 'w').write('x')\nreturn x"),
        "import ctypes\n" + model("return x"),
    ],
    "tampering": [
        "import sys\n" + model("return sys.modules['__main__'].ref_out"),
        "import inspect\n" + model("return inspect.currentframe().f_back.f_locals['out']"),
        "import gc\n" + model("return [o for o in gc.get_objects()][0]"),
        model("return eval('x')"),
    ],
}

NEGATIVE = {
    "extra_cuda_stream": [
        model("with torch.no_grad():\n    return torch.relu(x)"),
        model("s = torch.cuda.current_stream()\nreturn torch.relu(x)"),
        inline("k<<<1, 256, 0, at::cuda::getCurrentCUDAStream()>>>(nullptr, nullptr, 0);")
        + model("return ext.run(x)"),
        inline("cudaStream_t st = at::cuda::getCurrentCUDAStream(); k<<<1, 256, 0, st>>>(0, 0, 0);")
        + model("return ext.run(x)"),
        inline("k<<<1, 256, 0, 0>>>(0, 0, 0); // cudaStreamCreate in a comment") + model("return ext.run(x)"),
    ],
    "threads_or_processes": [model("return torch.relu(x)")],
    "timer_patching": [model("return x", "self.weight = nn.Parameter(torch.ones(3))\nself.t = 1.0")],
    "global_backend_flags": [model("return x", "self.benchmark = True"),
                             model("return x", "torch.backends.cudnn.benchmark = True")],
    "algorithm_flags": [model("return x", "torch.backends.cuda.matmul.allow_tf32 = True")],
    "precision_downcast": [model("return x.float() * 2"), model("return x.to(torch.float32)")],
    "result_caching": [
        model(
            "return torch.nn.functional.linear(x, self.weight)",
            "self.weight = nn.Parameter(torch.ones(3, 3))",
        ),
        model("if self.calls == 0:\n    self.calls = 1\nreturn torch.relu(x)", "self.calls = 0"),
        model("self.last_shape = x.shape\nreturn torch.relu(x)"),
    ],
    "exception_fallback": [inline() + model("return ext.run(x)")],
    "unused_kernel": [inline() + model("return ext.run(x)")],
    "unbuildable_extension": [
        inline() + model("return ext.run(x)"),  # declared in cpp_sources
        inline().replace('cpp_sources="torch::Tensor run(torch::Tensor x);"', 'cpp_sources=decls()')
        + model("return ext.run(x)"),  # computed: the compiler decides
        inline().replace(',\n                  functions=["run"]', "").replace(
            'cpp_sources="torch::Tensor run(torch::Tensor x);"', 'cpp_sources=""')
        + model("return ext.run(x)"),  # no functions=: nothing generated to bind
        "CPP = ''\nCPP += 'torch::Tensor run(torch::Tensor x);'\n"
        + inline().replace('cpp_sources="torch::Tensor run(torch::Tensor x);"', "cpp_sources=CPP")
        + model("return ext.run(x)"),  # filled in later
        "CPP = []\nCPP.append('torch::Tensor run(torch::Tensor x);')\n"
        + inline().replace('cpp_sources="torch::Tensor run(torch::Tensor x);"', "cpp_sources=CPP")
        + model("return ext.run(x)"),
        "CPP = ''\ndef build(CPP='torch::Tensor run(torch::Tensor x);'):\n    return CPP\n"
        + inline().replace('cpp_sources="torch::Tensor run(torch::Tensor x);"', "cpp_sources=CPP")
        + model("return ext.run(x)"),  # shadowed by a parameter somewhere: not certain
    ],
    "inner_compile_or_graph": [model("return torch.relu(x)")],
    "lazy_tensor": [
        model("return torch.relu(x)"),
        model(
            "return Helper.go(x)",
            prelude="class Helper:\n    @staticmethod\n    def go(x):\n        return x\n",
        ),
    ],
    "input_mutation": [
        model("y = x.clone()\ny.add_(1)\nreturn y"),
        model("x = x * 2\nx.add_(1)\nreturn x"),
        model("out = torch.empty_like(x)\ntorch.add(x, 1, out=out)\nreturn out"),
        model("x.requires_grad_(False)\nreturn x + 1"),
    ],
    "stale_memory": [model("out = torch.zeros_like(x)\nout.add_(x)\nreturn out")],
    "constant_output": [model("out = torch.zeros_like(x)\ntorch.add(out, x, out=out)\nreturn out")],
    "reads_reference": [
        "class Model(nn.Module):\n    pass\n" + model("return x", "self.m = Model()"),
    ],
    "env_or_io": [model("return x")],
    "tampering": [
        model("return x", "self.eval()"),
        model("return self.compile_flag", "self.compile_flag = 1"),
    ],
}


@pytest.mark.parametrize("rule,src", [(r, s) for r, srcs in POSITIVE.items() for s in srcs])
def test_rule_fires(rule, src):
    assert rule in rules_of(src), format_report(analyze_source(HEAD + src))


@pytest.mark.parametrize("rule,src", [(r, s) for r, srcs in NEGATIVE.items() for s in srcs])
def test_rule_quiet_on_honest_code(rule, src):
    assert rule not in rules_of(src), format_report(analyze_source(HEAD + src))


def test_flags_carry_python_line_numbers():
    src = HEAD + "\n\ntorch.backends.cuda.matmul.allow_tf32 = True\n" + model("return x")
    flags = [f for f in analyze_source(src).flags if f.rule == "global_backend_flags"]
    assert [f.line for f in flags] == [5]
    assert flags[0].source == "static" and flags[0].severity is Severity.ERROR


def test_cuda_flag_line_maps_into_python_file():
    src = (
        HEAD
        + inline("cudaStream_t s; cudaStreamCreate(&s); k<<<1, 1, 0, s>>>(0, 0, 0);")
        + model("return ext.run(x)")
    )
    lines = src.splitlines()
    flags = [f for f in analyze_source(src).flags if f.rule == "extra_cuda_stream"]
    assert flags and all("cudaStreamCreate" in lines[f.line - 1] for f in flags)


def _size_flags(src: str, ref: str) -> list[str]:
    return [f.rule for f in analyze_source(HEAD + src, ref).flags if f.rule.startswith("size_constants")]


def test_size_constants_compared_by_value_with_the_reference():
    ref = "N = 1024\nD = 4\ndef get_inputs():\n    return [N]\ndef get_init_inputs():\n    return []\n"
    assert _size_flags("N = 1024\n" + model("return x * N"), ref) == []
    assert _size_flags("N = 2 ** 10\nD = 2 * 2\n" + model("return x * N * D"), ref) == []  # equal values
    assert _size_flags("N = 16\n" + model("return x * N"), ref) == ["size_constants_redefined"]  # changed, used
    assert _size_flags("N = 16\n" + model("return x"), ref) == ["size_constants_ignored"]  # changed, not used
    used_through_helper = "N = 16\ndef helper(x):\n    return x[:N]\n" + model("return helper(x)")
    assert _size_flags(used_through_helper, ref) == ["size_constants_redefined"]
    assert _size_flags("N = int('16')\n" + model("return x * N"), ref) == ["size_constants_ignored"]  # run time


def test_own_get_inputs_is_never_a_rejection_the_harness_uses_the_references():
    ref = "N = 1024\ndef get_inputs():\n    return [N]\ndef get_init_inputs():\n    return []\n"
    assert _size_flags(model("return x") + "def get_inputs():\n    return [2]\n", ref) == ["size_constants_ignored"]
    identical = model("return x") + "def get_inputs():\n    \"\"\"doc\"\"\"\n    return [N]\n"
    assert _size_flags(identical, ref) == []



def test_get_inputs_without_reference_is_descriptive_only():
    flags = analyze_source(HEAD + model("return x") + "def get_inputs():\n    return []\n").flags
    hit = [f for f in flags if f.rule.startswith("size_constants")]
    assert [f.rule for f in hit] == ["size_constants_ignored"] and hit[0].severity is Severity.INFO


def test_downcast_quiet_when_reference_is_half():
    ref = "import torch\ndef get_inputs():\n    return [torch.randn(4, dtype=torch.float16)]\n"
    assert "precision_downcast" not in rules_of(model("return x.half()"), ref)


def test_classification():
    assert (
        analyze_source(HEAD + inline() + model("return ext.run(x)")).kernel_class is KernelClass.CUSTOM_CUDA
    )
    assert (
        analyze_source(HEAD + inline() + model("return torch.relu(x)")).kernel_class
        is KernelClass.PYTORCH_ONLY
    )
    fallback = inline() + model("try:\n    return ext.run(x)\nexcept Exception:\n    return torch.relu(x)")
    assert analyze_source(HEAD + fallback).kernel_class is KernelClass.PYTORCH_ONLY
    flags_only = "torch.backends.cudnn.benchmark = True\n" + model("return torch.relu(x)")
    assert analyze_source(HEAD + flags_only).kernel_class is KernelClass.FLAGS_ONLY
    via_attr = inline() + model("return self.op(x)", "self.op = ext.run")
    report = analyze_source(HEAD + via_attr)
    assert report.kernel_class is KernelClass.CUSTOM_CUDA and report.kernels_launched == ["k"]


def test_triton_and_decoy_triton():
    prelude = (
        "import triton\nimport triton.language as tl\n@triton.jit\ndef kern(x_ptr, n):\n    pass\n"
        "@triton.jit\ndef unused(x_ptr):\n    pass\n"
    )
    report = analyze_source(HEAD + model("kern[(1,)](x, 1)\nreturn x", prelude=prelude))
    assert report.kernel_class is KernelClass.TRITON
    assert report.triton_kernels_launched == ["kern"]
    assert any(f.rule == "unused_kernel" and "unused" in f.message for f in report.flags)


def test_comments_and_strings_are_not_code():
    src = HEAD + '"""We never use torch.cuda.Stream here."""\n# import threading\n' + model("return x")
    assert not {"extra_cuda_stream", "threads_or_processes"} & rules_of(src)
    cleaned = strip_comments_and_strings('a = "__global__ x"; // __global__ y\n/* <<< */ b;')
    assert "__global__" not in cleaned and "<<<" not in cleaned and cleaned.count("\n") == 1


def test_cuda_scanner_finds_templates_launch_bounds_and_pybind():
    info = scan_cuda_source(
        textwrap.dedent("""
        template <typename T> __global__ void __launch_bounds__(256) tk(T* x) {}
        extern "C" __global__ void ck(float* x) {}
        void host(torch::Tensor x) {
            AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "h",
                ([&] { tk<scalar_t><<<1, 2, 0, stream>>>(nullptr); }));
        }
        PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def("py_host", &host, "doc"); }
    """)
    )
    assert set(info.kernels) == {"tk", "ck"}
    assert [(launch.kernel, launch.stream_arg, launch.host_function) for launch in info.launches] == [
        ("tk", "stream", "host")
    ]
    assert info.pybind_exports == {"py_host": "host"}
    assert info.kernels_reachable_from({"host"}) == {"tk"}


def test_never_executes_the_candidate(tmp_path):
    marker = tmp_path / "ran"
    src = f"import sys\nopen({str(marker)!r}, 'w').write('x')\nraise SystemExit(3)\n" + model("return x")
    report = analyze_source(HEAD + src)
    assert not marker.exists()
    assert report.kernel_class is KernelClass.PYTORCH_ONLY


def test_syntax_error_is_one_flag():
    report = analyze_source("class ModelNew(:\n")
    assert [f.rule for f in report.flags] == ["syntax_error"] and report.flags[0].line == 1


def test_report_to_dict_and_format():
    report = analyze_source(HEAD + "import threading\n" + inline() + model("return ext.run(x)"))
    d = report.to_dict()
    assert d["kernel_class"] == "custom_cuda" and d["kernels_launched"] == ["k"] and d["preset"] == "strict"
    assert any(f["rule"] == "threads_or_processes" and f["line"] == 3 for f in d["flags"])
    text = format_report(report)
    assert "ERROR threads_or_processes (line 3): imports threading" in text and "[rejects]" in text
    assert type(report).from_dict(d) == report


def test_docstrings_mentioning_cuda_are_not_cuda_sources():
    doc = '"""Uses an `extern "C" __global__ void fake(int x)` kernel and cudaStreamCreate."""\n'
    src = HEAD + doc + model("return x")
    report = analyze_source(src)
    assert report.kernels_defined == [] and not report.flags


_SIDE = '''
class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.side = torch.cuda.Stream()

    def forward(self, x):
        y = torch.empty_like(x)
        with torch.cuda.stream(self.side):
            y.copy_(x * 2)
        {join}
        return y
'''


@pytest.mark.parametrize(("join", "joined"), [
    ("torch.cuda.current_stream().wait_stream(self.side)", True),
    ("done = self.side.record_event()\n        torch.cuda.current_stream().wait_event(done)", True),
    ("pass", False),  # never joined
    ("if x.numel() > 4:\n            torch.cuda.current_stream().wait_stream(self.side)", False),  # one branch only
    ("current = torch.cuda.current_stream()\n        current.wait_stream(self.side)", True),  # a name for it
    ("current = torch.cuda.default_stream()\n        current.wait_stream(self.side)", False),
    ("torch.cuda.default_stream().wait_stream(self.side)", False),  # another stream waits, not the current one
    ("other = torch.cuda.Stream()\n        other.wait_stream(self.side)", False),
])
def test_a_side_stream_joined_before_return_is_legitimate(join, joined):
    rules = rules_of(_SIDE.format(join=join))
    if joined:
        assert "joined_cuda_stream" in rules and "extra_cuda_stream" not in rules
    else:
        assert "extra_cuda_stream" in rules


FIXTURES_REDTEAM = Path(__file__).resolve().parents[1] / "fixtures" / "redteam"


def test_a_side_stream_that_first_waits_for_the_current_one_and_is_joined_is_legitimate():
    """The common pattern (SOL-ExecBench's examples): the side stream waits for the inputs, the current
    stream waits for the side stream's work before returning."""
    src = (FIXTURES_REDTEAM / "honest_joined_stream.py").read_text()
    rules = rules_of(src)
    assert "joined_cuda_stream" in rules and "extra_cuda_stream" not in rules, rules


def test_a_join_after_an_early_return_does_not_count():
    src = _SIDE.format(join="if x.sum() > 0:\n            return y\n        torch.cuda.current_stream().wait_stream(self.side)")
    assert "extra_cuda_stream" in rules_of(src)


@pytest.mark.parametrize("join", [
    # an alias carries the stream past its join
    "alias = self.side\n        torch.cuda.current_stream().wait_stream(self.side)\n"
    "        with torch.cuda.stream(alias):\n            y.add_(1)",
    # work entered on a stream the check does not know
    "torch.cuda.current_stream().wait_stream(self.side)\n        with torch.cuda.stream(self.streams[0]):\n"
    "            y.add_(1)",
    # the stream handed to a helper
    "torch.cuda.current_stream().wait_stream(self.side)\n        launch(y, self.side)",
])
def test_a_join_the_check_cannot_follow_stays_rejected(join):
    assert "extra_cuda_stream" in rules_of(_SIDE.format(join=join))
