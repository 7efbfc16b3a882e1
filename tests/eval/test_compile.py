"""Tests of the compile service (cudal1.eval.compile) and its build hooks and child (cudal1.eval.inside.build_hooks, build_child).

CPU only, except one `gpu` test. The compiler-log fixtures are real g++/nvcc output captured by
fixtures/compile_logs/generate_fixtures.py. The `slow` test (a real C++ build, ~30-60 s on 2 cores) is
deselected by default; run it with `-m slow`.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from cudal1.core.errors import ConfigError
from cudal1.eval import compile as compile_mod
from cudal1.eval.compile import (
    BUILD_ENTRY,
    BuildLevers,
    CompileConfig,
    CompileService,
    build_candidates,
    build_environment,
    build_key,
)
from cudal1.eval.inside.build_hooks import (
    duplicate_module_log,
    install_build_hooks,
    light_cuda_sources,
    unbound_functions,
)
from cudal1.eval.isolated import Limits, run_isolated
from cudal1.eval.shared.compile_log import build_failure_message, trim_compiler_log

FIXTURES = Path(__file__).parent / "fixtures" / "compile_logs"
needs_gxx = pytest.mark.skipif(shutil.which("c++") is None, reason="needs a C++ compiler")

PURE_PYTORCH = """
import torch
import torch.nn as nn

class ModelNew(nn.Module):
    def __init__(self, scale=2.0):
        super().__init__()
        self.scale = scale

    def forward(self, x):
        return torch.relu(x) * self.scale
"""

IMPORT_RAISES = """
import torch
raise ValueError("boom at import\\nsecond line")
"""

# Fails in well under a second: no torch headers to parse (no_implicit_headers), real g++ error via ninja.
CPP_SYNTAX_ERROR_FAST = """
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp = "int add_one(int x) {\\n    return x + 1\\n}\\n"
try:
    ext = load_inline(name="bad_add_one", cpp_sources=cpp, no_implicit_headers=True, verbose=True)
except Exception as exc:  # candidates often fall back to PyTorch
    print("falling back:", exc)
    ext = None

class ModelNew(nn.Module):
    def forward(self, x):
        return x + 1
"""

CPP_OK = """
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cpp = "torch::Tensor add_one(torch::Tensor x) { return x + 1; }"

class ModelNew(nn.Module):
    def __init__(self, k):
        super().__init__()
        self.ext = load_inline(name="ok_add_one", cpp_sources=cpp, functions=["add_one"])
        self.k = k

    def forward(self, x):
        return self.ext.add_one(x)
"""




@pytest.fixture(autouse=True)
def _no_remembered_compile_errors():
    """Each test starts like a new process (the service remembers compile errors per process)."""
    compile_mod.forget_compile_errors()
    yield
    compile_mod.forget_compile_errors()


# --------------------------------------------------------------------------- build_key / environment


def test_build_key_is_stable_and_sensitive(monkeypatch):
    monkeypatch.setattr(compile_mod, "nvcc_version", lambda: "Build cuda_13.0.test")
    key = build_key("src", arch="9.0", extra={"a": 1, "b": [1, 2]})
    assert key == build_key("src", arch="9.0", extra={"b": [1, 2], "a": 1})  # dict order does not matter
    assert len(key) == 64 and int(key, 16) >= 0
    others = {
        build_key("src ", arch="9.0", extra={"a": 1, "b": [1, 2]}),
        build_key("src", arch="8.0", extra={"a": 1, "b": [1, 2]}),
        build_key("src", arch="9.0", extra={"a": 2, "b": [1, 2]}),
    }
    monkeypatch.setattr(compile_mod, "nvcc_version", lambda: "Build cuda_12.8.test")
    others.add(build_key("src", arch="9.0", extra={"a": 1, "b": [1, 2]}))
    monkeypatch.setattr(compile_mod, "BUILD_PROTOCOL_VERSION", "999")
    monkeypatch.setattr(compile_mod, "nvcc_version", lambda: "Build cuda_13.0.test")
    others.add(build_key("src", arch="9.0", extra={"a": 1, "b": [1, 2]}))
    assert key not in others and len(others) == 5


def test_build_environment_points_torch_at_the_key_directory(tmp_path):
    env = build_environment("abc123", "9.0", cache_dir=tmp_path, max_jobs=3)
    assert env["TORCH_EXTENSIONS_DIR"] == str(tmp_path / "torch_extensions" / "abc123")
    assert env["TORCH_CUDA_ARCH_LIST"] == "9.0"
    assert env["MAX_JOBS"] == "3"
    assert json.loads(env["CUDAL1_BUILD_LEVERS"]) == BuildLevers().to_dict()


def test_hooks_take_levers_from_the_build_environment(monkeypatch):
    import torch.utils.cpp_extension as ce

    monkeypatch.setattr(ce, "load_inline", lambda *a, **k: None)
    monkeypatch.setattr(ce, "load", lambda *a, **k: None)
    env = build_environment("k", "9.0", levers=BuildLevers(light_cuda_headers=False))
    monkeypatch.setenv("CUDAL1_BUILD_LEVERS", env["CUDAL1_BUILD_LEVERS"])
    assert install_build_hooks().levers == BuildLevers(light_cuda_headers=False)


def test_cache_root_honours_env(monkeypatch, tmp_path):
    monkeypatch.setenv("CUDAL1_CACHE_DIR", str(tmp_path))
    assert compile_mod.cache_root() == tmp_path
    assert compile_mod.cache_root(tmp_path / "x") == tmp_path / "x"


def test_config_validation():
    with pytest.raises(ConfigError):
        CompileConfig(arch="9.0", threads=0)
    with pytest.raises(ConfigError):
        CompileConfig(arch="9.0", device="gpu1")


# --------------------------------------------------------------------------- trim_compiler_log


def _fixture(name: str) -> str:
    return (FIXTURES / f"{name}.log").read_text()


@pytest.mark.parametrize("name", ["cpp_syntax_error", "cpp_undefined_symbol", "cuda_undefined_identifier",
                                  "cuda_template_instantiation", "cuda_missing_header"])
def test_trim_fixture_is_short_and_clean(name):
    raw = _fixture(name)
    out = trim_compiler_log(raw)
    assert 0 < len(out) <= 2000 and len(out.splitlines()) <= 20
    assert len(out) < len(raw)
    for noise in ("-MMD", "--generate-dependencies", "-isystem", "In file included from", "warning:",
                  "/tmp/", "site-packages"):
        assert noise not in out, (noise, out)


def test_trim_cpp_syntax_error_keeps_errors_and_context():
    out = trim_compiler_log(_fixture("cpp_syntax_error"))
    lines = out.splitlines()
    assert lines[0] == "Error building extension 'cpp_syntax_error'"
    assert lines[1].startswith("main.cpp:5:5: error: expected") and "return" in lines[1], out
    assert "return y + undefined_tensor;" in lines[2], out  # source context kept
    assert lines[3].lstrip().startswith("|") and "^" in lines[3], out  # caret line kept
    assert "no return statement" not in out  # the warning and its context are dropped
    assert lines[-1] == "ninja: build stopped: subcommand failed."


def test_trim_undefined_symbol_keeps_import_error():
    out = trim_compiler_log(_fixture("cpp_undefined_symbol"))
    assert "undefined symbol" in out and "cpp_undefined_symbol.so" in out, out
    assert len(out.splitlines()) <= 3


def test_trim_cuda_undefined_identifier():
    out = trim_compiler_log(_fixture("cuda_undefined_identifier"))
    assert 'identifier "scale_factor" is undefined' in out, out
    assert "cuda.cu(" in out and "1 error detected" in out, out
    assert "nvcc" not in out


def test_trim_cuda_template_error_drops_instantiation_chatter():
    raw = _fixture("cuda_template_instantiation")
    out = trim_compiler_log(raw)
    assert "error" in out and "float4" in out, out
    assert "detected during" not in out
    assert "ninja: build stopped" in out


def test_trim_missing_header_keeps_fatal_error():
    out = trim_compiler_log(_fixture("cuda_missing_header"))
    assert "fatal error" in out.lower() and "block_reduce_fast.cuh" in out, out


def test_trim_budgets_and_fallback():
    many = "\n".join(f"/very/long/tmp/dir/x.cpp:{i}:1: error: bad thing {i}" for i in range(100))
    out = trim_compiler_log(many + "\nninja: build stopped: subcommand failed.", max_lines=5, max_chars=500)
    lines = out.splitlines()
    assert len(lines) <= 5 and len(out) <= 500
    assert lines[0] == "x.cpp:0:1: error: bad thing 0" and lines[-1].startswith("ninja: build stopped")
    assert "more lines" in out
    # Unknown format: keep the last lines rather than nothing.
    assert trim_compiler_log("something odd happened\nlast words") == "something odd happened\nlast words"


def test_failure_message_names_the_first_compiler_error():
    # The log of a CUDA-L1 release kernel built with torch 2.11 (deprecated `.type()` dispatch, and
    # `functions=` naming a function that cpp_sources never declares).
    log = ("Error building extension 'transposed_conv_cuda_6979'\n"
           "cuda.cu(165): error: no suitable conversion function from \"const at::DeprecatedTypeProperties\" "
           "to \"c10::ScalarType\" exists\n"
           "     ; torch::headeronly::ScalarType _st = ::detail::scalar_type(the_type); ;\n"
           "1 error detected in the compilation of \"cuda.cu\".\n"
           "main.cpp:4:56: error: 'transposed_conv2d' was not declared in this scope\n"
           "ninja: build stopped: subcommand failed.")
    assert build_failure_message(log) == ("CUDA build failed: cuda.cu(165): error: no suitable conversion function "
                                          "from \"const at::DeprecatedTypeProperties\" to \"c10::ScalarType\" exists")
    assert build_failure_message("Error building extension 'x'") == "CUDA build failed: Error building extension 'x'"
    assert build_failure_message("") == "CUDA build failed: no compiler output"
    assert build_failure_message("SyntaxError: unterminated triple-quoted string literal (detected at line 554) "
                                 "(cudal1_candidate_8bc1.py, line 6)") == (
        "syntax error at line 6: unterminated triple-quoted string literal (detected at line 554)")
    assert build_failure_message("IndentationError: unexpected indent") == "syntax error: unexpected indent"
    assert len(build_failure_message("x.cu(1): error: " + "y" * 1000)) == len("CUDA build failed: ") + 300


# --------------------------------------------------------------------------- light-header lever


def test_light_cuda_sources_only_when_safe():
    src = "#include <torch/extension.h>\n__global__ void k() {}\n"
    assert light_cuda_sources(src) == ["\n__global__ void k() {}\n"]
    assert light_cuda_sources([src, "int x;"]) == ["\n__global__ void k() {}\n", "int x;"]
    assert light_cuda_sources("__global__ void k() {}") is None  # nothing to drop
    assert light_cuda_sources(src + "PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {}") is None
    assert light_cuda_sources(src + "torch::nn::Linear l(1, 2);") is None
    assert light_cuda_sources(src + "AT_DISPATCH_FLOATING_TYPES(x.type(), \"f\", [&] {});") is None
    assert light_cuda_sources(None) is None


def test_unbound_functions_only_when_the_failure_is_certain():
    # 49 of the 72 load_inline candidates (51 of 73 calls) in CUDA-L1's H100 release look like this: nothing
    # declares `forward` in main.cpp, so torch's build fails after compiling everything (20-55 s each on H200).
    assert unbound_functions("", ["forward"]) == ["forward"]
    assert unbound_functions(["", "  \n"], "forward") == ["forward"]
    assert unbound_functions([], {"a": "doc", "b": "doc"}) == ["a", "b"]
    assert unbound_functions(None, ["f"]) == []  # torch raises its own AttributeError: leave it to torch
    assert unbound_functions("", ("f",)) == []  # torch raises ValueError for a tuple
    assert unbound_functions("", ["f"], extra_cflags=["-include", "decl.h"]) == []  # declared by force
    assert unbound_functions("torch::Tensor forward(torch::Tensor x);", ["forward"]) == []
    assert unbound_functions('#include "decl.h"', ["forward"]) == []  # maybe declared: the compiler decides
    assert unbound_functions("", None) == []  # no binding generated (PYBIND11_MODULE in the sources)
    assert unbound_functions(["", 3], ["forward"]) == []  # not plain strings: leave it to torch


def test_unbound_functions_fail_at_once_like_torch(fake_torch_build):
    ce, calls = fake_torch_build
    recorder = install_build_hooks(BuildLevers())
    cuda = "torch::Tensor forward(torch::Tensor x) { return x; }"
    with pytest.raises(RuntimeError, match="Error building extension 'ext'") as info:
        ce.load_inline(name="ext", cpp_sources="", cuda_sources=cuda, functions=["forward"])
    assert calls == []  # nothing was compiled
    assert "main.cpp: error: 'forward' was not declared in this scope" in str(info.value)
    assert "declare it there" in str(info.value)
    assert [(r.name, r.ok, r.variant) for r in recorder.records] == [("ext", False, "unbound")]
    trimmed = trim_compiler_log(str(info.value))
    assert build_failure_message(trimmed).startswith("CUDA build failed: main.cpp: error: 'forward' was not "
                                                     "declared in this scope (load_inline 'ext'")
    # Declared in cpp_sources: built as usual; and the lever can be switched off.
    assert ce.load_inline("ok", "torch::Tensor forward(torch::Tensor x);", cuda, functions=["forward"]) == "module"
    install_build_hooks(BuildLevers(fail_fast_unbound=False))
    assert ce.load_inline("off", "", cuda, functions=["forward"]) == "module"
    assert len(calls) == 2


def test_duplicate_module_only_when_the_failure_is_certain():
    # CUDA-L1 H100 release, e.g. level1/84 and level2/11: PYBIND11_MODULE in cpp_sources beside functions=,
    # "redefinition of PyInit_..." after 17-19 s of compiling on the H200.
    decl = "torch::Tensor f(torch::Tensor x);\n"
    module = "PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def(\"f\", &f); }"
    assert "redefinition of 'PyObject* PyInit_ext()'" in duplicate_module_log("ext", decl + module, "", ["f"])
    assert "redefinition" in duplicate_module_log("ext", [decl, "PYBIND11_MODULE( ext , m) {}"], "", "f")
    assert "multiple definition of 'PyInit_ext'" in duplicate_module_log("ext", decl, [module], {"f": "doc"})
    assert duplicate_module_log("ext", decl + module, "", None) == ""  # no module generated by torch
    assert duplicate_module_log("ext", decl + module, "", []) == ""
    assert duplicate_module_log("ext", decl + "PYBIND11_MODULE(other, m) {}", "", ["f"]) == ""  # PyInit_other
    assert duplicate_module_log("ext", decl + "// PYBIND11_MODULE(TORCH_EXTENSION_NAME, m)", "", ["f"]) == ""
    assert duplicate_module_log("ext", decl + "/* PYBIND11_MODULE(ext, m) {} */", "", ["f"]) == ""
    assert duplicate_module_log("ext", (decl + module,), "", ["f"]) == ""  # torch's own error for a tuple
    # a comment opener inside a string literal does not hide code, and commented-out code does not count
    assert duplicate_module_log("ext", 'auto u = "http://x"; /* ' + module + " */", "", ["f"]) == ""
    assert duplicate_module_log("ext", decl + "#ifdef WITH_MODULE\n" + module + "\n#endif\n", "", ["f"]) == ""
    # once torch loaded an "ext", a new build is renamed ext_v1: only TORCH_EXTENSION_NAME still clashes
    assert duplicate_module_log("ext", decl + "PYBIND11_MODULE(ext, m) {}", "", ["f"], name_in_use=True) == ""
    assert "redefinition" in duplicate_module_log("ext", decl + module, "", ["f"], name_in_use=True)


def test_duplicate_module_fails_at_once_like_torch_unless_switched_off(fake_torch_build):
    ce, calls = fake_torch_build
    recorder = install_build_hooks(BuildLevers())
    cpp = "torch::Tensor f(torch::Tensor x);\nPYBIND11_MODULE(TORCH_EXTENSION_NAME, m) { m.def(\"f\", &f); }"
    cuda = "torch::Tensor f(torch::Tensor x) { return x; }"
    with pytest.raises(RuntimeError, match="Error building extension 'dup'") as info:
        ce.load_inline(name="dup", cpp_sources=cpp, cuda_sources=cuda, functions=["f"])
    assert calls == [] and "define the module once" in str(info.value)
    assert [(r.name, r.ok, r.variant) for r in recorder.records] == [("dup", False, "duplicate_module")]
    install_build_hooks(BuildLevers.none())
    assert ce.load_inline("dup", cpp, cuda, functions=["f"]) == "module" and len(calls) == 1


def test_a_runner_without_a_gpu_refuses_cuda_builds_by_what_it_has(fake_torch_build):
    """`cuda_usable=False` (a candidate's runner that sees no GPU): every call that compiles CUDA fails at once
    with `NoGpuError`, recorded as `no_gpu`, before torch could fail in a way of its own; C++-only builds go
    on, and a call certain to fail on any machine is still the candidate's compile error."""
    from cudal1.eval.inside.build_hooks import NoGpuError

    ce, calls = fake_torch_build
    recorder = install_build_hooks(BuildLevers(), cuda_usable=False)
    with pytest.raises(NoGpuError, match="no GPU"):
        ce.load_inline("k", "", "__global__ void k() {}")
    with pytest.raises(NoGpuError):
        ce.load_inline("w", "int f();", with_cuda=True)
    with pytest.raises(NoGpuError):
        ce.load("files", ["a.cpp", "b.cu"])
    with pytest.raises(RuntimeError, match="Error building extension 'u'"):
        ce.load_inline("u", "", "torch::Tensor g(torch::Tensor x) { return x; }", functions=["g"])
    assert ce.load_inline("cpp", "int f() { return 1; }") == "module"
    ce.load("cpp_files", ["a.cpp"])
    assert [(r.name, r.variant) for r in recorder.records if not r.ok] == [
        ("k", "no_gpu"), ("w", "no_gpu"), ("files", "no_gpu"), ("u", "unbound")]
    install_build_hooks(BuildLevers())  # a build child (cuda_usable unknown): builds for a GPU it may not see
    assert ce.load_inline("k", "", "__global__ void k() {}") == "module"


def test_no_levers_means_every_lever_off():
    assert not any(BuildLevers.none().to_dict().values())
    assert BuildLevers.from_dict(BuildLevers.none().to_dict()) == BuildLevers.none()


def test_hooks_fall_back_to_original_and_remember(monkeypatch, tmp_path):
    """The light variant failing makes the hook build the source as written, and record that choice."""
    import torch.utils.cpp_extension as ce

    calls = []

    def fake_load_inline(name, cpp_sources, cuda_sources=None, **kwargs):
        calls.append((cuda_sources, kwargs.get("verbose")))
        if "torch/extension.h" not in "".join(cuda_sources):
            raise RuntimeError("Error building extension 'x': cuda.cu(3): error: identifier \"py\" is undefined")
        return "module"

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    monkeypatch.setattr(ce, "load_inline", fake_load_inline)
    monkeypatch.setattr(ce, "load", lambda *a, **k: None)
    recorder = install_build_hooks(BuildLevers())
    src = "#include <torch/extension.h>\n__global__ void k() {}\n"
    assert ce.load_inline("x", "", src, verbose=True) == "module"
    assert len(calls) == 2 and calls[0][1] is False  # light first, quiet forced
    assert [(r.name, r.ok, r.variant) for r in recorder.records] == [("x", True, "fallback")]
    # A fresh process (new hooks) replays the decision: one call, the original source.
    calls.clear()
    install_build_hooks(BuildLevers())
    assert ce.load_inline("x", "", src) == "module"
    assert len(calls) == 1 and "torch/extension.h" in calls[0][0]
    # A source that builds with the light headers is built once, light, and the decision is recorded.
    calls.clear()

    def fake_ok(name, cpp_sources, cuda_sources=None, **kwargs):
        calls.append(cuda_sources)
        return "m"

    monkeypatch.setattr(ce, "load_inline", fake_ok)
    recorder = install_build_hooks(BuildLevers())
    ok_src = "#include <torch/extension.h>\n#include <torch/extension.h>\n__global__ void k2() {}\n"
    assert ce.load_inline("y", "", ok_src) == "m"
    assert calls == [["\n\n__global__ void k2() {}\n"]]
    assert [r.variant for r in recorder.records] == ["light"]
    assert json.loads((tmp_path / ".cudal1_levers.json").read_text())


# --------------------------------------------------------------------------- prepare_candidate (isolated)


def _prepare(source: str, tmp_path: Path, *, scratch_from: Path | None = None, scratch_out: Path | None = None,
             **extra) -> dict:
    """The build child on `source` in a sandboxed runner; a build it writes lands in its scratch folder, which
    `scratch_out` receives (as the compile service publishes it) and `scratch_from` provides."""
    sandboxed = scratch_from is not None or scratch_out is not None
    env = build_environment("testkey", "9.0", cache_dir=tmp_path, sandboxed=sandboxed)
    outcome = run_isolated(BUILD_ENTRY, {"source": source, "device": "cpu", **extra},
                           limits=Limits(timeout_s=240), env=env, scratch_from=scratch_from, scratch_out=scratch_out)
    assert outcome.value is not None, (outcome.describe_failure(), outcome.stderr_tail)
    return outcome.value


def test_prepare_pure_pytorch_candidate(tmp_path):
    value = _prepare(PURE_PYTORCH, tmp_path, init_inputs=[3.0])
    assert value["ok"] is True and value["import_ok"] is True
    assert value["builds"] == [] and value["log"] == ""



def test_a_source_beyond_the_channels_text_limit_still_reaches_its_build(tmp_path):
    """Published candidates run to 20-60 KB of source; the parent's own payload to the build child carries the
    source whole (the text limit of a message binds what a sandbox sends, not what it is sent)."""
    long = PURE_PYTORCH + "# padding line of a long candidate\n" * 1500
    assert len(long) > 40_000
    value = _prepare(long, tmp_path, init_inputs=[3.0])
    assert value["ok"] is True and value["import_ok"] is True, value

def test_prepare_import_error_is_one_line(tmp_path):
    value = _prepare(IMPORT_RAISES, tmp_path)
    assert value["ok"] is False and value["import_ok"] is False
    assert value["log"] == "ValueError: boom at import"


def test_prepare_instantiation_error_reported(tmp_path):
    value = _prepare(PURE_PYTORCH, tmp_path, init_inputs=[1, 2, 3])
    assert value["ok"] is False and value["log"].startswith("TypeError:")


@needs_gxx
def test_prepare_cpp_syntax_error_is_trimmed(tmp_path):
    """A real g++ error through torch's ninja build, swallowed by the candidate, is still reported."""
    value = _prepare(CPP_SYNTAX_ERROR_FAST, tmp_path)
    assert value["import_ok"] is True and value["ok"] is False
    assert [(b["name"], b["ok"]) for b in value["builds"]] == [("bad_add_one", False)]
    log = value["log"]
    assert "main.cpp:2:17: error: expected" in log and "before" in log, log
    assert "return x + 1" in log and "-MMD" not in log and "/" not in log, log
    assert len(log.splitlines()) <= 20


@needs_gxx
def test_a_failed_build_the_candidate_catches_is_a_fallback_not_a_verdict(tmp_path):
    """The compile service's result says the import ran anyway (`fallback`), so the evaluation goes on to judge
    what runs; a candidate whose import fails with its build is no fallback."""
    [caught] = build_candidates([CPP_SYNTAX_ERROR_FAST], arch="9.0", device="cpu", cache_dir=str(tmp_path))
    assert not caught.ok and caught.fallback and "error: expected" in caught.log
    uncaught = CPP_SYNTAX_ERROR_FAST.replace("except Exception as exc:", "except ImportError as exc:")
    [failed] = build_candidates([uncaught], arch="9.0", device="cpu", cache_dir=str(tmp_path))
    assert not failed.ok and not failed.fallback


@pytest.mark.slow
@needs_gxx
def test_prepare_cpp_build_succeeds_and_is_reused(tmp_path):
    """A lazy (in __init__) C++ build succeeds; a fresh child given what it wrote reuses it at once. (The
    child runs sandboxed: its build lands in its scratch folder, published as the compile service does.)"""
    built = tmp_path / "built"
    value = _prepare(CPP_OK, tmp_path, scratch_out=built, init_inputs=[1])
    assert value["ok"] is True, value["log"]
    assert [(b["name"], b["ok"]) for b in value["builds"]] == [("ok_add_one", True)]
    assert (built / "ok_add_one" / "ok_add_one.so").exists(), sorted(p.name for p in built.rglob("*"))
    again = _prepare(CPP_OK, tmp_path, scratch_from=built, init_inputs=[1])
    assert again["ok"] is True and again["builds"][0]["seconds"] < 5.0, again


CUDA_CANDIDATE = '''
import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

cuda_src = r"""
#include <torch/extension.h>
__global__ void add_one_kernel(const float* x, float* y, int64_t n) {
    int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i] + 1.f;
}
torch::Tensor add_one(torch::Tensor x) {
    auto y = torch::empty_like(x);
    int64_t n = x.numel();
    add_one_kernel<<<(n + 255) / 256, 256>>>(x.data_ptr<float>(), y.data_ptr<float>(), n);
    return y;
}
"""

class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.ext = load_inline(name="gpu_add_one", cpp_sources="torch::Tensor add_one(torch::Tensor x);",
                               cuda_sources=cuda_src, functions=["add_one"])

    def forward(self, x):
        return self.ext.add_one(x)
'''


@pytest.mark.gpu
def test_gpu_build_then_eval_import_reuses_it(tmp_path):
    """Service build with the light-header lever; a fresh child with hooks + env rebuilds nothing."""
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    service = CompileService(CompileConfig(device="cuda:0", cache_dir=str(tmp_path)))
    [result] = service.build([CUDA_CANDIDATE], init_inputs=[[]])
    assert result.ok, result.log
    assert [b.name for b in result.builds] == ["gpu_add_one"]
    key = service.key_for(CUDA_CANDIDATE, [])
    payload = {"source": CUDA_CANDIDATE, "init_inputs": [], "device": "cuda:0",
               "levers": service.config.levers.to_dict()}
    # As the evaluation's runner: on the GPU, with the cache entry copied in when builds are sandboxed.
    scratch = service.build_directory(key) if service.sandboxed else None
    outcome = run_isolated(BUILD_ENTRY, payload, env=service.environment(key), device="cuda:0", scratch_from=scratch)
    assert outcome.value is not None and outcome.value["ok"], outcome.describe_failure()
    assert outcome.value["builds"][0]["variant"] == "light"
    assert outcome.value["builds"][0]["seconds"] < 5.0


# --------------------------------------------------------------------------- the service


def test_service_caches_by_marker(tmp_path, monkeypatch):
    calls = []
    real = compile_mod.run_isolated

    def counting_run_isolated(*args, **kwargs):
        calls.append(args[0])
        return real(*args, **kwargs)

    monkeypatch.setattr(compile_mod, "run_isolated", counting_run_isolated)
    progress = []
    kwargs = dict(arch="9.0", device="cpu", cache_dir=str(tmp_path), threads=2)
    first = build_candidates([PURE_PYTORCH, IMPORT_RAISES, PURE_PYTORCH], progress=lambda *a: progress.append(a),
                             **kwargs)
    assert len(calls) == 2  # identical sources built once
    assert [(r.ok, r.cached) for r in first] == [(True, False), (False, False), (True, False)]
    assert first[0].key == first[2].key and first[0].seconds > 0
    assert [p[:2] for p in progress] == [(1, 2), (2, 2)]
    assert (tmp_path / "torch_extensions" / first[0].key / ".cudal1_ok").exists()
    second = build_candidates([PURE_PYTORCH, IMPORT_RAISES], **kwargs)
    assert len(calls) == 3  # the success from its marker; the failure (not a compiler verdict) once more
    assert (second[0].ok, second[0].cached, second[0].seconds) == (True, True, 0.0)
    assert (second[1].ok, second[1].cached) == (False, False)
    assert second[1].log == "ValueError: boom at import"


def test_service_remembers_compile_errors_not_other_failures(tmp_path, monkeypatch):
    calls = []
    real = compile_mod.run_isolated
    monkeypatch.setattr(compile_mod, "run_isolated", lambda *a, **kw: calls.append(a[0]) or real(*a, **kw))
    kwargs = dict(arch="9.0", device="cpu", cache_dir=str(tmp_path), threads=1)
    syntax_error = "import torch\nclass ModelNew(:\n    pass\n"
    first = build_candidates([syntax_error], **kwargs)[0]
    again = build_candidates([syntax_error], **kwargs)[0]
    assert len(calls) == 1 and not again.ok and again.cached and again.log == first.log
    assert first.log.startswith("SyntaxError")
    compile_mod.forget_compile_errors()  # a new process knows no failures: it builds again
    build_candidates([syntax_error], **kwargs)
    assert len(calls) == 2


@pytest.mark.parametrize("value, log, remembered", [
    ({"builds": [{"ok": False}], "import_ok": True}, "main.cpp:4:1: error: expected ';'", True),
    ({"builds": [], "import_ok": False}, "SyntaxError: invalid syntax (line 3)", True),
    ({"builds": [{"ok": False}], "import_ok": True}, "c++: fatal error: Killed signal terminated program cc1plus",
     False),
    ({"builds": [], "import_ok": False}, "OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB", False),
    ({"builds": [{"ok": False}], "import_ok": False}, "OSError: [Errno 28] No space left on device", False),
    ({"builds": [], "import_ok": False}, "ValueError: boom at import", False),
])
def test_only_verdicts_on_the_source_are_remembered(value, log, remembered):
    assert compile_mod._is_compile_error(value, log) is remembered


def test_service_keys_depend_on_levers_and_init_inputs(tmp_path):
    svc = CompileService(CompileConfig(arch="9.0", device="cpu", cache_dir=str(tmp_path)))
    quiet_off = CompileService(CompileConfig(arch="9.0", device="cpu", cache_dir=str(tmp_path),
                                             levers=BuildLevers(light_cuda_headers=False)))
    assert svc.key_for("x") != quiet_off.key_for("x")
    assert svc.key_for("x", [1]) != svc.key_for("x", [2])
    env = svc.environment(svc.key_for("x"))
    assert svc.build_directory(svc.key_for("x")).name == svc.key_for("x")
    # A sandboxed build and its candidate's runner see the build in their own scratch folder, never the cache.
    expected = "/tmp/ext" if svc.sandboxed else str(svc.build_directory(svc.key_for("x")))
    assert env["TORCH_EXTENSIONS_DIR"] == expected


def test_service_requires_arch_without_gpu():
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present: the arch comes from it")
    with pytest.raises(ConfigError):
        CompileService(CompileConfig(arch=None))


def test_service_reports_a_hanging_build_as_timeout(tmp_path):
    source = "import time\ntime.sleep(3600)\nclass ModelNew: pass\n"
    for _ in range(2):  # a timeout is not remembered like a compile error: it may pass on a quieter machine
        [result] = build_candidates([source], arch="9.0", device="cpu", cache_dir=str(tmp_path), timeout_s=1.0)
        # (an hour's sleep: a build that waited for it would outlast the test's own time limit)
        assert not result.ok and not result.cached and 1.0 <= result.seconds
        assert result.log.startswith("build timed out after") and result.timed_out  # typed, not read from text
        assert not (tmp_path / "torch_extensions" / result.key / ".cudal1_ok").exists()


def test_prepare_build_reuses_an_import_only_build_made_elsewhere(monkeypatch, tmp_path):
    # A Ray pool's CPU task builds import-time extensions without init inputs (no GPU there); the actor's
    # evaluation, whose own key includes the init inputs, must reuse that build rather than redo it.
    from cudal1.eval import pipeline
    from cudal1.eval.config import EvalConfig
    from cudal1.tasks.sources import load_file

    monkeypatch.setenv("CUDAL1_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(pipeline, "local_arch", lambda arch=None: arch or "9.0")

    def no_build(self, sources, **kwargs):
        raise AssertionError("built again")

    monkeypatch.setattr(CompileService, "build", no_build)
    task = load_file(Path(__file__).parent.parent / "fixtures" / "tasks" / "tiny_scale_add.py")
    source = "from torch.utils.cpp_extension import load_inline\n# uses load_inline at import\n"
    service = CompileService(CompileConfig(arch="9.0", device="cuda"))
    bare_key = service.key_for(source, None)
    compile_mod.write_marker(bare_key, {"builds": [{"name": "ext", "seconds": 30.0, "ok": True}]})
    prepared = pipeline.prepare_build(task, source, EvalConfig(device="cuda"))
    assert prepared.result is None and prepared.env == service.environment(bare_key)
    # Without extensions in the import-only build (everything builds lazily) it would be built: no reuse.
    compile_mod.write_marker(bare_key, {"builds": []})
    with pytest.raises(AssertionError, match="built again"):
        pipeline.prepare_build(task, source, EvalConfig(device="cuda"))


def test_prebuild_tells_each_item_when_its_build_is_done(tmp_path, monkeypatch):
    # evaluate_many starts an item's evaluation on this signal, so every item must get it exactly once:
    # at once without a build, after the build otherwise (identical sources share one build).
    from cudal1.eval import scheduler
    from cudal1.eval.config import EvalConfig
    from cudal1.eval.scheduler import prebuild
    from cudal1.tasks.sources import load_file

    monkeypatch.setenv("CUDAL1_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(scheduler, "local_arch", lambda arch=None: arch or "9.0")
    task = load_file(Path(__file__).parent.parent / "fixtures" / "tasks" / "tiny_scale_add.py")
    ok = "# load_inline\n" + PURE_PYTORCH.replace("scale=2.0", "dim")
    bad = "# load_inline\n" + IMPORT_RAISES
    items = [(task, ok), (task, PURE_PYTORCH), (task, bad), (task, ok)]
    done, builds = [], []
    prebuild(items, EvalConfig(device="cpu"), on_build=lambda d, t: builds.append((d, t)), on_item=done.append,
             threads=2)
    assert done[0] == 1 and sorted(done) == [0, 1, 2, 3]
    assert sorted(builds) == [(1, 2), (2, 2)]


def test_build_children_run_niced(tmp_path):
    # Builds share the host with evaluations being timed (pool slots, overlapped batches): their
    # compilers must yield the CPU.
    import os

    source = ("import os\nopen(os.path.join(os.environ['TORCH_EXTENSIONS_DIR'], 'niceness.txt'), 'w')"
              ".write(str(os.nice(0)))\nclass ModelNew: pass\n")
    base = os.nice(0)
    [result] = build_candidates([source], arch="9.0", device="cpu", cache_dir=str(tmp_path / "c"))
    probe = compile_mod.extensions_dir(result.key, tmp_path / "c") / "niceness.txt"  # what the build wrote
    assert int(probe.read_text()) == min(19, base + 10)
    with pytest.raises(ConfigError):
        CompileConfig(arch="9.0", nice=20)


def test_cancelled_builds_start_no_child(tmp_path, monkeypatch):
    monkeypatch.setattr(compile_mod, "run_isolated", lambda *a, **kw: pytest.fail("a cancelled build ran"))
    service = CompileService(CompileConfig(arch="9.0", device="cpu", cache_dir=str(tmp_path)))
    [result] = service.build([PURE_PYTORCH], should_cancel=lambda: True)
    assert (result.ok, result.log) == (False, "build cancelled")
    assert compile_mod._known_compile_error(result.key) is None  # tried again next time


def test_build_children_stay_on_their_cores(tmp_path):
    import os

    if not hasattr(os, "sched_getaffinity"):
        pytest.skip("no CPU affinity on this platform")
    source = ("import os\nopen(os.path.join(os.environ['TORCH_EXTENSIONS_DIR'], 'cpus.txt'), 'w')"
              ".write(str(sorted(os.sched_getaffinity(0))))\nclass ModelNew: pass\n")
    core = min(os.sched_getaffinity(0))
    [result] = CompileService(CompileConfig(arch="9.0", device="cpu", cache_dir=str(tmp_path / "c"),
                                            cpus=(core,))).build([source])
    probe = compile_mod.extensions_dir(result.key, tmp_path / "c") / "cpus.txt"
    assert probe.read_text() == str([core])
