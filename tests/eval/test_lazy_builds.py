"""Lazy builds (in `forward`) triggered by the compile service's warm-up child, and remembered build failures.

CPU only. The real builds here compile a tiny C++ file without torch headers through
`torch.utils.cpp_extension.load`, so a compiler error comes back in about a second.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from cudal1.eval import compile as compile_mod
from cudal1.eval.compile import (
    BUILD_ENTRY,
    WARM_ENTRY,
    BuildLevers,
    CompileConfig,
    CompileService,
    build_call_sites,
    extensions_dir,
    lazy_records,
    read_marker,
)
from cudal1.eval.inside.build_hooks import FAILURES_FILE, install_build_hooks
from cudal1.eval.isolated import Limits, run_isolated

needs_gxx = pytest.mark.skipif(shutil.which("c++") is None, reason="needs a C++ compiler")

REFERENCE = """
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self, scale):
        super().__init__()
        self.scale = scale

    def forward(self, x):
        return x * self.scale

def get_inputs():
    return [torch.randn(4, 8)]

def get_init_inputs():
    return [2.0]
"""

# Builds in its first forward, from a file it writes into its working directory (a new one in each
# process); the build fails, the candidate falls back to PyTorch.
LAZY_BAD_LOAD = '''
import torch.nn as nn
from torch.utils.cpp_extension import load

BAD_CPP = "int add_one(int x) {\\n    return x + 1\\n}\\n"

class ModelNew(nn.Module):
    def __init__(self, scale):
        super().__init__()
        self.scale = scale
        self.ext = None

    def forward(self, x):
        if self.ext is None:
            with open("lazy_bad.cpp", "w") as f:
                f.write(BAD_CPP)
            try:
                self.ext = load(name="lazy_bad", sources=["lazy_bad.cpp"])
            except RuntimeError:
                self.ext = False
        return x * self.scale
'''

# The forward never gets to its build: it ends the process, or raises.
WARM_UP_ENDS = '''
import os
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

class ModelNew(nn.Module):
    def __init__(self, scale):
        super().__init__()

    def forward(self, x):
        {}
        return load_inline(name="never", cpp_sources="int f() {{ return 1; }}")
'''


def _service(tmp_path: Path, **kw) -> CompileService:
    return CompileService(CompileConfig(arch="9.0", device="cpu", cache_dir=str(tmp_path), threads=1, **kw))


def _entries(monkeypatch) -> list[str]:
    """The entries of the children the service starts, in order."""
    entries: list[str] = []
    real = compile_mod.run_isolated
    monkeypatch.setattr(compile_mod, "run_isolated", lambda entry, *a, **kw: entries.append(entry) or real(entry, *a,
                                                                                                          **kw))
    return entries


@needs_gxx
def test_a_lazy_build_failure_is_built_ahead_remembered_and_replayed(tmp_path, monkeypatch):
    entries = _entries(monkeypatch)
    service = _service(tmp_path, warm_lazy_builds=True)
    [result] = service.build([LAZY_BAD_LOAD], init_inputs=[[2.0]], ref_sources=[REFERENCE])
    assert entries == [BUILD_ENTRY, WARM_ENTRY]
    assert result.ok, result.log  # a lazy failure is the evaluation's verdict, not the build's
    assert [(b.name, b.ok, b.lazy) for b in result.builds] == [("lazy_bad", False, True)]
    failures = json.loads((extensions_dir(result.key, tmp_path) / FAILURES_FILE).read_text())
    [(call_key, log)] = failures.items()
    assert call_key.startswith("lazy_bad:") and "error: expected" in log, log
    assert [b["lazy"] for b in read_marker(result.key, tmp_path)["builds"]] == [True]
    [again] = service.build([LAZY_BAD_LOAD], init_inputs=[[2.0]], ref_sources=[REFERENCE])
    assert again.cached and again.builds == result.builds and len(entries) == 2
    # The evaluation worker (same environment, another working directory) fails that build at once.
    payload = {"source": LAZY_BAD_LOAD, "ref_source": REFERENCE, "device": "cpu",
               "levers": service.config.levers.to_dict()}
    outcome = run_isolated(WARM_ENTRY, payload, limits=Limits(timeout_s=120), env=service.environment(result.key),
                           scratch_from=service.build_directory(result.key))
    assert outcome.value is not None, outcome.describe_failure()
    assert outcome.value["forward_ok"] is True
    # "remembered": torch's ninja run was replaced by the remembered output, so no compiler ran (no wall time
    # asserted: a loaded machine stretches even a replay)
    assert [(b["variant"], b["phase"]) for b in outcome.value["builds"]] == [("remembered", "forward")]


# Killed in the middle of a build: torch's lock file of the extension directory stays behind.
KILLED_MID_BUILD = ("os.makedirs(os.path.join(os.environ['TORCH_EXTENSIONS_DIR'], 'never'), exist_ok=True); "
                    "open(os.path.join(os.environ['TORCH_EXTENSIONS_DIR'], 'never', 'lock'), 'w').close(); "
                    "os._exit(3)")


@pytest.mark.parametrize("ending", [KILLED_MID_BUILD, "raise ValueError('boom in forward')"])
def test_a_warm_up_that_crashes_or_raises_leaves_the_build_ok(tmp_path, monkeypatch, ending):
    entries = _entries(monkeypatch)
    service = _service(tmp_path, warm_lazy_builds=True)
    [result] = service.build([WARM_UP_ENDS.format(ending)], init_inputs=[[2.0]], ref_sources=[REFERENCE])
    assert entries == [BUILD_ENTRY, WARM_ENTRY]
    assert result.ok and result.builds == () and result.log == ""
    assert read_marker(result.key, tmp_path) is not None
    # No lock is left for the evaluation's own build to wait on forever.
    assert not list(extensions_dir(result.key, tmp_path).glob("*/lock"))


def test_a_cancelled_pass_starts_no_warm_up(tmp_path, monkeypatch):
    entries = _entries(monkeypatch)
    cancel = iter([False, True])  # asked before the build (go on), then before the warm-up (stop)
    [result] = _service(tmp_path, warm_lazy_builds=True).build(
        [WARM_UP_ENDS.format("pass")], init_inputs=[[2.0]], ref_sources=[REFERENCE], should_cancel=lambda: next(cancel))
    assert result.ok and entries == [BUILD_ENTRY]


def test_no_warm_up_without_option_reference_or_build_left(tmp_path, monkeypatch):
    entries = _entries(monkeypatch)
    pure = "import torch.nn as nn\nclass ModelNew(nn.Module):\n    def forward(self, x):\n        return x\n"
    _service(tmp_path / "a").build([WARM_UP_ENDS.format("pass")], ref_sources=[REFERENCE])
    _service(tmp_path / "b", warm_lazy_builds=True).build([WARM_UP_ENDS.format("pass")])
    _service(tmp_path / "c", warm_lazy_builds=True).build([pure], ref_sources=[REFERENCE])
    assert entries == [BUILD_ENTRY] * 3


def test_warm_lazy_builds_is_not_part_of_the_key(tmp_path):
    assert (_service(tmp_path, warm_lazy_builds=True).key_for("x", [1]) == _service(tmp_path).key_for("x", [1]))


def test_build_call_sites_and_lazy_records():
    source = ("import json\nfrom torch.utils import cpp_extension\nfrom torch.utils.cpp_extension import load_inline\n"
              "a = load_inline('a', '')\nb = cpp_extension.load('b', ['b.cpp'])\nc = json.load\n")
    assert build_call_sites(source) == 2  # calls only, by name
    assert build_call_sites("def f(:\n") == 0
    builds = [{"name": n, "phase": p} for n, p in (("a", "import"), ("b", "init"), ("c", "forward"))]
    assert [b["name"] for b in lazy_records(builds, instantiated=True)] == ["c"]
    assert [b["name"] for b in lazy_records(builds, instantiated=False)] == ["b", "c"]


# --------------------------------------------------------------------------- remembered failures (hooks)


def _failing(calls: list[str], message: str):
    def build(name, *args, **kwargs):
        calls.append(name)
        raise RuntimeError(message.format(name=name))

    return build


COMPILER_ERROR = ("Error building extension '{name}': [1/2] c++ -c bad.cpp -o bad.o\nFAILED: bad.o\n"
                  "bad.cpp:2:17: error: expected ';' before '}}' token\nninja: build stopped: subcommand failed.")


BAD_CPP = "int add_one(int x) {\n    return x + 1\n}\n"
GOOD_CPP = "int add_one(int x) {\n    return x + 1;\n}\n"


def _fresh_process(ce, name: str):
    """What a new process sees: torch has loaded no extension of that name (the hooks are installed anew)."""
    ce.JIT_EXTENSION_VERSIONER.entries.pop(name, None)


@needs_gxx
def test_a_remembered_load_failure_is_replayed_by_torch_as_the_real_one(monkeypatch, tmp_path):
    import torch.utils.cpp_extension as ce

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "ext"))
    monkeypatch.setattr(ce, "load", ce.load)  # restored after the test, hooks included
    monkeypatch.setattr(ce, "load_inline", ce.load_inline)
    monkeypatch.setattr(ce, "_run_ninja_build", ce._run_ninja_build)
    bad, good = tmp_path / "bad.cpp", tmp_path / "good.cpp"
    bad.write_text(BAD_CPP)
    good.write_text(GOOD_CPP)

    def failure_then_good(expected_variant: str) -> tuple[str, int]:
        """A failing call, then the good source under the same name: what torch makes of the second one."""
        _fresh_process(ce, "rb")
        recorder = install_build_hooks(BuildLevers())
        with pytest.raises(RuntimeError) as failed:
            ce.load("rb", [str(bad)], is_python_module=False)
        assert [r.variant for r in recorder.records] == [expected_variant]
        ce.load("rb", [str(good)], is_python_module=False)  # torch: the name's inputs changed -> rb_v1
        return str(failed.value), ce.JIT_EXTENSION_VERSIONER.entries["rb"].version

    real_message, real_version = failure_then_good("original")
    assert (tmp_path / "ext" / FAILURES_FILE).exists() and "error: expected" in real_message
    replayed_message, replayed_version = failure_then_good("remembered")
    assert (replayed_message, replayed_version) == (real_message, real_version) == (real_message, 1)
    recorder = install_build_hooks(BuildLevers())
    _fresh_process(ce, "rb")
    with pytest.raises(RuntimeError):
        ce.load("rb", [str(bad)], is_python_module=False)
    assert recorder.records[0].variant == "remembered"  # replayed: no compiler ran
    # Another source under the name, or the lever off: compiled for real.
    bad.write_text(BAD_CPP.replace("x + 1", "x + 2"))
    for levers in (BuildLevers(), BuildLevers(remember_failures=False)):
        _fresh_process(ce, "rb")
        recorder = install_build_hooks(levers)
        with pytest.raises(RuntimeError):
            ce.load("rb", [str(bad)], is_python_module=False)
        assert [r.variant for r in recorder.records] == ["original"]


def test_load_inline_remembers_the_source_as_written_not_the_light_variant(fake_torch_build, monkeypatch):
    from cudal1.eval.inside.build_hooks import _call_key

    ce, _ = fake_torch_build
    calls: list[str] = []
    monkeypatch.setattr(ce, "load_inline", _failing(calls, COMPILER_ERROR))
    cuda = "#include <torch/extension.h>\n__global__ void k() { int x = }\n"
    install_build_hooks(BuildLevers())
    with pytest.raises(RuntimeError):
        ce.load_inline("lz", "void f();", cuda)
    assert len(calls) == 2  # light, then as written
    failures = json.loads((Path(os.environ["TORCH_EXTENSIONS_DIR"]) / FAILURES_FILE).read_text())
    assert list(failures) == [_call_key("lz", ["void f();", cuda], (), {})]
    assert failures[_call_key("lz", ["void f();", cuda], (), {})].startswith("[1/2] c++ -c bad.cpp")


@pytest.mark.parametrize("message", [
    "Error building extension '{name}': cc1plus: out of memory allocating 65536 bytes",
    "Error building extension '{name}': c++: fatal error: Killed signal terminated program cc1plus",
    "Error building extension '{name}': fatal error: error writing to /tmp/cc.s: No space left on device",
    "Error building extension '{name}': nvcc error   : 'cicc' died due to signal 9 (Kill signal)",
    "Error building extension '{name}': bad.cpp:3: internal compiler error: Segmentation fault",
    "Error building extension '{name}': ninja: build stopped: interrupted by user.",  # no diagnostic
    "{name}.so: undefined symbol: _Z7add_onei",  # not a failed compile
])
def test_resource_failures_and_other_errors_are_not_remembered(fake_torch_build, monkeypatch, tmp_path, message):
    ce, _ = fake_torch_build
    calls: list[str] = []
    monkeypatch.setattr(ce, "load", _failing(calls, message))
    for _ in range(2):
        install_build_hooks(BuildLevers())
        with pytest.raises(RuntimeError):
            ce.load("res", ["res.cpp"])
    assert len(calls) == 2 and not (tmp_path / FAILURES_FILE).exists()


def test_no_levers_means_no_remembered_failures():
    assert BuildLevers().remember_failures and not BuildLevers.none().remember_failures
