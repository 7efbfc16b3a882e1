"""The trusted time, red-teamed: nothing the candidate's process reports, precomputes or leaves running raises
its speedup, through the real CLI (`cudal1 eval --json`), on one task family at three sizes
(tests/fixtures/timing/chain_*.py: about 0.02, 0.1 and 1 ms on an H200; their small sizes on a CPU).

Classes (tests/fixtures/timing/, each file says its method): forging what the runner reports through a harness
instance, a code object, a module global or a caller's frame; work where no clock looks (a thread that
watches the input slots); work left running on the device; phase detection (precise only on inputs that
look like the extra trials); reading ahead to the next calls' inputs (chain_launch_bound.py); limits (a
progress note inside a call, a flood of output). Each forging attack
is compared with its honest twin (`honest_chain.py`) on the same task in the same test.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from cudal1.cli.main import main
from cudal1.core import flags as F
from cudal1.eval import EvalConfig, Status, evaluate_candidate
from cudal1.eval.sandbox import detect_sandbox
from cudal1.tasks.sources import load_file
from tests.helpers.selection import quick_few

TIMING = Path(__file__).resolve().parents[1] / "fixtures" / "timing"
SIZES = ("20us", "100us", "1ms")
FORGERS = ("forge_instance_method.py", "forge_code_object.py", "forge_module_global.py", "forge_reply.py",
           "forge_class_swap.py")
needs_sandbox = pytest.mark.skipif(detect_sandbox().level == "none", reason="no sandbox on this host")
CPU = ["--device", "cpu", "--trials", "2", "--buckets", "3", "--json", "--no-store"]
# The host clock's red team on purpose (the GPU clock's is tests/eval/test_gpu_clock.py).
GPU = ["--device", "cuda", "--trials", "3", "--json", "--no-store", "--set", "gpu_clock=false"]
#: A forgery may keep at most this share of fake speedup over its honest twin: 10 % on a GPU from 0.05 ms up
#: (the goal); on a loaded 2-core CPU, whose honest null test spans about +-20 %, this and the slack recorded.
GPU_MARGIN, CPU_MARGIN = 1.11, 1.3


def evaluate(size: str, candidate: str, capsys, args: list[str], *extra: str) -> dict:
    assert main(["eval", "--ref", str(TIMING / f"chain_{size}.py"), "--candidate", str(TIMING / candidate),
                 *args, *extra]) == 0
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def assert_bounded(result: dict, honest: dict, margin: float, *, plus_slack: bool = False) -> None:
    """Not correct, or no faster than its honest twin by more than `margin`, beyond what the evaluator says a
    forgery may keep: the slack it records (on a loaded 2-core CPU up to half of a 0.1 ms call; on a GPU a few
    microseconds from 0.05 ms up, where `margin` alone is the goal) when `plus_slack`."""
    assert honest["status"] == "correct", honest["message"]
    if result["status"] == "correct":
        clock = result["protocol"].get("clock") or {}
        keep = 1.0
        if plus_slack and clock.get("counted_ms"):
            keep = (clock["counted_ms"] + clock["slack_ms"]) / clock["counted_ms"]
        assert result["speedup"] <= margin * keep * honest["speedup"], (result["speedup"], honest["speedup"], clock)


def _json(result) -> dict:
    return {"status": result.status.value, "speedup": result.speedup, "message": result.message,
            "protocol": result.protocol}


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
    assert_bounded(forged, honest, CPU_MARGIN, plus_slack=True)


@needs_sandbox
@pytest.mark.slow
@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("forger", FORGERS[1:])
def test_every_forger_at_every_size_gains_nothing(size, forger, capsys):
    honest = evaluate(size, "honest_chain.py", capsys, CPU)
    assert_bounded(evaluate(size, forger, capsys, CPU), honest, CPU_MARGIN, plus_slack=True)


@needs_sandbox
@pytest.mark.parametrize("forger", ["forge_code_object.py", "forge_module_global.py"])
def test_forging_through_code_objects_and_module_globals_is_named(forger, capsys):
    """Named by whichever layer sees it first: the static filter or the guards (the reply forger, which
    neither sees, is bounded by the clocks alone: a capped `correct` is its other fair outcome, tested below)."""
    result = evaluate("100us", forger, capsys, CPU)
    assert result["status"] == "hack_detected", (result["status"], result["message"])


@needs_sandbox
@pytest.mark.parametrize("forger", quick_few(FORGERS, ["forge_reply.py", "forge_code_object.py"]))
def test_with_the_first_filters_off_the_clocks_name_every_forgery(forger):
    """Static analysis off, guards not rejecting (cuda-l1): the time bound alone still rejects or caps."""
    task = load_file(TIMING / "chain_100us.py")
    cfg = EvalConfig(device="cpu", profile="cuda-l1", correctness_trials=2, buckets=3, skip_static=True)
    honest = evaluate_candidate(task, (TIMING / "honest_chain.py").read_text(), cfg)
    result = evaluate_candidate(task, (TIMING / forger).read_text(), cfg)
    rules = {f.rule for f in result.flags}
    # Named whenever it hides clearly more than the clock's slack on this machine (the honest twin's time less
    # the forged report, beyond two slacks and the 30 % two evaluations of a loaded 2-core host differ by): a
    # loaded host widens the slack past a 0.1 ms call's forgery, the documented limit, and the gain stays
    # bounded by it (below).
    clock = result.protocol.get("clock") or {}
    if result.status is Status.CORRECT and honest.timing is not None and clock.get("reported_ms") is not None:
        hidden = honest.timing.candidate_ms - clock["reported_ms"]
        if hidden > 2 * clock["slack_ms"] + 0.3 * honest.timing.candidate_ms:
            assert rules & {F.OUTSIDE_CLOCK, F.CAPPED, F.BELOW_FLOOR, F.TIMER_PATCHING}, (result.status, rules, clock)
    else:
        assert rules & {F.OUTSIDE_CLOCK, F.CAPPED, F.BELOW_FLOOR, F.TIMER_PATCHING}, (result.status, rules)
    assert_bounded(_json(result), _json(honest), CPU_MARGIN, plus_slack=True)


@needs_sandbox
@pytest.mark.parametrize("forger, named", [("forge_code_object.py", "harness.ModelSide._timed (its code) was replaced"),
                                           ("forge_instance_method.py", "ModelSide._timed was shadowed")])
def test_the_guards_name_a_swapped_code_object_and_a_method_shadowed_on_an_instance(forger, named):
    """The two forgeries the class-level identity checks missed (a `__code__` swap keeps the function object;
    an instance attribute leaves the class alone; 2.22x `correct` under cuda-l1 on an H100 at 0.05 ms, where
    the clock's bound is too coarse): the guards now name both, which rejects under every profile."""
    task = load_file(TIMING / "chain_100us.py")
    cfg = EvalConfig(device="cpu", profile="cuda-l1", correctness_trials=2, buckets=3, skip_static=True)
    result = evaluate_candidate(task, (TIMING / forger).read_text(), cfg)
    assert result.status is Status.HACK_DETECTED, (result.status, result.message)
    assert any(f.rule == F.TIMER_PATCHING and named in f.message for f in result.flags), [f.message for f in result.flags]


@needs_sandbox
def test_a_harness_instance_given_another_class_is_named_through_the_cli(capsys):
    """A subclass swapped in through the instance's `__class__` overrides the timing method with no attribute
    of any class or instance replaced: the guards compare the class with the one before the import."""
    result = evaluate("100us", "forge_class_swap.py", capsys, CPU, "--profile", "cuda-l1")
    assert result["status"] == "hack_detected", (result["status"], result["message"])
    assert "ModelSide (its class, now _Faster)" in json.dumps(result), result["message"]


@needs_sandbox
def test_a_thread_watching_the_input_slots_gains_nothing(capsys):
    honest = evaluate("100us", "honest_chain.py", capsys, CPU)
    assert_bounded(evaluate("100us", "precompute_watch_slot.py", capsys, CPU), honest, CPU_MARGIN, plus_slack=True)


@needs_sandbox
def test_reading_ahead_to_the_next_calls_inputs_gains_nothing():
    """A first call that answers the later calls of its bracket in one batch (5.2x `correct` when a bracket
    held 16 calls), through the runtime alone (static analysis off: it would reject the frame walk first): by
    default a bracket holds one call, so no later input exists to read."""
    task = load_file(TIMING / "chain_launch_bound.py")
    cfg = EvalConfig(device="cpu", correctness_trials=2, buckets=3, skip_static=True)
    honest = evaluate_candidate(task, (TIMING / "honest_launch_bound.py").read_text(), cfg)
    reader = evaluate_candidate(task, (TIMING / "lookahead_group.py").read_text(), cfg)
    assert reader.protocol["clock"]["calls_per_bracket"] == 1
    assert_bounded(_json(reader), _json(honest), CPU_MARGIN, plus_slack=True)


@needs_sandbox
def test_precision_only_on_inputs_that_look_like_the_extra_trials_is_caught(capsys):
    result = evaluate("100us", "phase_detect_heavy.py", capsys, CPU)
    assert result["status"] in ("incorrect", "hack_detected"), (result["status"], result["message"])


@needs_sandbox
def test_a_progress_note_inside_a_call_lifts_no_limit():
    """Through the runtime alone (static analysis off: it would reject the gc walk first)."""
    task = load_file(TIMING / "chain_20us.py")
    cfg = EvalConfig(device="cpu", correctness_trials=2, buckets=3, skip_static=True)
    result = evaluate_candidate(task, (TIMING / "progress_in_call.py").read_text(), cfg)
    assert result.status is Status.RUNTIME_ERROR, (result.status, result.message)
    # The cause is the protocol break, at the note: an honoured note would have let the 45 s stall return and the
    # evaluation go on (no protocol error), so no wall time is asserted (a loaded machine stretches it).
    assert "protocol" in result.message and "correctness trial 1" in result.message, result.message


def _first_call_notes(schedule: list[tuple[str, object]] | None, step_s: float, build_s: float):
    """The verdict on `build_notes.py` playing `schedule` in its first call (None: the file's own), under steps
    of `step_s` and a build allowance of `build_s`."""
    source = (TIMING / "build_notes.py").read_text()
    if schedule is not None:
        source = re.sub(r"^SCHEDULE = .*$", f"SCHEDULE = {schedule!r}", source, count=1, flags=re.MULTILINE)
    cfg = EvalConfig(device="cpu", correctness_trials=2, buckets=3, skip_static=True, phase_floor_s=step_s,
                     build_timeout_s=build_s)
    return evaluate_candidate(load_file(TIMING / "chain_20us.py"), source, cfg)


@needs_sandbox
def test_a_build_started_in_the_first_trial_may_take_the_build_limit():
    """A lazy `load_inline` build in the first forward says so on the socket while the parent waits for the
    call's doorbell: that call's limit becomes the build's (2 s steps, a 4 s "build"), where a note in a later
    call breaks the protocol (above). Two notes in the one call (two extensions) are both taken."""
    result = _first_call_notes(None, step_s=2.0, build_s=60.0)
    assert result.status is Status.CORRECT, (result.status, result.message)


@needs_sandbox
def test_a_second_build_note_renews_nothing():
    """One deadline for the call from its first note: a note near its end does not lift the limit again (4 s
    steps, a 5 s allowance; the call takes 6.5 s: once, a second note at 4.5 s gave it 4 s more)."""
    result = _first_call_notes([("note", "x"), ("sleep", 4.5), ("note", "y"), ("sleep", 2.0)], step_s=4.0,
                               build_s=5.0)
    assert result.status is Status.TIMEOUT and "correctness trial 0" in result.message, (result.status, result.message)


@needs_sandbox
def test_build_notes_past_the_first_change_nothing():
    """40 notes in the first call, 0.1 s apart, each read while the parent waits: the first set the call's one
    deadline, the others move nothing (their reading is on the runner's channel budget), and the honest
    answer after them is `correct`."""
    schedule = [item for i in range(40) for item in (("note", f"x{i}"), ("sleep", 0.1))]
    result = _first_call_notes(schedule, step_s=2.0, build_s=60.0)
    assert result.status is Status.CORRECT, (result.status, result.message)


def test_builds_share_one_allowance_outside_the_overall_limit():
    """Builds the candidate starts itself are left out of the evaluation's limit, up to `build_timeout_s` in
    all: an evaluation takes at most `timeout_s` + `build_timeout_s`, which the pool's watchdog counts on."""
    from cudal1.eval.session import Deadlines

    deadlines = Deadlines(EvalConfig(device="cpu", timeout_s=100.0, build_timeout_s=30.0))
    left = deadlines.left()
    deadlines.exclude_build(20.0)  # an import's build
    assert deadlines.left() == pytest.approx(left + 20.0, abs=0.5) and deadlines.build_left_s == 10.0
    deadlines.exclude_build(25.0)  # the first call's: only what is left of the allowance
    assert deadlines.left() == pytest.approx(left + 30.0, abs=0.5) and deadlines.build_left_s == 0.0
    deadlines.exclude_build(-5.0)
    assert deadlines.build_left_s == 0.0


@needs_sandbox
def test_a_flood_of_output_is_capped_and_changes_no_verdict(capsys):
    result = evaluate("20us", "spam_output.py", capsys, CPU)
    assert result["status"] == "correct", result["message"]


# --------------------------------------------------------------------------- GPU (one CLI batch per profile)


def evaluate_batch(cases: list[tuple[str, str]], args: list[str], tmp_path: Path, capsys) -> list[dict]:
    """(size, candidate file) pairs as one release batch through `cudal1 eval --release`: one runner supply
    for all (a fresh CLI call per candidate would start its runners each time)."""
    release = tmp_path / "cases.jsonl"
    release.write_text("".join(json.dumps({"level_id": 1, "task_id": 900 + i,
                                           "ref_code": (TIMING / f"chain_{size}.py").read_text(),
                                           "custom_code": (TIMING / name).read_text()}) + "\n"
                               for i, (size, name) in enumerate(cases)))
    assert main(["eval", "--release", str(release), *args]) == 0
    out = [json.loads(line) for line in capsys.readouterr().out.strip().splitlines() if line.startswith("{")]
    by_id = {r["task_id"]: r for r in out}
    return [by_id[f"cases/level1/{900 + i}"] for i in range(len(cases))]


@pytest.mark.gpu
@needs_sandbox
@pytest.mark.parametrize("profile", ["strict", "cuda-l1"])
def test_gpu_no_class_gains_over_its_honest_twin(profile, tmp_path, capsys):
    """Every class at every size: forgers bounded by their twin, work left running is interference, phase
    detection is not correct, limits hold, honest controls are correct."""
    _gpu()
    attacks = (*FORGERS, "forge_frame_event.py", "precompute_watch_slot.py", "leftover_after_return.py")
    cases = [(size, name) for size in SIZES for name in ("honest_chain.py", *attacks)]
    cases += [("100us", "phase_detect_heavy.py"), ("20us", "spam_output.py"),
              ("launch_bound", "honest_launch_bound.py"), ("launch_bound", "lookahead_group.py")]
    started = time.monotonic()
    results = evaluate_batch(cases, [*GPU, "--profile", profile], tmp_path, capsys)
    by_case = dict(zip(cases, results, strict=True))
    for (size, name), result in by_case.items():
        print(profile, size, name, result["status"], result["speedup"], result["message"][:160],
              (result.get("protocol") or {}).get("clock"))
    for size in SIZES:
        honest = by_case[(size, "honest_chain.py")]
        for name in (*FORGERS, "forge_frame_event.py", "precompute_watch_slot.py"):
            assert_bounded(by_case[(size, name)], honest, GPU_MARGIN)
        leftover = by_case[(size, "leftover_after_return.py")]
        assert leftover["status"] == "hack_detected", leftover["message"]
    assert by_case[("100us", "phase_detect_heavy.py")]["status"] in (("incorrect", "hack_detected")
                                                                    if profile == "strict" else
                                                                    ("incorrect", "hack_detected", "correct"))
    assert by_case[("20us", "spam_output.py")]["status"] == "correct"
    assert_bounded(by_case[("launch_bound", "lookahead_group.py")], by_case[("launch_bound", "honest_launch_bound.py")],
                   GPU_MARGIN)
    print(f"{len(cases)} candidates in {time.monotonic() - started:.0f} s")


@pytest.mark.gpu
@needs_sandbox
def test_gpu_a_progress_note_inside_a_call_lifts_no_limit():
    _gpu()
    task = load_file(TIMING / "chain_20us.py")
    started = time.monotonic()
    result = evaluate_candidate(task, (TIMING / "progress_in_call.py").read_text(),
                                EvalConfig(device="cuda", correctness_trials=2, skip_static=True))
    assert result.status is Status.RUNTIME_ERROR and time.monotonic() - started < 60, result.message


@needs_sandbox
def test_a_cpu_calls_cpu_time_covers_the_wall_clocks_window_only():
    """The CPU bound subtracts each runner's CPU time beyond its calls' own, so a call's CPU time must cover
    what its wall time covers and no harness code: read around more, it held about 47 us a call of the
    harness on caches the flush had left cold, and the bound of every honest candidate sat that far above its
    report (a loaded host then capped a 1.6x candidate to 0.73x). One core per runner: a call's CPU time
    cannot exceed its wall time but by the clocks' own reads."""
    task = load_file(Path(__file__).resolve().parents[1] / "fixtures" / "tasks" / "tiny_scale_add.py")
    candidate = (Path(__file__).resolve().parents[1] / "fixtures" / "eval" / "correct.py").read_text()
    result = evaluate_candidate(task, candidate, EvalConfig(device="cpu", correctness_trials=1, buckets=2,
                                                            warm_buckets=0, record_samples=True))
    assert result.status is Status.CORRECT, result.message
    for who in ("ref", "cand"):
        calls = [row for bucket in result.protocol["samples"][who] for row in bucket]  # [ms, .., cpu_ms, call_cpu_ms, ..]
        beyond_us = sorted(1e3 * (row[6] - row[0]) for row in calls)
        assert beyond_us[len(beyond_us) // 2] < 10.0, (who, beyond_us[:5], beyond_us[-5:])
