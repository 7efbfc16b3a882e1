"""Decoy-kernel detection (cudal1.eval.decoys, inside.profiling, shared.kernel_profile): kernel-name matching, the decoy guard on synthetic profiles, the real profiler.

CPU tests build `KernelProfile`s directly (and fake profiler events) and run the real `torch.profiler` on
CPU; the GPU tests profile a raw-CUDA kernel, a Triton kernel and a PyTorch-only forward.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from cudal1.analysis import StaticReport, analyze_source
from cudal1.core.types import Flag, KernelClass, Severity
from cudal1.eval.decoys import decoy_flags, own_kernel_names, own_kernel_share, reclassify
from cudal1.eval.inside.profiling import profile_call, profile_from_events
from cudal1.eval.shared.kernel_profile import KernelProfile, KernelStat, kernel_matches, split_kernel_name

_CLAMP_LAMBDA = ("at::native::(anonymous namespace)::launch_clamp_scalar(at::TensorIteratorBase&, "
                 "c10::Scalar, c10::Scalar, at::native::detail::ClampLimits)::{lambda()#1}::"
                 "operator()() const::"
                 "{lambda(float)#1}")
# How the profiler names PyTorch's clamp (ReLU) kernel: templates holding lambdas with their own parentheses.
ATEN_CLAMP = (f"void at::native::vectorized_elementwise_kernel<4, {_CLAMP_LAMBDA}, "
              f"at::detail::Array<char*, 2> >(int, {_CLAMP_LAMBDA}, at::detail::Array<char*, 2>)")
CUBLAS_GEMM = ("sm90_xmma_gemm_f32f32_tf32f32_f32_tn_n_tilesize128x128x32_warpgroupsize1x1x1_"
               "execute_kernel__5x_cublas")


def custom_report(*names: str, triton: tuple[str, ...] = ()) -> StaticReport:
    cls = KernelClass.TRITON if triton and not names else KernelClass.CUSTOM_CUDA
    return StaticReport(kernel_class=cls, kernels_defined=list(names), kernels_launched=list(names),
                        triton_kernels_defined=list(triton), triton_kernels_launched=list(triton))


def gpu_profile(*stats: tuple[str, int, float] | tuple[str, int, float, str]) -> KernelProfile:
    return KernelProfile(kernels=[KernelStat(*s) for s in stats], device="cuda")


# ------------------------------------------------------------------------------------------- names
@pytest.mark.parametrize("name, expected", [
    ("_Z11relu_kernelPKfPfi", ("", "relu_kernel")),  # extern "C++" mangled
    ("_ZL11relu_kernelPKfPfi", ("", "relu_kernel")),  # static (internal linkage)
    ("_Z11relu_kernelIfEvPKT_PS0_i", ("", "relu_kernel")),  # template instance
    ("_ZN12_GLOBAL__N_111relu_kernelIfEEvPKT_PS1_i", ("{anon}", "relu_kernel")),  # anonymous namespace
    ("_ZN2my11relu_kernelEPKfPfi", ("my", "relu_kernel")),
    ("void relu_kernel<float>(float const*, float*, int)", ("", "relu_kernel")),
    ("relu_kernel(float const*, float*, int)", ("", "relu_kernel")),
    ("void (anonymous namespace)::relu_kernel<float, 4>(float const*, float*, int)",
     ("{anon}", "relu_kernel")),
    ("relu_kernel", ("", "relu_kernel")),  # extern "C" (raw-CUDA form) and Triton >= 3
    (ATEN_CLAMP, ("at::native", "vectorized_elementwise_kernel")),
    ("void cutlass::Kernel2<cutlass_80_simt_sgemm_128x64_8x5_nn_align1>(cutlass_80_simt_sgemm_128x64_8x5_nn_"
     "align1::Params)", ("cutlass", "Kernel2")),
    ("", ("", "")),
])
def test_split_kernel_name_handles_mangled_demangled_and_templated_forms(name, expected):
    assert split_kernel_name(name) == expected


def test_itanium_fallback_reads_the_nested_names_without_torch(monkeypatch):
    monkeypatch.setattr(torch._C, "_demangle", lambda s: s)  # a demangler that cannot demangle
    assert split_kernel_name("_ZN3foo11relu_kernelEPKfPfi") == ("foo", "relu_kernel")
    assert split_kernel_name("_Z11relu_kernelPKfPfi") == ("", "relu_kernel")


@pytest.mark.parametrize("name, own, expected", [
    ("_Z11relu_kernelPKfPfi", "relu_kernel", True),
    ("void (anonymous namespace)::relu_kernel<float>(float const*, float*, int)", "relu_kernel", True),
    ("relu_kernel_0d1d2de", "relu_kernel", True),  # Triton <= 2.1 specialization suffix
    ("relu_kernel", "my_ns::relu_kernel", True),  # a qualified own name matches by its base
    ("relu_kernel2(float const*, float*, int)", "relu_kernel", False),  # a longer name is another kernel
    ("relu_kernel_fast", "relu_kernel", False),  # a suffix that is not a Triton specialization
    ("relu(float const*, float*, int)", "relu_kernel", False),
    ("void at::native::elementwise_kernel<128, 2>(int)", "elementwise_kernel", False),  # library namespace
    ("triton_poi_fused_relu_0", "relu_kernel", False),  # an Inductor kernel is not the candidate's
    (CUBLAS_GEMM, "gemm", False),
    ("relu_kernel", "", False),
])
def test_kernel_matches(name, own, expected):
    assert kernel_matches(name, own) is expected


def test_own_kernel_names_merges_static_triton_and_raw_without_duplicates():
    report = custom_report("relu_kernel", triton=("add_kernel",))
    names = own_kernel_names(report, ["relu_kernel", "scale_kernel"])
    assert names == ["relu_kernel", "add_kernel", "scale_kernel"]
    assert own_kernel_names(None, ["k"]) == ["k"]


def test_own_kernel_names_from_a_real_static_report(corpus_dir):
    source = (corpus_dir / "honest" / "cuda_relu.py").read_text()
    assert own_kernel_names(analyze_source(source)) == ["relu_kernel"]


@pytest.fixture
def corpus_dir():
    from pathlib import Path

    return Path(__file__).resolve().parents[1] / "fixtures" / "candidates"


# ------------------------------------------------------------------------------------------- shares
def test_own_kernel_share_counts_only_the_candidates_kernels():
    prof = gpu_profile(("void relu_kernel<float>(float const*, float*, int)", 2, 30.0),
                       (ATEN_CLAMP, 1, 60.0), ("Memcpy DtoD (Device -> Device)", 1, 10.0, "memcpy"))
    assert prof.total_us == pytest.approx(100.0)
    assert own_kernel_share(prof, ["relu_kernel"]) == pytest.approx(0.30)
    assert own_kernel_share(prof, ["other"]) == 0.0
    assert own_kernel_share(KernelProfile(device="cuda"), ["relu_kernel"]) == 0.0


def test_a_memcpy_never_counts_as_an_own_kernel():
    prof = gpu_profile(("relu_kernel", 1, 5.0, "memcpy"), ("x", 1, 5.0))
    assert own_kernel_share(prof, ["relu_kernel"]) == 0.0


# ------------------------------------------------------------------------------------------- decoy guard
def test_decoy_when_none_of_the_defined_kernels_ran():
    prof = gpu_profile((ATEN_CLAMP, 1, 12.0))
    flags = decoy_flags(prof, custom_report("relu_kernel"))
    assert [(f.rule, f.severity, f.source) for f in flags] == [
        ("guard.decoy_kernel", Severity.WARNING, "runtime")]
    assert "relu_kernel" in flags[0].message and "vectorized_elementwise_kernel" in flags[0].message
    assert reclassify(KernelClass.CUSTOM_CUDA, flags) is KernelClass.PYTORCH_ONLY
    assert reclassify("triton", flags) is KernelClass.PYTORCH_ONLY
    assert reclassify(KernelClass.CUSTOM_CUDA, []) is KernelClass.CUSTOM_CUDA
    assert reclassify(None, flags) is None


def test_cuda_that_never_built_counts_as_what_ran():
    """Every extension build failed and the candidate ran its fallback: not custom, whatever the source says."""
    failed, built = [{"name": "ext", "ok": False}], [{"name": "ext", "ok": False}, {"name": "other", "ok": True}]
    assert reclassify(KernelClass.CUSTOM_CUDA, [], builds=failed) is KernelClass.PYTORCH_ONLY
    assert reclassify(KernelClass.CUSTOM_CUDA, [], builds=built) is KernelClass.CUSTOM_CUDA
    assert reclassify(KernelClass.CUSTOM_CUDA, [], builds=failed, own_launcher=True) is KernelClass.CUSTOM_CUDA
    assert reclassify(KernelClass.TRITON, [], builds=failed) is KernelClass.TRITON
    sets_tf32 = [Flag("global_backend_flags", Severity.ERROR, "sets torch.backends.cuda.matmul.allow_tf32")]
    assert reclassify(KernelClass.CUSTOM_CUDA, sets_tf32, builds=failed) is KernelClass.FLAGS_ONLY


def test_low_share_is_info_and_the_threshold_is_configurable():
    prof = gpu_profile((CUBLAS_GEMM, 1, 95.0), ("_Z11bias_kernelPfPKfi", 1, 5.0))
    flags = decoy_flags(prof, custom_report("bias_kernel"))
    assert [(f.rule, f.severity) for f in flags] == [("guard.low_custom_share", Severity.INFO)]
    assert "5.0%" in flags[0].message
    assert decoy_flags(prof, custom_report("bias_kernel"), min_share=0.05) == []
    assert reclassify(KernelClass.CUSTOM_CUDA, flags) is KernelClass.CUSTOM_CUDA
    with pytest.raises(ValueError):
        decoy_flags(prof, custom_report("bias_kernel"), min_share=1.5)


def test_defined_kernels_that_never_ran_are_reported():
    prof = gpu_profile(("relu_kernel(float const*, float*, int)", 1, 50.0))
    flags = decoy_flags(prof, custom_report("relu_kernel", "relu_kernel_vec4"))
    assert [f.rule for f in flags] == ["guard.kernels_not_run"]
    assert "relu_kernel_vec4" in flags[0].message


def test_an_honest_custom_kernel_gets_no_flag():
    prof = gpu_profile(("void relu_kernel<float>(float const*, float*, int)", 1, 40.0), (ATEN_CLAMP, 1, 1.0))
    assert decoy_flags(prof, custom_report("relu_kernel")) == []


def test_triton_and_raw_kernel_names_count_as_own():
    prof = gpu_profile(("relu_kernel_0d1d2de", 1, 8.0))
    assert decoy_flags(prof, custom_report(triton=("relu_kernel",))) == []
    prof = gpu_profile(("scale_kernel", 1, 8.0))
    report = StaticReport(kernel_class=KernelClass.CUSTOM_CUDA)  # static analysis saw no names
    assert decoy_flags(prof, report, raw_kernel_names=["scale_kernel"]) == []
    flags = decoy_flags(prof, report, raw_kernel_names=["other_kernel"])
    assert [f.rule for f in flags] == ["guard.decoy_kernel"]


@pytest.mark.parametrize("kernel_class", [KernelClass.PYTORCH_ONLY, KernelClass.FLAGS_ONLY, "pytorch_only"])
def test_other_classes_are_not_checked(kernel_class):
    prof = gpu_profile((ATEN_CLAMP, 1, 12.0))
    assert decoy_flags(prof, custom_report("relu_kernel"), kernel_class) == []


def test_unavailable_cpu_and_nameless_profiles_give_no_decoy_flag():
    report = custom_report("relu_kernel")
    assert decoy_flags(KernelProfile(device="cuda", available=False, note="x"), report) == []
    assert decoy_flags(KernelProfile(kernels=[KernelStat(ATEN_CLAMP, 1, 3.0)], device="cpu"), report) == []
    nameless = StaticReport(kernel_class=KernelClass.CUSTOM_CUDA)
    assert decoy_flags(gpu_profile((ATEN_CLAMP, 1, 3.0)), nameless) == []


def test_no_gpu_work_at_all_is_only_informative():
    flags = decoy_flags(KernelProfile(device="cuda"), custom_report("relu_kernel"))
    assert [(f.rule, f.severity) for f in flags] == [("guard.no_gpu_work", Severity.INFO)]


# ------------------------------------------------------------------------------------------- the type
def test_profile_round_trips_and_describes_itself():
    prof = gpu_profile(("_Z11relu_kernelPKfPfi", 3, 75.0), (ATEN_CLAMP, 1, 25.0),
                       ("Memset (Device)", 1, 0.5, "memset"))
    d = prof.to_dict()
    assert d["total_us"] == pytest.approx(100.5) and d["kernels"][0]["calls"] == 3
    assert KernelProfile.from_dict(d) == prof
    line = prof.describe()
    assert "\n" not in line and line.startswith("3 GPU kernels/ops, 5 calls")
    assert "relu_kernel 75% (3x)" in line and "at::native::vectorized_elementwise_kernel 25%" in line
    assert "unavailable" in KernelProfile(device="cuda", available=False, note="busy").describe()
    assert KernelProfile(device="cpu").describe() == "no GPU activity recorded on cpu"


def _event(name, us, device="DeviceType.CUDA", activity="kernel", annotation=False):
    return SimpleNamespace(name=name, device_type=device, activity_type=activity,
                           is_user_annotation=annotation, time_range=SimpleNamespace(elapsed_us=lambda: us))


def test_profile_from_events_keeps_gpu_work_and_aggregates_by_name():
    events = [_event("relu_kernel", 4.0), _event("relu_kernel", 6.0),
              _event("Memcpy HtoD", 2.0, activity="gpu_memcpy"),
              _event("aten::relu", 50.0, device="DeviceType.CPU", activity="cpu_op"),
              _event("cudaLaunchKernel", 9.0, device="DeviceType.CPU", activity="cuda_runtime"),
              _event("forward", 30.0, activity="gpu_user_annotation"),
              _event("range", 30.0, activity=None, annotation=True)]
    prof = profile_from_events(events, "cuda", wall_ms=1.0)
    assert [(k.name, k.calls, k.total_us, k.kind) for k in prof.kernels] == [
        ("relu_kernel", 2, 10.0, "kernel"), ("Memcpy HtoD", 1, 2.0, "memcpy")]


# ------------------------------------------------------------------------------------------- real profiler
def test_real_profiler_on_cpu_returns_an_empty_gpu_profile():
    x = torch.randn(64, 64)
    calls = []
    prof = profile_call(lambda: calls.append(torch.relu(x) @ x), torch.device("cpu"))
    assert len(calls) == 1  # exactly one forward
    assert prof.available and prof.device == "cpu" and prof.kernels == [] and prof.total_us == 0.0
    assert prof.wall_ms is not None and prof.wall_ms >= 0
    assert decoy_flags(prof, custom_report("relu_kernel")) == []


def test_exceptions_of_the_profiled_call_propagate():
    def boom():
        raise RuntimeError("candidate failed")

    with pytest.raises(RuntimeError, match="candidate failed"):
        profile_call(boom, "cpu")


def test_a_profiler_that_cannot_start_gives_an_unavailable_profile(monkeypatch):
    import torch.profiler

    def refuse(*args, **kwargs):
        raise RuntimeError("profiler already enabled")

    monkeypatch.setattr(torch.profiler, "profile", refuse)
    calls = []
    prof = profile_call(lambda: calls.append(1), "cuda")
    assert not prof.available and "already enabled" in prof.note and calls == []
    assert decoy_flags(prof, custom_report("relu_kernel")) == []


# ------------------------------------------------------------------------------------------- GPU
RAW_RELU = r"""
extern "C" __global__ void cudal1_profiling_relu(const float* __restrict__ x, float* __restrict__ y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = fmaxf(x[i], 0.0f);
}
"""


@pytest.mark.gpu
def test_gpu_profile_of_a_raw_cuda_kernel_and_of_a_torch_only_forward():
    from cudal1.raw_cuda import launch_log, load_kernels

    kernels = load_kernels(RAW_RELU)
    x = torch.randn(1 << 20, device="cuda")
    y = torch.empty_like(x)
    n = x.numel()

    def raw_forward():
        kernels.cudal1_profiling_relu(grid=((n + 255) // 256,), block=(256,), args=(x, y, n))

    raw_forward()  # load the module and warm up outside the profile
    torch.cuda.synchronize()
    prof = profile_call(raw_forward, torch.device("cuda"))
    assert prof.available, prof.note
    assert any(kernel_matches(k.name, "cudal1_profiling_relu") for k in prof.kernels), prof.describe()
    assert own_kernel_share(prof, ["cudal1_profiling_relu"]) > 0.9, prof.describe()
    assert "cudal1_profiling_relu" in launch_log().defined_kernels
    report = StaticReport(kernel_class=KernelClass.CUSTOM_CUDA, kernels_defined=["cudal1_profiling_relu"])
    assert decoy_flags(prof, report) == []

    torch_prof = profile_call(lambda: torch.relu(x), "cuda")  # the decoy case: only PyTorch's kernel runs
    assert torch_prof.available and torch_prof.kernels, torch_prof.describe()
    assert own_kernel_share(torch_prof, ["cudal1_profiling_relu"]) == 0.0
    assert [f.rule for f in decoy_flags(torch_prof, report)] == ["guard.decoy_kernel"]


TRITON_MODULE = """
import triton
import triton.language as tl


@triton.jit
def cudal1_profiling_triton_relu(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(y_ptr + offs, tl.maximum(tl.load(x_ptr + offs, mask=mask), 0.0), mask=mask)
"""


@pytest.mark.gpu
def test_gpu_profile_of_a_triton_kernel(tmp_path, monkeypatch):
    triton = pytest.importorskip("triton")
    # A file module: Triton reads the kernel's source, and annotations must not be postponed strings.
    (tmp_path / "cudal1_profiling_triton_mod.py").write_text(TRITON_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    import cudal1_profiling_triton_mod as mod

    x = torch.randn(1 << 20, device="cuda")
    y = torch.empty_like(x)

    def forward():
        mod.cudal1_profiling_triton_relu[(triton.cdiv(x.numel(), 1024),)](x, y, x.numel(), BLOCK=1024)

    forward()  # compile outside the profile
    torch.cuda.synchronize()
    prof = profile_call(forward, "cuda")
    assert prof.available, prof.note
    report = custom_report(triton=("cudal1_profiling_triton_relu",))
    assert own_kernel_share(prof, report.triton_kernels_defined) > 0.9, prof.describe()
    assert decoy_flags(prof, report) == []
    assert torch.equal(y, torch.relu(x))
