"""Verdict tables (cudal1/cli/verdicts.py) at a terminal's width: ids whole, empty columns gone, a legend,
how the numbers were measured."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from rich.console import Console

from cudal1.cli.verdicts import print_verdicts
from cudal1.core.types import EvalResult, KernelClass, Status, TimingStats
from cudal1.metrics.noise import small_gpu_call
from tests.cli._pty import run_in_terminal

EXAMPLES = Path(__file__).resolve().parents[2] / "src" / "cudal1" / "tasks" / "builtin" / "examples"
LONG_ID = "builtin/level2/gemm_layernorm_swish_with_a_long_name"


def _result(status: Status, speedup: float | None = None, message: str = "", cpu: bool = True) -> EvalResult:
    timing = (
        TimingStats(1.0, 1.0 / speedup, speedup, 0.02, [speedup], speedup_warm=speedup) if speedup else None
    )
    return EvalResult(
        status=status,
        speedup=speedup,
        timing=timing,
        message=message,
        kernel_class=KernelClass.PYTORCH_ONLY,
        protocol={"sizes": "small", "sizes_applied": "small"},
        environment={"device_type": "cpu" if cpu else "cuda"},
    )


def _printed(rows, width: int) -> str:
    console = Console(width=width, record=True, force_terminal=False)
    print_verdicts(console, rows, "t")
    return console.export_text()


def test_at_80_columns_ids_stay_whole_and_messages_wrap_below():
    rows = [
        ("builtin/level2/gemm_layernorm_swish", _result(Status.CORRECT, 1.5)),
        (
            "builtin/level1/x",
            _result(Status.INCORRECT, message="output 0 (trial 0): 10/10 elements off, " * 4),
        ),
    ]
    text = _printed(rows, 80)
    assert all(len(line) <= 80 for line in text.splitlines())
    assert "│ builtin/level2/gemm_layernorm_swish " in text and "│ builtin/level1/x " in text
    assert "…" not in text
    words = " ".join(text.split())
    assert "builtin/level1/x: output 0 (trial 0)" in words  # the message, under the table, not cut
    assert "speedup: reference time / candidate time" in words and "stab.:" in words
    assert "Not shown at this width:" in words
    assert "small sizes" in words and "CPU timings are noisy" in words


def test_empty_columns_are_dropped():
    text = _printed([("a/b", _result(Status.COMPILE_ERROR, cpu=False))], 200)
    header = next(line for line in text.splitlines() if "task" in line)
    for gone in ("warm", "stab.", "ref ms", "cand ms", "message"):
        assert gone not in header
    assert "CPU timings" not in text  # nothing was timed


def test_too_narrow_for_a_table_prints_one_block_per_result():
    text = _printed([(LONG_ID, _result(Status.CORRECT, 2.0))], 40)
    assert LONG_ID in text.splitlines() and "correct, speedup 2.00x" in text


def test_eval_in_a_terminal_of_80_and_100_columns(tmp_path):
    """at 80 columns `eval` printed `built…` and `incor…`; it did not say it ran at small sizes."""
    store = str(tmp_path / "s.sqlite")
    argv = [
        "eval",
        "--task",
        "builtin/level1/softmax_manual_lastdim",
        "--candidate",
        str(EXAMPLES / "softmax_manual_lastdim__torch.py"),
        "--device",
        "cpu",
        "--trials",
        "1",
        "--buckets",
        "2",
        "--store",
        store,
    ]
    for columns in (80, 100):
        code, screen = run_in_terminal(argv, columns)
        assert code == 0, screen
        assert all(len(line) <= columns for line in screen.splitlines()), screen
        assert "│ builtin/level1/softmax_manual_lastdim │" in screen, screen
        assert "…" not in screen and "message" not in screen
        words = " ".join(screen.split())
        assert "speedup: reference time / candidate time" in words and "warm:" in words
        assert "small sizes (SMALL_SIZES)" in words and "CPU timings are noisy" in words


def test_gpu_clock_speedups_of_calls_under_a_tenth_of_a_millisecond_carry_their_precision():
    def gpu(ref_ms: float, clock: str = "gpu") -> EvalResult:
        r = _result(Status.CORRECT, 1.2, cpu=False)
        timing = dataclasses.replace(r.timing, ref_ms=ref_ms, candidate_ms=ref_ms / 1.2)
        return dataclasses.replace(r, timing=timing, protocol={"clock": {"clock": clock}})

    words = " ".join(_printed([("a/small", gpu(0.012)), ("a/large", gpu(0.9))], 200).split())
    assert "Calls under 0.1 ms (1 of 2 results)" in words and "+-20%" in words
    assert "Calls under" not in _printed([("a/large", gpu(0.9))], 200)
    assert "Calls under" not in _printed([("a/host", gpu(0.012, clock="host"))], 200)  # the host clock's own bounds
    stored = gpu(0.012).to_dict()  # a stored result, as the report reads it
    assert small_gpu_call(stored) and not small_gpu_call(gpu(0.9).to_dict())
