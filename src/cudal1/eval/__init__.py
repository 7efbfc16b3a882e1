"""The evaluator: sandboxed runners for the reference and the candidate, a trusted parent that compares,
times and decides (see README, "How the evaluator decides")."""

from cudal1.core.types import EvalResult, Flag, KernelClass, Mismatch, Severity, Status, TimingStats
from cudal1.eval.config import PROFILES, EvalConfig
from cudal1.eval.pipeline import evaluate_candidate
from cudal1.eval.scheduler import evaluate_many

__all__ = ["EvalConfig", "PROFILES", "evaluate_candidate", "evaluate_many", "EvalResult", "Flag", "KernelClass",
           "Mismatch", "Severity", "Status", "TimingStats"]
