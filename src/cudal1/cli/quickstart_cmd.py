"""`cudal1 quickstart`: the main job on embedded defaults — evaluate the built-in example candidates."""

from __future__ import annotations

from pathlib import Path

import typer

from cudal1.cli import common, verdicts
from cudal1.eval import EvalConfig, evaluate_many
from cudal1.eval.config import resolve_device
from cudal1.tasks.sources import example_candidates

FORM_NAMES = {"torch": "PyTorch-level", "cuda": "load_inline CUDA", "raw": "raw-CUDA"}
EXAMPLE_FORM_NAMES = {"load_inline": "cuda", "raw_cuda": "raw"}  # --form as optimize and augment name them


def quickstart_command(
    device: str = common.DeviceOpt,
    form: list[str] = typer.Option([], "--form", help="Example forms: torch, load_inline (also cuda), "
                                                      "raw_cuda (also raw); default: all runnable here."),
    store_path: Path | None = common.StoreOpt, no_store: bool = common.NoStoreOpt, force: bool = common.ForceOpt,
    sandbox: str = common.SandboxOpt,
) -> None:
    """Evaluate the built-in examples (no GPU or LLM needed).

    Runs cudal1's example candidates against their built-in tasks and prints the verdicts.

    Needs no GPU and no LLM: on a CPU-only machine it evaluates the PyTorch-level examples on the tasks'
    small sizes; with a GPU it evaluates every example (custom CUDA kernels included) at full size.
    """
    resolved = resolve_device(device)
    forms = [EXAMPLE_FORM_NAMES.get(f, f) for f in form]  # the names optimize's --form uses, too
    pairs = example_candidates(resolved.split(":")[0], forms or None)
    cfg = EvalConfig(device=resolved, sandbox=sandbox)
    store = common.open_store(store_path, no_store)
    common.console.print(f"Evaluating {len(pairs)} built-in example candidate(s) on {resolved} "
                         f"(profile strict, sizes {cfg.resolved(resolved).sizes})", highlight=False)
    rows = []
    with common.progress_bar() as bar:
        job = bar.add_task("evaluating", total=len(pairs), best="")

        def on_result(_index, result):
            rows.append(result)
            best = max((r.speedup for r in rows if r.speedup), default=None)
            bar.update(job, advance=1, best=f"best {best:.2f}x" if best else "")

        results = evaluate_many([(t, src) for t, _, src in pairs], cfg, store=store, force=force,
                                label="quickstart", on_result=on_result)
    labels = {label for _, label, _ in pairs}
    if len(labels) == 1:  # one form: the ids alone (copyable), the form in the title
        form = labels.pop()
        names = [t.id for t, _, _ in pairs]
        title = f"cudal1 quickstart: {FORM_NAMES.get(form, form)} examples"
    else:
        names, title = [f"{t.id} [{label}]" for t, label, _ in pairs], "cudal1 quickstart"
    verdicts.print_verdicts(common.console, list(zip(names, results, strict=True)), title)
    correct = sum(r.status.is_success for r in results)
    common.console.print(f"{correct}/{len(results)} correct; results stored in "
                         f"{store.path if store else 'nowhere (--no-store)'}", highlight=False)
