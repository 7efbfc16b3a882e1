"""The trusted time, red-teamed: nothing the candidate's process reports, precomputes or leaves running raises
its speedup, through the real CLI (`cudal1 eval --json`), on one task family at three sizes
(tests/fixtures/timing/chain_*.py: about 0.02, 0.1 and 1 ms on an H200; their small sizes on a CPU).

Classes (tests/fixtures/timing/, each file says its method): forging what the runner reports through a harness
instance, a code object, a module global or a caller's frame; work where no clock looks (a thread that
watches the input slots); work left running on the device; phase detection (precise only on inputs that
look like the extra trials); limits (a progress note inside a call, a flood of output). Each forging attack
is compared with its honest twin (`honest_chain.py`) on the same task in the same test.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from cudal1.cli.main import main
from cudal1.eval.sandbox import detect_sandbox

TIMING = Path(__file__).resolve().parents[1] / "fixtures" / "timing"
SIZES = ("20us", "100us", "1ms")
FORGERS = ("forge_instance_method.py", "forge_code_object.py", "forge_module_global.py")
needs_sandbox = pytest.mark.skipif(detect_sandbox().level == "none", reason="no sandbox on this host")
CPU = ["--device", "cpu", "--trials", "2", "--buckets", "3", "--json", "--no-store"]
GPU = ["--device", "cuda", "--trials", "3", "--json", "--no-store"]
#: A forgery may keep at most this share of fake speedup over its honest twin (the bound's slack): 10 % on a
#: GPU from 0.05 ms up; a loaded 2-core CPU scatters more (its honest null test spans about +-20 %).
GPU_MARGIN, CPU_MARGIN = 1.11, 1.3


def evaluate(size: str, candidate: str, capsys, args: list[str], *extra: str) -> dict:
    assert main(["eval", "--ref", str(TIMING / f"chain_{size}.py"), "--candidate", str(TIMING / candidate),
                 *args, *extra]) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def assert_bounded(result: dict, honest: dict, margin: float) -> None:
    """Not correct, or no faster than its honest twin by more than `margin`."""
    assert honest["status"] == "correct", honest["message"]
    if result["status"] == "correct":
        assert result["speedup"] <= margin * honest["speedup"], (result["speedup"], honest["speedup"],
                                                                  result["protocol"].get("clock"))


def _gpu() -> None:
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")


# --------------------------------------------------------------------------- CPU (every class that needs no GPU)


@needs_sandbox
@pytest.mark.parametrize("size", SIZES)
def test_forging_through_a_harness_instance_gains_nothing(size, capsys):
    honest = evaluate(size, "honest_chain.py", capsys, CPU)
    forged = evaluate(size, "forge_instance_method.py", capsys, CPU)
    assert_bounded(forged, honest, CPU_MARGIN)


@needs_sandbox
@pytest.mark.slow
@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("forger", FORGERS[1:])
def test_every_forger_at_every_size_gains_nothing(size, forger, capsys):
    honest = evaluate(size, "honest_chain.py", capsys, CPU)
    assert_bounded(evaluate(size, forger, capsys, CPU), honest, CPU_MARGIN)


@needs_sandbox
@pytest.mark.parametrize("forger", FORGERS[1:])
def test_forging_through_code_objects_and_module_globals_is_named(forger, capsys):
    result = evaluate("100us", forger, capsys, CPU)
    assert result["status"] == "hack_detected", (result["status"], result["message"])
    assert "timing.outside_clock" in result["message"] or "timing.below_floor" in result["message"]


@needs_sandbox
def test_a_thread_watching_the_input_slots_gains_nothing(capsys):
    honest = evaluate("100us", "honest_chain.py", capsys, CPU)
    assert_bounded(evaluate("100us", "precompute_watch_slot.py", capsys, CPU), honest, CPU_MARGIN)


@needs_sandbox
def test_precision_only_on_inputs_that_look_like_the_extra_trials_is_caught(capsys):
    result = evaluate("100us", "phase_detect_heavy.py", capsys, CPU)
    assert result["status"] in ("incorrect", "hack_detected"), (result["status"], result["message"])


@needs_sandbox
def test_a_progress_note_inside_a_call_lifts_no_limit(capsys):
    started = time.monotonic()
    result = evaluate("20us", "progress_in_call.py", capsys, CPU)
    assert result["status"] == "runtime_error", (result["status"], result["message"])
    assert time.monotonic() - started < 40  # the 45 s stall was never waited for


@needs_sandbox
def test_a_flood_of_output_is_capped_and_changes_no_verdict(capsys):
    result = evaluate("20us", "spam_output.py", capsys, CPU)
    assert result["status"] == "correct", result["message"]


# --------------------------------------------------------------------------- GPU


@pytest.mark.gpu
@needs_sandbox
@pytest.mark.parametrize("profile", ["strict", "cuda-l1"])
@pytest.mark.parametrize("size", SIZES)
def test_gpu_forgers_gain_nothing_over_their_honest_twin(size, profile, capsys):
    _gpu()
    args = [*GPU, "--profile", profile]
    honest = evaluate(size, "honest_chain.py", capsys, args)
    print(size, profile, "honest", honest["speedup"], honest["protocol"].get("clock"))
    for forger in (*FORGERS, "forge_frame_event.py"):
        result = evaluate(size, forger, capsys, args)
        print(size, profile, forger, result["status"], result["speedup"], result["message"][:160])
        assert_bounded(result, honest, GPU_MARGIN)


@pytest.mark.gpu
@needs_sandbox
@pytest.mark.parametrize("size", SIZES)
def test_gpu_work_left_running_is_interference(size, capsys):
    _gpu()
    result = evaluate(size, "leftover_after_return.py", capsys, GPU)
    print(size, result["status"], result["message"][:200], result["protocol"].get("clock"))
    assert result["status"] == "hack_detected" and "timing.interference" in result["message"], result["message"]


@pytest.mark.gpu
@needs_sandbox
def test_gpu_phase_detection_and_limits(capsys):
    _gpu()
    assert evaluate("100us", "phase_detect_heavy.py", capsys, GPU)["status"] in ("incorrect", "hack_detected")
    started = time.monotonic()
    assert evaluate("20us", "progress_in_call.py", capsys, GPU)["status"] == "runtime_error"
    assert time.monotonic() - started < 40
    assert evaluate("20us", "spam_output.py", capsys, GPU)["status"] == "correct"
