"""The GPU clock (`EvalConfig.gpu_clock`, the default on a GPU): calls enqueued behind a gate and timed by the
trusted helper's events on the GPU's timeline, through the real CLI, against the same red team as the host
clock (tests/eval/test_trusted_time.py): forgers, work where no clock looks, work left running, reading ahead.
What a forger rewrites is never read here, so each must land at its honest twin's speedup. On a GPU only."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.eval.test_trusted_time import (
    FORGERS,
    GPU,
    _gpu,
    assert_bounded,
    evaluate,
    evaluate_batch,
    needs_sandbox,
)

GATED = [*GPU, "--set", "gpu_clock=true"]  # (GPU pins the host clock for its own red team)
#: The goal: no exploit `correct` above its twin's speedup times this.
MARGIN = 1.05


def gpu_clock(result: dict) -> dict:
    clock = (result.get("protocol") or {}).get("clock") or {}
    assert clock.get("clock") == "gpu", clock
    return clock


@pytest.mark.gpu
@needs_sandbox
@pytest.mark.parametrize("profile", ["strict", "cuda-l1"])
def test_gpu_clock_no_class_gains_over_its_honest_twin(profile, tmp_path, capsys):
    _gpu()
    sizes = ("20us", "1ms")
    attacks = (*FORGERS, "precompute_watch_slot.py", "leftover_after_return.py", "slow_own_nulls.py")
    cases = [(size, name) for size in sizes for name in ("honest_chain.py", *attacks)]
    cases += [("launch_bound", "honest_launch_bound.py"), ("launch_bound", "lookahead_group.py")]
    results = evaluate_batch(cases, [*GATED, "--profile", profile], tmp_path, capsys)
    by_case = dict(zip(cases, results, strict=True))
    for (size, name), result in by_case.items():
        print(profile, size, name, result["status"], result["speedup"], result["message"][:160],
              (result.get("protocol") or {}).get("clock"))
    for size in sizes:
        honest = by_case[(size, "honest_chain.py")]
        clock = gpu_clock(honest)
        assert clock["nulls"] >= 8 and clock["cand_nulls"] >= 8 and clock["c_us"] > 0, clock
        # The twin's interval must hold its true 1.0 (the runner pair's null widens it: at 10 us calls
        # evaluations of one twin were 0.87-1.11x apart); its point within 10 % from 1 ms, 20 % at 10 us.
        lo, hi = honest["timing"]["speedup_ci"]
        assert lo <= 1.0 <= hi, (honest["speedup"], honest["timing"]["speedup_ci"])
        near = 0.1 if size == "1ms" else 0.2
        assert 1 - near < honest["speedup"] < 1 + near, honest["speedup"]
        for name in attacks:
            assert_bounded(by_case[(size, name)], honest, MARGIN)
        slowed = by_case[(size, "slow_own_nulls.py")]
        if slowed["status"] == "correct":  # its own nulls ran slower, and the reference's constant was paid
            clock = gpu_clock(slowed)
            assert clock["cand_c_us"] > clock["c_us"] and clock["cand_c_paid_us"] == clock["c_us"], clock
    assert_bounded(by_case[("launch_bound", "lookahead_group.py")], by_case[("launch_bound", "honest_launch_bound.py")],
                   MARGIN)


@pytest.mark.gpu
@needs_sandbox
def test_gpu_clock_a_forward_that_waits_for_the_device_is_timed_with_its_wait(capsys):
    _gpu()
    result = evaluate("100us", "sync_in_forward.py", capsys, GATED)
    assert result["status"] == "correct", result["message"]
    clock = gpu_clock(result)
    assert clock["unarmed_calls"]["cand"] >= 2 and clock["unarmed_calls"]["ref"] == 0, clock
    honest = evaluate("100us", "honest_chain.py", capsys, GATED)
    assert result["speedup"] <= honest["speedup"] * MARGIN, (result["speedup"], honest["speedup"])


# --------------------------------------------------------------------------- CPU: the arithmetic and the arm wait


def test_the_gpu_clock_counts_each_bracket_less_the_null_median_and_reads_no_report():
    from cudal1.eval.clock import timing
    from cudal1.eval.clock.timing import PairedSeries, Sample

    def sample(gpu_ms: float, reported: float) -> Sample:
        return Sample(ms=reported, stream_ms=reported, bracket_ms=5.0, gpu_ms=gpu_ms, gpu_stage_ms=0.01)
    series = PairedSeries(ref=[[sample(0.300, 0.02), sample(0.302, 0.02)]],
                          cand=[[sample(0.290, 0.001), sample(0.2905, 0.001)]])  # a forged 1 us report
    clocked = timing.gpu_clocked(series, c_ms=0.280)
    assert [s.ms for s in clocked.ref[0]] == pytest.approx([0.020, 0.022])
    assert [s.ms for s in clocked.cand[0]] == pytest.approx([0.010, 0.0105])
    assert all(s.stream_ms == s.ms for s in clocked.all("cand"))
    # A bracket shorter than the constant (scatter) counts a nanosecond, never a negative time.
    assert timing.gpu_clocked(PairedSeries(ref=[[sample(0.2, 1.0)]], cand=[[sample(0.2, 1.0)]]), 0.3).ref[0][0].ms == 1e-6
    summary = timing.gpu_clock_summary(clocked, [0.279, 0.280, 0.281, 0.290], {"ref": 0, "cand": 3})
    assert summary["clock"] == "gpu" and summary["nulls"] == 4 and summary["c_us"] == pytest.approx(280.5)
    assert summary["unarmed_calls"] == {"ref": 0, "cand": 3} and summary["cand_gpu_stage_us"] == pytest.approx(10.0)



def test_the_candidates_calls_pay_its_own_runners_constant_only_where_it_is_smaller():
    """A candidate runs its own null calls and may slow them: a larger constant than the reference's would
    pay it, so its calls take the smaller of the two; an honest context that switches faster is not billed
    the reference's switch."""
    from cudal1.eval.clock import timing
    from cudal1.eval.clock.timing import PairedSeries, Sample

    def sample(gpu_ms: float) -> Sample:
        return Sample(ms=0.0, stream_ms=0.0, bracket_ms=1.0, gpu_ms=gpu_ms)
    series = PairedSeries(ref=[[sample(0.070)]], cand=[[sample(0.069)]])
    honest = timing.gpu_clocked(series, 0.060, cand_c_ms=0.059)  # the candidate's context switches 1 us faster
    assert honest.ref[0][0].ms == pytest.approx(0.010) and honest.cand[0][0].ms == pytest.approx(0.010)
    slowed = timing.gpu_clocked(series, 0.060, cand_c_ms=0.068)  # nulls slowed by 8 us to hide 8 us of work
    assert slowed.cand[0][0].ms == pytest.approx(0.009)
    assert timing.gpu_clocked(series, 0.060).cand[0][0].ms == pytest.approx(0.009)  # no nulls of its own
    summary = timing.gpu_clock_summary(slowed, [0.060] * 8, {"ref": 0, "cand": 0}, [0.068] * 8)
    assert summary["cand_c_us"] == pytest.approx(68.0) and summary["cand_c_paid_us"] == pytest.approx(60.0)
    assert summary["cand_nulls"] == 8

def test_the_gpu_clock_is_the_default_on_a_gpu_and_keys_its_results_apart_from_the_host_clocks():
    from cudal1.eval import EvalConfig

    assert EvalConfig(device="cuda").protocol()["gpu_clock"] is True  # the default since protocol 19
    assert EvalConfig(device="cuda", gpu_clock=False).protocol()["gpu_clock"] is False
    # Its schedule is its own (fewer calls per bucket): part of the key only when it is used.
    assert EvalConfig(device="cuda", gpu_clock_max_iters=30).protocol()["gpu_clock_max_iters"] == 30
    assert "gpu_clock_max_iters" not in EvalConfig(device="cuda", gpu_clock=False, gpu_clock_max_iters=30).protocol()
    assert EvalConfig(device="cuda", gpu_clock=False, min_iters_per_bucket=30).min_iters_per_bucket == 30
    with pytest.raises(ValueError, match="gpu_clock_max_iters"):
        EvalConfig(device="cuda", min_iters_per_bucket=30)
    # A CPU has one clock: neither the setting nor its schedule is in its key or checked.
    assert "gpu_clock" not in EvalConfig(device="cpu").protocol()
    assert EvalConfig(device="cpu", min_iters_per_bucket=30).min_iters_per_bucket == 30


def test_a_helper_failing_after_the_candidates_call_failed_does_not_take_the_candidates_verdict():
    """A call that hangs the device may leave the helper's end wait to time out after the candidate's runner
    has failed: the candidate's verdict stands (its failure is not made an infrastructure failure, which would
    be retried and never stored), and the helper is marked to be replaced."""
    from cudal1.eval import EvalConfig
    from cudal1.eval.outcomes import InfraFailure, Verdict
    from cudal1.eval.runner_process import RunnerFailed
    from cudal1.eval.session import Session
    from cudal1.eval.shared.doorbell import Doorbell
    from cudal1.tasks.sources import load_file

    class Runner:
        def thaw(self):
            pass

        freeze = thaw

        def cpu_ns(self):
            return 0

        def send(self, request):
            raise RunnerFailed("exited with code 1", exit_code=1)

    class Plane:
        layouts = {"ref": type("L", (), {"slots": 1})(), "cand": type("L", (), {"slots": 1})()}
        doorbells = {"ref": Doorbell.create(), "cand": Doorbell.create()}

        def place(self, who, tree, slot):
            return {}

        def open_bracket(self, *args, **kwargs):
            pass

        def close_bracket(self, timeout_s):
            raise InfraFailure("the device helper did not answer within the bracket")

    task = load_file(Path(__file__).resolve().parents[1] / "fixtures" / "timing" / "chain_20us.py")
    session = Session(task, "", EvalConfig(device="cpu", timeout_s=30.0), ref=Runner(), cand=Runner())
    session.plane, session.candidate_imported = Plane(), True
    with pytest.raises(Verdict, match="exited with code 1"):
        session.call("cand", {}, flush=False, what="a timed call")
    assert session.helper_failed
    with pytest.raises(Verdict, match="the reference's failure"):  # the reference's own failure, as before
        session.call("ref", {}, flush=False, what="a timed call")


def test_a_result_the_host_clock_paid_in_place_of_the_gpu_clock_is_keyed_and_recorded_as_the_host_clocks(tmp_path):
    """With host arenas (or no stream memory operations) the GPU clock cannot run and the host clock times
    the calls: such a result must never be stored under, nor answer, the GPU clock's key."""
    from cudal1.core.types import EvalResult, Status
    from cudal1.eval import EvalConfig
    from cudal1.eval.pipeline import keyed_by_the_clock_that_paid
    from cudal1.store import ResultsStore

    gpu = EvalConfig(device="cuda", gpu_clock=True)
    fell_back = EvalResult(status=Status.CORRECT, speedup=1.5,
                           protocol={**gpu.protocol(), "sandbox_level": "full", "clock": {"clock": "host"}})
    paid, result = keyed_by_the_clock_that_paid(gpu, fell_back)
    assert not paid.gpu_clock and result.protocol.get("gpu_clock") is not True
    assert "gpu_clock_max_iters" not in result.protocol and result.protocol["clock"] == {"clock": "host"}
    store = ResultsStore(tmp_path / "s.sqlite")
    env = {"gpu_name": "H100"}
    assert store.lookup("t", "c", paid.protocol(), env)[0] != store.lookup("t", "c", gpu.protocol(), env)[0]
    # Gated results, and CPU ones, are keyed as asked.
    gated = fell_back.replace(protocol={**fell_back.protocol, "clock": {"clock": "gpu"}})
    assert keyed_by_the_clock_that_paid(gpu, gated) == (gpu, gated)
    cpu = EvalConfig(device="cpu", gpu_clock=True)
    assert keyed_by_the_clock_that_paid(cpu, fell_back)[0] is cpu


def test_a_gated_call_that_does_not_arm_in_time_goes_on_without_killing_its_runner():
    """The arm wait of a gated call (`Session._wait_runner` with `arm_s`): a runner whose forward waits for
    the device never arms; the parent stops waiting after `arm_s` (None), leaves the runner alone, and the
    done wait that follows is the call's as before."""
    import socket
    import time

    from cudal1.eval import EvalConfig
    from cudal1.eval.session import Session
    from cudal1.eval.shared.doorbell import ARMED, DONE, Doorbell
    from cudal1.eval.shared.protocol import Call
    from cudal1.tasks.sources import load_file

    class Runner:
        def __init__(self):
            self.channel = type("C", (), {})()
            self.channel.sock, self.peer = socket.socketpair()
            self.killed = ""

        def check_alive(self):
            pass

        def kill(self, reason="killed", **_):
            self.killed = reason

    runner, bell = Runner(), Doorbell.create()
    task = load_file(Path(__file__).resolve().parents[1] / "fixtures" / "timing" / "chain_20us.py")
    session = Session(task, "", EvalConfig(device="cpu", timeout_s=30.0), ref=runner, cand=runner)
    session.call_deadline = time.monotonic() + 30.0
    request = Call(seq=1, slot=0, inputs={}, gate=1)
    t0 = time.monotonic()
    assert session._wait_runner("cand", runner, bell, ARMED, 1, request, "a call", arm_s=0.05) is None
    assert 0.04 < time.monotonic() - t0 < 5.0 and runner.killed == ""
    bell.ring(DONE, 1)
    assert session._wait_runner("cand", runner, bell, DONE, 1, request, "a call") is not None
    session.unarmed["cand"] = 2
    assert session._arm_wait_s("cand") == 0.005 < session._arm_wait_s("ref") == 0.5  # it never armed
    # A model that arms in 8 ms (a large eager one) and missed its wait twice (slow first calls) is given
    # four times that, not a wait that would open its gate mid-enqueue.
    session.arm_times["cand"] += [0.008, 0.007, 0.009]
    assert session._arm_wait_s("cand") == pytest.approx(0.032)
    session.arm_times["cand"] += [3.0] * 4  # slowed on purpose: never beyond the first wait
    assert session._arm_wait_s("cand") == 0.5
    # What the twin did in the candidate's runner before the import is not the candidate's: neither its
    # unarmed calls (the record's `unarmed_calls`) nor its arm times (the candidate's arm wait).
    from cudal1.eval.outcomes import Verdict
    from cudal1.eval.shared.protocol import ErrorReply

    session.ask_candidate = lambda *a, **k: ErrorReply(kind="import", message="stand-in")
    session.ref_times["setup"] = 1.0
    with pytest.raises(Verdict):
        session.import_candidate()
    assert session.unarmed["cand"] == 0 and session.arm_times["cand"] == [] and session._arm_wait_s("cand") == 0.5


@needs_sandbox
def test_a_cpu_evaluation_says_the_host_clock_paid_even_when_the_gpu_clock_is_asked_for(caplog):
    from cudal1.eval import EvalConfig, evaluate_candidate
    from cudal1.tasks.sources import load_file

    timing_dir = Path(__file__).resolve().parents[1] / "fixtures" / "timing"
    with caplog.at_level("WARNING", logger="cudal1"):
        result = evaluate_candidate(load_file(timing_dir / "chain_20us.py"),
                                    (timing_dir / "honest_chain.py").read_text(),
                                    EvalConfig(device="cpu", gpu_clock=True, correctness_trials=1, buckets=2,
                                               warm_buckets=0, skip_static=True))
    assert result.status.value == "correct", result.message
    # The GPU clock is the default: on a CPU, which has the host clock only, that is no cause for a warning.
    assert not [r for r in caplog.records if "GPU clock" in r.getMessage()], caplog.text
    assert result.protocol["clock"]["clock"] == "host" and result.timing.method == "host_timer"
    # What a bracket cost the parent, for the throughput benchmark: every pair's two brackets in the calls step.
    spent_ms = 1e3 * result.protocol["timing_spent_s"]["calls"]
    pairs = result.timing.iterations  # the flushed buckets' pairs (the calibration's came on top)
    assert 0 < result.protocol["clock"]["ms_per_bracket"] <= spent_ms / (2 * pairs)


def test_the_null_calls_come_after_the_pairs_check_so_a_nulls_snapshot_never_stands_in_for_a_calls_output():
    """A null bracket snapshots each output region again, and the candidate's own null runs in its process:
    had the check come after it, a candidate could skip the work in its timed call and write the output in
    its null. The measurement checks a pair before any null follows it."""
    from types import SimpleNamespace

    from cudal1.eval.clock import measure
    from cudal1.eval.config import EvalConfig
    from cudal1.eval.session import CallRecord
    from cudal1.eval.shared.protocol import Called

    events: list[str] = []

    def record(who: str) -> CallRecord:
        return CallRecord(who=who, reply=Called(ms=0.01, stream_ms=0.01, out={}), slot_tree={}, bracket_ms=1.0,
                          model_ms=0.5, after="", gpu_ms=0.3)

    class Session(SimpleNamespace):
        gated, reference_errors, calls = True, None, 1

        def make_inputs(self, distribution="reference"):
            return {}

        def pair(self, stage, *, flush, what):
            events.append("pair")
            return record("ref"), record("cand")

        def call(self, who, stage, *, flush, what, null=False):
            assert null
            events.append(f"null {who}")
            return record(who)

        def compare(self, ref, cand, **_):
            events.append("check")
            return SimpleNamespace(ok=True, errors=None)

        def check_inputs(self, *_):
            pass

    session = Session(cfg=EvalConfig(), facts=SimpleNamespace(output_bytes=1024, reached=""))
    m = measure.Measurement(session)  # type: ignore[arg-type]
    m.pair(flush=True, verify=True)
    assert events[0] == "pair" and events[1] == "check" and sorted(events[2:]) == ["null cand", "null ref"]
    assert len(m.nulls[("ref", True)]) == len(m.nulls[("cand", True)]) == 1


def _twin_apart_session(**fields):
    """A stand-in gated session whose second runner times the reference's model 10 us a call against the
    reference's 5 us (brackets of 310 and 305 us over null brackets of 300 us); `fields` are its attributes."""
    from types import SimpleNamespace

    from cudal1.eval.session import CallRecord
    from cudal1.eval.shared.protocol import Called

    def record(who: str, gpu_ms: float) -> CallRecord:
        return CallRecord(who=who, reply=Called(ms=0.01, stream_ms=0.01, out={}), slot_tree={}, bracket_ms=1.0,
                          model_ms=0.5, after="", gpu_ms=gpu_ms)

    class Session(SimpleNamespace):
        gated, reference_errors, calls, device_type = True, None, 1, "cuda"

        def make_inputs(self, distribution="reference"):
            return {}

        def pair(self, stage, *, flush, what):
            return record("ref", 0.305), record("cand", 0.310)

        def call(self, who, stage, *, flush, what, null=False):
            return record(who, 0.300)

        def compare(self, ref, cand, **_):
            return SimpleNamespace(ok=True, errors=None)

        def check_inputs(self, *_):
            pass

    return Session(**fields)


def test_the_gpu_clocks_calibration_is_the_twins_null_by_which_the_interval_widens():
    """Before the candidate's import, the reference against its twin on the GPU clock: a pair of runners that
    times one model apart (here the twin's calls 10 us long where the reference's are 5 us) widens every
    interval of the evaluation; the phase's nulls are not the timed phase's constants."""
    from types import SimpleNamespace

    from cudal1.eval.clock import measure, timing
    from cudal1.eval.config import EvalConfig

    session = _twin_apart_session(cfg=EvalConfig(), plane=SimpleNamespace(calls=4),
                                  facts=SimpleNamespace(output_bytes=1024, reached="", calibration=None, samples=None))
    m = measure.Measurement(session)  # type: ignore[arg-type]
    assert m.calibrate() is None
    null, (lo, hi) = m.twin_null
    assert null == pytest.approx(0.5) and lo == pytest.approx(0.5) and hi == pytest.approx(0.5)
    assert session.facts.calibration["clock"] == "gpu" and session.facts.calibration["pairs"] >= 24
    assert all(not series for series in m.nulls.values()) and m.pairs == 0 and session.plane.calls == 1
    lo, hi = timing.gpu_widened(1.0, (0.99, 1.01), 1.0, 1.0, [0.3] * 8, [0.3] * 8, m.twin_null)
    assert lo < 0.51 and hi > 1.9


def test_the_twin_null_measured_before_the_import_widens_the_timed_phases_interval():
    """The calibration and the timed phase are measured by two `Measurement`s (the timing may be measured a
    second time): the twin's null, measured by the first, must reach the interval of the second. Here the
    twin's calls time 10 us against the reference's 5 us, and so do the candidate's: without the twin's null
    the interval would be the point 0.5."""
    from types import SimpleNamespace

    from cudal1.eval import evaluation
    from cudal1.eval.clock import measure
    from cudal1.eval.config import EvalConfig

    cfg = EvalConfig(buckets=2, warm_buckets=0, gpu_clock_max_iters=5, noisy_stability=0.0)
    facts = SimpleNamespace(output_bytes=1024, input_bytes=1024, reached="", calibration=None, samples=None,
                            clock=None, beyond_distribution_trials=0, timing_spent_s=None)
    session = _twin_apart_session(cfg=cfg, facts=facts, plane=SimpleNamespace(calls=1), ref_times={}, flags=[],
                                  unarmed={"ref": 0, "cand": 0})
    calibrating = measure.Measurement(session)  # type: ignore[arg-type]
    assert calibrating.calibrate() is None and calibrating.twin_null is not None
    stats = evaluation._measure(session, None, None, calibrating.twin_null)  # type: ignore[arg-type]
    assert stats.speedup == pytest.approx(0.5)
    lo, hi = stats.speedup_ci
    assert lo < 0.3 and hi > 0.9, stats.speedup_ci
    alone = evaluation._measure(session, None, None, None)  # type: ignore[arg-type]
    assert alone.speedup_ci == pytest.approx([0.5, 0.5])


@pytest.mark.parametrize("steadier", ["first", "second"])
def test_a_timing_measured_twice_records_the_kept_ones_figures_calls_and_spending(monkeypatch, steadier):
    """A noisy timing is measured again and the steadier kept: its clock figures, recorded calls and time spent
    are the ones recorded, never a mix of the two (a benchmark divides one's spending by the other's pairs)."""
    from types import SimpleNamespace

    from cudal1.eval import evaluation
    from cudal1.eval.config import EvalConfig

    runs = iter([("first", 0.5 if steadier == "second" else 0.4), ("second", 0.3 if steadier == "second" else 0.6)])

    def run(self, calibration, twin_null=None):
        name, stability = next(runs)
        self.s.facts.clock, self.s.facts.timing_spent_s = {"c_us": name}, {"calls": name}
        self.s.facts.samples = {**(self.s.facts.samples or {}), "ref": name}
        return SimpleNamespace(stability=stability, speedup=1.0, name=name)

    monkeypatch.setattr(evaluation.Measurement, "__init__", lambda self, session, *a, **k: setattr(self, "s", session))
    monkeypatch.setattr(evaluation.Measurement, "run", run)
    session = SimpleNamespace(cfg=EvalConfig(noisy_stability=0.25), flags=[],
                              facts=SimpleNamespace(clock=None, samples={"calibration": "twin"}, timing_spent_s={}))
    kept = evaluation._measure(session, None, None, None)  # type: ignore[arg-type]
    assert kept.name == steadier
    facts = session.facts
    assert facts.clock == {"c_us": steadier} and facts.timing_spent_s == {"calls": steadier}
    assert facts.samples == {"calibration": "twin", "ref": steadier}
    assert [f.rule for f in session.flags] == ["timing.noisy"]


def test_the_gpu_clocks_interval_holds_what_its_constants_leave_unknown():
    """Two runners' constants a microsecond apart are 10 % of a 10 us call and 0.1 % of a 1 ms one: the
    interval says so (on an H100, honest twins of 10 us calls came out 0.87-1.11x, of 1 ms 0.998-1.000x)."""
    from cudal1.eval.clock import timing

    nulls = [0.2900 + 0.0001 * (i % 5) for i in range(100)]  # 290.0-290.4 us
    cand_nulls = [x + 0.001 for x in nulls]  # 1 us apart
    within = (0.99, 1.01)
    lo, hi = timing.gpu_widened(1.0, within, 0.010, 0.010, nulls, cand_nulls)
    assert lo < 0.92 and hi > 1.09 and lo < within[0] and hi > within[1]
    lo, hi = timing.gpu_widened(1.0, within, 1.0, 1.0, nulls, cand_nulls)
    assert within[0] - 0.001 < lo < within[0] and within[1] < hi < within[1] + 0.001
    assert timing.gpu_widened(1.0, within, 0.010, 0.010, nulls, []) == within
    assert timing.quantile_se([1.0], 0.5) == 0.0 and timing.quantile_se(nulls, 0.5) > 0
