"""The evaluator end to end on CPU: every verdict, from real isolated runners.

Each test runs the full pipeline (static analysis, isolated child, correctness, timing) on a tiny task.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from cudal1.core.types import KernelClass
from cudal1.eval import EvalConfig, Status, evaluate_candidate
from cudal1.eval.supply import CoreSplit
from cudal1.store import ResultsStore
from cudal1.tasks.sources import load_file
from tests.helpers.selection import quick_few

FIXTURES = Path(__file__).parent.parent / "fixtures"
FAST = dict(device="cpu", sizes="full", correctness_trials=2, buckets=2, target_bucket_ms=5.0,
            warm_buckets=1, warmup_iters=1, timeout_s=60.0)


@pytest.fixture(scope="module")
def task():
    return load_file(FIXTURES / "tasks" / "tiny_scale_add.py")


def run(task, name: str, **overrides):
    source = (FIXTURES / "eval" / f"{name}.py").read_text()
    return evaluate_candidate(task, source, EvalConfig(**{**FAST, **overrides}))


def test_correct_candidate_is_timed(task):
    r = run(task, "correct")
    assert r.status is Status.CORRECT, r.message
    assert r.speedup is not None and r.speedup > 0
    assert r.timing.ref_ms > 0 and r.timing.candidate_ms > 0
    assert len(r.timing.bucket_speedups) == 2
    assert r.timing.speedup_warm is not None
    assert r.timing.method == "host_timer"
    assert r.protocol["version"] and r.environment["gpu_name"] == "cpu"


def test_wrong_values_report_where_and_how_much(task):
    r = run(task, "wrong_values")
    assert r.status is Status.INCORRECT
    assert r.speedup is None
    assert r.mismatch is not None and r.mismatch.bad_elements > 0
    assert "max abs err" in r.message and "trial 0" in r.message


def test_record_samples_keeps_every_timed_call_in_the_protocol(task):
    """`record_samples`: both models' calls per bucket, as many as the timing used, with the outside clock."""
    r = run(task, "correct", record_samples=True)
    assert r.status is Status.CORRECT, r.message
    samples = r.protocol["samples"]
    assert len(samples["ref"]) == len(samples["cand"]) == len(r.timing.bucket_speedups) == 2
    calls = sum(len(b) for b in samples["cand"])
    assert calls == r.timing.iterations
    assert [len(b) for b in samples["cand"]] == [len(b) for b in samples["ref"]]
    ms, stream_ms, bracket_ms, model_ms, idle_us, cpu_ms, call_cpu_ms, after, stage_ms, *helper = samples["cand"][0][0]
    assert 0 < ms <= model_ms <= bracket_ms and stream_ms == ms and after in ("ref", "cand", "")
    assert 0 <= stage_ms <= bracket_ms - model_ms and helper == [None, None]  # no device helper on the CPU
    twin = samples["calibration"]  # the calibration's pairs too: the twin in the candidate's runner
    assert len(twin["ref"][0]) == len(twin["cand"][0]) == r.protocol["calibration"]["pairs"]
    assert 0 < call_cpu_ms and (cpu_ms is None or call_cpu_ms <= cpu_ms)  # the call's CPU time, inside its sandbox's
    assert idle_us is None  # no device helper on the CPU
    assert "samples" not in run(task, "correct").protocol


def test_wrong_shape(task):
    r = run(task, "wrong_shape")
    assert r.status is Status.INCORRECT
    assert "shape" in r.message


def test_raising_forward_is_runtime_error(task):
    r = run(task, "raising")
    assert r.status is Status.RUNTIME_ERROR
    assert "ValueError: kernel launch failed" in r.message


def test_hanging_forward_times_out(task):
    """A forward that never returns is cut by the evaluation's own limit (8 s here, below a step's 30 s floor):
    the verdict names the limit that fired. Not its wall time, which a loaded machine stretches (runners
    starting, calibration: 30.5 s once on a busy 2-core host, for the same 8 s limit)."""
    import re

    r = run(task, "hanging", timeout_s=8.0)
    assert r.status is Status.TIMEOUT, r.message
    limit = re.search(r"(?:did not finish within|exceeded its limit of) (\d+) s", r.message)
    assert limit is not None and int(limit.group(1)) <= 8, r.message


def test_segfault_is_contained(task):
    r = run(task, "segfault")
    assert r.status is Status.RUNTIME_ERROR
    assert "signal 11" in r.message


def test_early_exit_is_contained(task):
    r = run(task, "early_exit")
    assert r.status is Status.RUNTIME_ERROR
    assert "before reporting" in r.message


def test_memory_bomb_is_killed(task):
    r = run(task, "memory_bomb", memory_bytes=2 * 2**30)
    assert r.status is Status.RUNTIME_ERROR
    assert "memory" in r.message


def test_syntax_error_and_missing_class_are_compile_errors(task):
    assert run(task, "syntax_error").status is Status.COMPILE_ERROR
    r = run(task, "no_modelnew", skip_static=True)
    assert r.status is Status.COMPILE_ERROR and "ModelNew" in r.message


def test_unbindable_extension_fails_at_once_with_the_compiler_s_verdict(task):
    r = run(task, "unbound_extension")
    assert r.status is Status.COMPILE_ERROR
    assert r.message.startswith("CUDA build failed: main.cpp: error: 'scale_add' was not declared in this scope")
    # No compiler ran: that log is the build hooks' own verdict, written before any compiler would start (a
    # g++ build of main.cpp alone takes ~20 s; its wall time was asserted here, which a loaded machine crosses).
    assert "declare it there" in r.message and "declare it there" in r.compile_log


def test_a_build_failure_the_candidate_catches_is_reported_beside_the_verdict_for_what_runs(task):
    """Not `compile_error`: the module runs (its fallback), so it gets the verdict and time of what runs, and
    the result says that its CUDA never built (flag, compile log, class by what ran)."""
    r = run(task, "fallback_duplicate_module")
    assert r.status is Status.CORRECT, r.message
    assert [f.severity.value for f in r.flags if f.rule == "runtime.custom_build_failed"] == ["warning"]
    assert "redefinition of 'PyObject* PyInit_dup_scale_add()'" in r.compile_log
    assert r.protocol["builds"] == [{"name": "dup_scale_add", "ok": False}]
    assert r.kernel_class is KernelClass.PYTORCH_ONLY  # the static view (custom_cuda) corrected by what ran
    assert r.speedup is not None


@pytest.mark.parametrize("name, rule", quick_few([
    ("flag_flip", "guard.global_state"),
    ("patch_timer", "guard.timer_patching"),
    ("tensor_subclass", "guard.output_type"),
    ("hidden_thread", "guard.threads"),
], [("flag_flip", "guard.global_state"), ("patch_timer", "guard.timer_patching")]))
def test_runtime_guards_catch_hacks_without_static_analysis(task, name, rule):
    r = run(task, name, skip_static=True)
    assert r.status is Status.HACK_DETECTED, (r.status, r.message)
    assert rule in r.message or any(f.rule == rule for f in r.flags)


def test_result_cache_fails_timed_reverification(task):
    """Returning the first result forever passes trial 0 only; the fresh trial inputs expose it."""
    r = run(task, "first_result_cache", skip_static=True)
    assert r.status is Status.INCORRECT


def test_input_mutation_is_rejected(task):
    r = run(task, "input_mutation", skip_static=True)
    assert r.status is Status.INCORRECT
    assert "in place" in r.message


def test_store_hit_on_identical_evaluation(task, tmp_path):
    store = ResultsStore(tmp_path / "r.sqlite")
    source = (FIXTURES / "eval" / "correct.py").read_text()
    cfg = EvalConfig(**FAST)
    first = evaluate_candidate(task, source, cfg, store=store)
    second = evaluate_candidate(task, source, cfg, store=store)
    assert not first.cached and second.cached
    assert second.speedup == first.speedup
    third = evaluate_candidate(task, source, cfg, store=store, force=True)
    assert not third.cached


def test_resumed_batch_builds_only_what_it_will_evaluate(task, tmp_path, monkeypatch):
    # On a GPU machine evaluate_many builds load_inline candidates first; a candidate whose result is
    # already stored is not evaluated again, so it must not be built either.
    import contextlib

    from cudal1.core.types import EvalResult
    from cudal1.eval import scheduler as pipeline
    from cudal1.tasks.task import source_hash

    env = {"device_type": "cuda", "gpu_name": "test"}
    built, evaluated = [], []
    monkeypatch.setattr(pipeline, "resolve_device", lambda device: "cuda:0")
    monkeypatch.setattr(pipeline, "describe_machine", lambda device: env)
    monkeypatch.setattr(pipeline, "prebuild", lambda items, cfg, **kw: built.extend(s for _, s in items))
    filled = []
    monkeypatch.setattr(pipeline, "runner_supply",
                        lambda device, *a, **kw: contextlib.nullcontext(SimpleNamespace(fill=lambda: filled.append(1),
                                                                              pin=lambda *a, **kw: None)))
    monkeypatch.setattr(pipeline, "evaluate_candidate",
                        lambda t, s, cfg, **kw: evaluated.append(s) or EvalResult(status=Status.CORRECT))
    done, todo = "# load_inline candidate A\n", "# load_inline candidate B\n"
    cfg = EvalConfig(device="cuda")
    with ResultsStore(tmp_path / "r.sqlite") as store:
        key, _ = store.lookup(task.hash, source_hash(done), cfg.resolved("cuda:0").protocol(), env)
        store.put_evaluation(EvalResult(status=Status.CORRECT, speedup=1.5), task_hash=task.hash, key=key)
        pipeline.evaluate_many([(task, done), (task, todo)], cfg, store=store)
        assert built == [todo] and evaluated == [done, todo]  # the stored one is read back, not rebuilt
        assert filled == [1]  # runners started before the builds
        built.clear()
        pipeline.evaluate_many([(task, done), (task, todo)], cfg, store=store, force=True)
        assert built == [done, todo]


def _fake_gpu_batch(monkeypatch, build_release):
    """evaluate_many on a pretend GPU whose builds finish only when `build_release` is set."""
    import contextlib

    from cudal1.core.types import EvalResult
    from cudal1.eval import scheduler as pipeline

    evaluated, pins, build_cpus, warm = [], [], [], []

    def slow_prebuild(items, cfg, on_build=None, on_item=None, threads=None, should_cancel=None, cpus=None,
                      warm_lazy=False):
        assert threads is not None and threads >= 1
        build_cpus.append(cpus)
        warm.append(warm_lazy)
        assert build_release.wait(timeout=30)
        for i in range(len(items)):
            if should_cancel():
                evaluated.append("cancelled")
                break
            on_item(i)

    monkeypatch.setattr(pipeline, "resolve_device", lambda device: "cuda:0")
    monkeypatch.setattr(pipeline, "prebuild", slow_prebuild)
    monkeypatch.setattr(pipeline, "core_split", lambda device: CoreSplit(runners=frozenset({0, 1}),
                                                                        others=frozenset({2, 3, 4})))
    monkeypatch.setattr(pipeline, "runner_supply",
                        lambda device, *a, **kw: contextlib.nullcontext(SimpleNamespace(
                            fill=lambda: None, pin=lambda cpus, others=None: pins.append((cpus, others)))))
    monkeypatch.setattr(pipeline, "evaluate_candidate",
                        lambda t, s, cfg, **kw: evaluated.append(s) or EvalResult(status=Status.CORRECT, message=s))
    return pipeline, evaluated, pins, build_cpus, warm


def test_batch_evaluates_while_builds_run_and_returns_input_order(task, monkeypatch):
    # The GPU must not idle while load_inline candidates compile: candidates without a build go first,
    # each built one as soon as its build is done; results still come back in input order.
    import threading

    release = threading.Event()
    pipeline, evaluated, pins, build_cpus, warm = _fake_gpu_batch(monkeypatch, release)
    sources = ["# load_inline A\n", "# plain B\n", "# load_inline C\n", "# plain D\n"]
    seen = []

    def on_result(i, result):
        seen.append((i, result.message))
        if len(seen) == 2:  # both plain ones ran before any build finished
            release.set()

    results = pipeline.evaluate_many([(task, s) for s in sources], EvalConfig(device="cuda"), on_result=on_result,
                                     overlap_builds=True)
    assert evaluated == [sources[1], sources[3], sources[0], sources[2]]
    assert seen == [(1, sources[1]), (3, sources[3]), (0, sources[0]), (2, sources[2])]
    assert [r.message for r in results] == sources
    # The timed runner on cores of its own while compilers (and starting runners) use the rest; all cores
    # again once the builds are done.
    assert build_cpus == [frozenset({2, 3, 4})]
    assert warm == [False]  # no forward on the GPU while it times another candidate
    assert pins[0] == (frozenset({0, 1}), frozenset({2, 3, 4})) and set(pins[1:]) == {(None, None)}


def test_batch_stopped_while_builds_run_leaves_the_rest_unevaluated(task, monkeypatch):
    import threading

    release = threading.Event()
    pipeline, evaluated, _, _, _ = _fake_gpu_batch(monkeypatch, release)
    sources = ["# load_inline A\n", "# plain B\n", "# load_inline C\n"]
    stop = threading.Event()

    def on_result(i, result):
        stop.set()  # a budget that runs out after the first candidate: its builds are not started
        threading.Timer(1.5, release.set).start()  # after the batch has seen the stop

    results = pipeline.evaluate_many([(task, s) for s in sources], EvalConfig(device="cuda"),
                                     on_result=on_result, should_stop=stop.is_set, overlap_builds=True)
    assert evaluated == [sources[1], "cancelled"]
    assert results[0] is None and results[1].message == sources[1] and results[2] is None


def test_batch_by_default_builds_first_then_evaluates_in_input_order(task, monkeypatch):
    # The quiet default: no candidate is timed while compilers load the host.
    import threading

    release = threading.Event()
    pipeline, evaluated, pins, build_cpus, warm = _fake_gpu_batch(monkeypatch, release)
    sources = ["# load_inline A\n", "# plain B\n"]
    timed_while_building = []
    real = pipeline.evaluate_candidate
    monkeypatch.setattr(pipeline, "evaluate_candidate",
                        lambda *a, **kw: timed_while_building.append(not release.is_set()) or real(*a, **kw))
    threading.Timer(0.3, release.set).start()
    results = pipeline.evaluate_many([(task, s) for s in sources], EvalConfig(device="cuda"))
    assert evaluated == sources and timed_while_building == [False, False]
    assert [r.message for r in results] == sources
    assert build_cpus == [None] and set(pins) == {(None, None)}  # builds first: every core for them
    assert warm == [True]  # and the idle GPU for the lazy builds of a forward


def test_each_gpu_times_on_cores_of_its_own(monkeypatch):
    # Runners starting (torch, a CUDA context) beside a timed pair slowed its launches; each GPU keeps cores
    # for its timed processes (the two model runners, its helper, the parent's evaluating thread) and the
    # spares and builds run on the rest: one policy, `core_split`.
    import os

    from cudal1.eval.supply import RunnerSupply, core_split

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(16)), raising=False)
    first = core_split("cuda")
    assert first == core_split("cuda:0")
    assert (first.runners, first.helper, first.parent) == (frozenset({0, 1}), frozenset({2}), frozenset({3}))
    assert first.others == frozenset(range(4, 16))
    assert core_split("cuda:1").runners == frozenset({4, 5}) and core_split("cuda:3").parent == frozenset({15})
    assert core_split("cuda:4") is None  # past the host's cores: not pinned rather than shared
    assert core_split("cpu").runners == frozenset({0, 1}) and core_split("cpu").helper is None
    supply = RunnerSupply("cuda:1", spares=0)
    assert supply.timed_cores == frozenset({4, 5})
    supply.pin(frozenset({5}), others=frozenset({6}))
    assert supply.timed_cores == frozenset({5})
    supply.pin(None)  # back to the GPU's own split, not every core
    assert supply.timed_cores == frozenset({4, 5})
    assert RunnerSupply("cpu", spares=0).timed_cores is None
    # One process per GPU (CUDA_VISIBLE_DEVICES=N): each still gets its GPU's own cores, not cores 0-3.
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2")
    assert core_split("cuda").runners == frozenset({8, 9})
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-5d1b2c3e")  # named by UUID: the visible index
    assert core_split("cuda").runners == frozenset({0, 1})
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3, 4}, raising=False)
    assert core_split("cuda:0") is None  # too few to keep two for the rest
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2}, raising=False)
    assert core_split("cpu") is None


def test_a_forged_report_is_bounded_by_the_parents_clock(task, monkeypatch):
    """The candidate's reported times are divided by 50 inside its runner: the parent's brackets bound them,
    the verdict names the forgery, and no fake speedup is paid.

    It failed 11 of 17 runs on a loaded 2-core host when the forged call was the task's own (~0.05 ms): these
    reduced settings time 12 pairs, and there the bound's slack (3 standard errors of the brackets' lower
    quartile, which preemptions of milliseconds spread) exceeded the whole call, so no clock could tell the
    forgery from an honest report. The forger now sleeps 50 ms per call: its brackets cannot be shorter, its
    report says 1 ms, and the rejection (bound less its noise above twice the report) fails only if the
    brackets' median lay over 60 ms above their minimum."""
    from cudal1.core import flags as F

    r = run(task, "forged_clock", skip_static=True)  # the runtime's own verdict, not the static filter's
    assert r.status is Status.HACK_DETECTED, (r.status, r.message)
    assert any(f.rule in (F.OUTSIDE_CLOCK, F.BELOW_FLOOR) for f in r.flags), r.flags


_NUMERICS_TASK = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    """Returns x plus 1 for each TF32 switch that is on: its output shows the numerics it runs under."""

    def forward(self, x):
        on = torch.backends.cudnn.allow_tf32 + torch.backends.cuda.matmul.allow_tf32
        return x + float(on)


def get_inputs():
    return [torch.randn(8, 8)]


def get_init_inputs():
    return []
'''

_PLAIN_COPY = '''
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x):
        return x.clone()
'''


@pytest.mark.parametrize(("profile", "exact_fp32", "status"), quick_few([
    ("strict", None, Status.CORRECT),  # strict runs both models with TF32 off
    ("kernelbench-v0", None, Status.INCORRECT),  # PyTorch's default: cuDNN may use TF32
    ("kernelbench-v0", True, Status.CORRECT),
    ("strict", False, Status.INCORRECT),
], [("strict", None, Status.CORRECT), ("kernelbench-v0", None, Status.INCORRECT)]))
def test_fp32_numerics_of_both_models_follow_the_profile(profile, exact_fp32, status):
    from cudal1.tasks.task import Task

    task = Task(id="test/numerics", source=_NUMERICS_TASK)
    r = evaluate_candidate(task, _PLAIN_COPY, EvalConfig(**{**FAST, "profile": profile, "exact_fp32": exact_fp32}))
    assert r.status is status, r.message
    assert r.protocol["exact_fp32"] is (status is Status.CORRECT)


_NEW_API_TF32 = '''
import torch
import torch.nn as nn

{line}


class ModelNew(nn.Module):
    def forward(self, x):
        return x.clone()
'''


_SWITCHES = """
import torch
import torch.nn as nn

{setup}


class ModelNew(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.bias = nn.Parameter(torch.randn(dim))

    def forward(self, x):
        return {body}
"""


def test_an_algorithm_switch_is_reported_not_rejected_even_under_strict(task):
    """cuDNN autotuning and determinism keep float32 arithmetic and reach only the candidate's own process:
    judged by effect, like any code (flagged, class flags_only), where the old rule rejected them."""
    setup = "torch.backends.cudnn.benchmark = True\ntorch.use_deterministic_algorithms(True)"
    source = _SWITCHES.format(setup=setup, body="x * 2.0 + self.bias")
    r = evaluate_candidate(task, source, EvalConfig(**{**FAST, "profile": "strict"}))
    assert r.status is Status.CORRECT, r.message
    rules = {f.rule: f.severity.value for f in r.flags}
    assert rules.get("algorithm_flags") == "warning" and rules.get("guard.algorithm_flags") == "warning"
    assert "global_backend_flags" not in rules and "guard.global_state" not in rules
    assert r.kernel_class is KernelClass.FLAGS_ONLY


def test_reduced_precision_names_the_switch_the_candidate_set(task):
    """A precision switch is judged by what it does to the numbers: the precision check catches the reduced
    precision and names the switch (cuda-l1 does not reject it; strict rejects the switch itself)."""
    setup = "torch.backends.cuda.matmul.allow_tf32 = True"
    source = _SWITCHES.format(setup=setup, body="(x.half() * 2.0 + self.bias.half()).float()")
    r = evaluate_candidate(task, source, EvalConfig(**{**FAST, "profile": "cuda-l1"}))
    assert r.status is Status.CORRECT, r.message
    [reduced] = [f for f in r.flags if f.rule == "guard.reduced_precision"]
    assert "precision switches: cuda.matmul.allow_tf32 changed from False to True" in reduced.message
    strict = evaluate_candidate(task, source, EvalConfig(**{**FAST, "profile": "strict"}))
    assert strict.status is Status.HACK_DETECTED and "global_backend_flags" in strict.message


@pytest.mark.skipif(not hasattr(__import__("torch")._C, "_get_fp32_precision_getter"),
                    reason="PyTorch without the fp32_precision API")
@pytest.mark.parametrize("line", quick_few([
    'torch.backends.cudnn.conv.fp32_precision = "tf32"',
    'torch.backends.fp32_precision = "tf32"',
    'torch.backends.cuda.matmul.fp32_precision = "tf32"',
    'torch.backends.mkldnn.conv.fp32_precision = "tf32"',
], ['torch.backends.fp32_precision = "tf32"']))
@pytest.mark.parametrize(("profile", "status"), [("strict", Status.HACK_DETECTED), ("cuda-l1", Status.CORRECT)])
def test_tf32_turned_on_through_the_fp32_precision_api_is_flagged(line, profile, status):
    """The newer per-backend switches are guarded like the legacy flags: a named change, never a crash."""
    from cudal1.tasks.task import Task

    task = Task(id="test/numerics", source=_NUMERICS_TASK.replace("float(on)", "0.0"))
    # Static analysis would reject the line first; this is about the runtime guard behind it.
    cfg = EvalConfig(**{**FAST, "profile": profile, "skip_static": True})
    r = evaluate_candidate(task, _NEW_API_TF32.format(line=line), cfg)
    assert r.status is status, r.message  # never a runtime_error from PyTorch's mixed-API checks
    if profile == "strict":  # from true fp32, any of these is a change, named by its switch
        assert any(f.rule == "guard.global_state" and "fp32_precision" in f.message for f in r.flags), r.flags


def test_a_noisy_measurement_is_flagged_measured_again_and_both_shown(task):
    # One call per bracket: the fixture's sleeps cycle per call (1 ms x4, 8 ms x4), and a bracket holding a whole
    # cycle would sum them away. Its buckets' stability is about 0.8 or more in any phase (threshold 0.25).
    settings = dict(buckets=8, target_bucket_ms=1.0, min_iters_per_bucket=2, warm_buckets=0, bracket_work_ms=0.0)
    r = run(task, "noisy", **settings)
    assert r.status is Status.CORRECT, r.message
    (noisy,) = [f for f in r.flags if f.rule == "timing.noisy"]
    assert noisy.severity.value == "info" and "measured again" in noisy.message and noisy.message.count("x (") == 2
    assert r.stability is not None
    quiet = run(task, "noisy", noisy_stability=0.0, **settings)  # 0: never re-measured
    assert quiet.status is Status.CORRECT and not any(f.rule == "timing.noisy" for f in quiet.flags)


_CUDA_BUILD = ("import torch\nfrom torch.utils.cpp_extension import load_inline\n"
               "ext = load_inline(name='k', cpp_sources='', cuda_sources='__global__ void k() {}')\n"
               "class ModelNew(torch.nn.Module):\n    def forward(self, x, b):\n        return x\n")
# What the CUDA build of torch (the one `pip install` brings by default) has on a machine without a GPU: a CUDA
# version and a CUDA_HOME, and no device. Its load_inline then fails in its arch detection (`arch_list[-1]` of
# an empty list: "IndexError: list index out of range"), which no message pattern of a CPU build matches.
_AS_THE_CUDA_BUILD_OF_TORCH = ("import torch\nimport torch.utils.cpp_extension\n"
                               "torch.version.cuda = '12.8'\ntorch.utils.cpp_extension.CUDA_HOME = '/usr/local/cuda'\n")


@pytest.mark.parametrize("torch_build", ["cpu", "cuda"])
def test_a_cuda_build_on_a_machine_without_a_gpu_says_so(task, tmp_path, torch_build):
    """Not a compile error of the candidate ("CUDA_HOME not set" with a CPU build of torch, "IndexError: list
    index out of range" with its CUDA build, each stored as the candidate's): no verdict at all, and nothing
    stored. The candidate's runner refuses the build because it has no GPU, whatever torch would have said."""
    source = _CUDA_BUILD if torch_build == "cpu" else _AS_THE_CUDA_BUILD_OF_TORCH + _CUDA_BUILD
    if torch_build == "cuda":  # the torch path as the CUDA build takes it, without the hooks: that error
        import subprocess
        import sys

        probe = tmp_path / "probe.py"
        probe.write_text(source)
        run_it = subprocess.run([sys.executable, str(probe)], capture_output=True, text=True, timeout=120,
                                env={"PATH": "/usr/bin:/bin", "TORCH_EXTENSIONS_DIR": str(tmp_path)})
        assert "IndexError: list index out of range" in run_it.stderr, run_it.stderr[-2000:]
    store = ResultsStore(tmp_path / "store.sqlite")
    # skip_static: the simulation patches torch, which the static filter rejects (not what is tested here).
    r = evaluate_candidate(task, source, EvalConfig(**FAST, skip_static=True), store=store)
    assert r.status is Status.INFRA_ERROR and "needs a GPU" in r.message, r.message
    assert "no GPU" in r.message and "IndexError" not in r.message and "CUDA_HOME" not in r.message
    assert not r.status.is_verdict and store.query_evaluations() == []


_RAW_COPY = """import torch
from cudal1.raw_cuda import load_kernels

kernels = load_kernels('extern "C" __global__ void copy(const float* x, float* y, int n) '
                       '{ int i = blockIdx.x * blockDim.x + threadIdx.x; if (i < n) y[i] = x[i]; }')


class ModelNew(torch.nn.Module):
    def forward(self, x):
        y = torch.empty_like(x)
        kernels.copy(grid=((x.numel() + 255) // 256,), block=(256,), args=(x, y, x.numel()))
        return y
"""


def test_a_raw_cuda_candidate_on_a_machine_without_a_gpu_says_so(task):
    """it was stored as the candidate's runtime_error ("CUDA is not available"), unlike load_inline."""
    r = evaluate_candidate(task, _RAW_COPY, EvalConfig(**FAST))
    assert r.status is Status.INFRA_ERROR and "needs a GPU" in r.message, r.message
    assert not r.status.is_verdict


def test_verbose_logs_each_evaluation_with_its_phases(task, caplog):
    with caplog.at_level("INFO", logger="cudal1.eval.pipeline"):
        r = run(task, "correct")
    (line,) = [rec.getMessage() for rec in caplog.records if rec.name == "cudal1.eval.pipeline"]
    assert r.status is Status.CORRECT and "correct" in line and "static" in line and "run" in line


@pytest.mark.parametrize(("body", "status"), [
    ("return torch.add(x.float() * 2.0, 1.0).to(torch.float8_e4m3fn)", Status.CORRECT),
    ("return (x.float() * 2.0).to(torch.float8_e4m3fn)", Status.INCORRECT),
])
def test_fp8_inputs_and_outputs_get_a_verdict(body, status):
    """fp8 dtypes implement almost no ops: a check that called one (isfinite) crashed the evaluation, and the
    candidate's fp8 was taken for a downcast although the reference computes in fp8 itself."""
    fp8 = load_file(FIXTURES / "tasks" / "fp8_in_out.py")
    source = f"import torch\nimport torch.nn as nn\n\n\nclass ModelNew(nn.Module):\n    def forward(self, x):\n        {body}\n"
    r = evaluate_candidate(fp8, source, EvalConfig(**FAST))
    assert r.status is status, r.message
    assert not any(f.rule == "precision_downcast" for f in r.flags)


def test_the_result_says_which_sizes_really_ran(task):
    """`sizes=small` (the CPU default) applies only to tasks with SMALL_SIZES; release and KernelBench tasks run
    at full size, and the result now says so instead of only "small"."""
    from cudal1.eval.pipeline import sizes_applied
    from cudal1.tasks.sources import load_builtin

    with_small = next(t for t in load_builtin() if "SMALL_SIZES" in t.source)
    assert sizes_applied(with_small, "small") == "small" and sizes_applied(with_small, "full") == "full"
    r = run(task, "correct", sizes="small")  # the tiny task has no SMALL_SIZES
    assert r.protocol["sizes"] == "small" and r.protocol["sizes_applied"].startswith("full")


def test_torch_compile_machinery_is_not_the_candidate_s_thread(task):
    """Inductor's compile pool and tqdm's monitor were new Python threads in the candidate's runner, so any
    candidate using torch.compile was `hack_detected` by the thread guard."""
    # Inductor compiles on the first call, cold in the sandbox's private folder: over 30 s on a loaded 2-core
    # machine, so the step's floor is raised (this test is about threads, not time).
    r = run(task, "torch_compiled", timeout_s=300.0, phase_floor_s=180.0)
    assert r.status is Status.CORRECT, r.message
    assert not [f for f in r.flags if f.rule == "guard.threads"]


def test_every_call_of_a_trials_bracket_is_compared(task):
    # A cache that returns its first result: with three calls per bracket the first trial's second call
    # already answers wrong; with one call per bracket only a timed call finds it.
    many = run(task, "first_result_cache", correctness_trials=1, extra_trials=0, bracket_work_ms=1e3,
               max_calls_per_bracket=3, skip_static=True)
    assert many.status is Status.INCORRECT and "timed run" not in many.message, many.message
    one = run(task, "first_result_cache", correctness_trials=1, extra_trials=0, bracket_work_ms=0.0, skip_static=True)
    assert one.status is Status.INCORRECT and "timed run" in one.message, one.message


def test_a_small_models_calls_share_a_bracket_and_each_is_timed_on_its_own_inputs(task):
    r = run(task, "correct", bracket_work_ms=1e3, max_calls_per_bracket=4, record_samples=True)
    assert r.status is Status.CORRECT, r.message
    assert r.protocol["clock"]["calls_per_bracket"] == 4 and r.protocol["calibration"]["calls"] == 4
