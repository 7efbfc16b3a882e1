"""The evaluator, in two halves (see README, "How the evaluator decides"):

- the trusted parent, the modules of this package: it draws every seed, compares, times, decides the verdict
  and writes the store (`pipeline`, `scheduler`, `evaluation`, `session`, `measure`, `timing`, ...);
- what runs inside the sandboxed runner processes (`cudal1.eval.inside`), which imports nothing of the
  parent;
- what both use (`cudal1.eval.shared`): the channel, the typed protocol, doorbells, arenas, driver bindings.

The names below are loaded on first use, so that a runner (`python -m cudal1.eval.inside.runner`, which
imports this package first) loads none of the parent's modules.
"""

from __future__ import annotations

from cudal1.core.lazy import lazy_exports

_EXPORTS = {
    "EvalConfig": "cudal1.eval.config", "PROFILES": "cudal1.eval.config",
    "evaluate_candidate": "cudal1.eval.pipeline", "evaluate_many": "cudal1.eval.scheduler",
    "EvalResult": "cudal1.core.types", "Flag": "cudal1.core.types", "KernelClass": "cudal1.core.types",
    "Mismatch": "cudal1.core.types", "Severity": "cudal1.core.types", "Status": "cudal1.core.types",
    "TimingStats": "cudal1.core.types",
}

__all__ = sorted(_EXPORTS)
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
