"""The hardened evaluator: isolated build and run, correctness, timing, guards, verdicts."""

from cudal1.core.types import EvalResult, Flag, KernelClass, Mismatch, Severity, Status, TimingStats
from cudal1.eval.config import PROFILES, EvalConfig
from cudal1.eval.pipeline import evaluate_candidate, evaluate_many

__all__ = ["EvalConfig", "PROFILES", "evaluate_candidate", "evaluate_many", "EvalResult", "Flag", "KernelClass",
           "Mismatch", "Severity", "Status", "TimingStats"]
