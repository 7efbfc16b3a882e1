"""Scripted completions for the loop tests: fixture candidates wrapped as contrastive answers."""

from __future__ import annotations

from pathlib import Path

from cudal1.eval.config import EvalConfig
from cudal1.loops.augment import format_answer
from cudal1.tasks.sources import load_file

SCRIPTED = Path(__file__).resolve().parents[1] / "fixtures" / "scripted"
CPU_DIR = SCRIPTED / "cpu"
GPU_DIR = SCRIPTED / "gpu"
PROSE = "I would fuse the operations, but I cannot write the code for this one. Try a different approach."

# The fast settings of every CPU test: timings are rough, but the fast rewrite is ~30x and the slow one ~0.2x.
CPU_EVAL = EvalConfig(device="cpu", sizes="full", correctness_trials=2, buckets=2, target_bucket_ms=5,
                      warm_buckets=0, warmup_iters=1)


def cpu_task():
    """The tiny CPU task with a needless big intermediate."""
    return load_file(CPU_DIR / "relu_scale_task.py")


def code(name: str, directory: Path = CPU_DIR) -> str:
    return (directory / f"{name}.py").read_text()


def answer(name: str, directory: Path = CPU_DIR) -> str:
    """A completion with the three contrastive sections around the fixture `name`."""
    return format_answer(code(name, directory), analysis=f"The previous implementations leave room ({name}).",
                         design=f"Implementation '{name}'.")
