"""`cudal1 check`: static analysis of a candidate (no code is run)."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from cudal1.analysis.presets import preset_choices
from cudal1.cli.common import read_source
from cudal1.core.names import canonical_preset


def check_command(
    candidate: Path = typer.Argument(..., help="Candidate module to analyse."),
    ref: Path | None = typer.Option(None, "--ref", help="Reference module, to compare sizes and get_inputs."),
    preset: str = typer.Option("strict", "--preset", help=f"Static preset: {preset_choices()}.",
                               callback=canonical_preset),
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON."),
) -> None:
    """Static analysis of a candidate: class and flags.

    Class: custom_cuda, triton, pytorch_only or flags_only.

    Exits 1 when a flag rejects the candidate under the preset, or it does not parse (so it can gate a
    pipeline), else 0.
    """
    from cudal1.analysis import analyze_source, format_report, rejecting_flags

    source = read_source(candidate, "candidate")
    reference = read_source(ref, "reference") if ref is not None else None
    report = analyze_source(source, reference_source=reference, preset=preset)
    if as_json:
        typer.echo(json.dumps(report.to_dict(), indent=1))
    else:
        typer.echo(format_report(report))
    # A source that does not parse cannot be evaluated at all (`cudal1 eval` calls it compile_error).
    if rejecting_flags(report, preset) or any(f.rule == "syntax_error" for f in report.flags):
        raise typer.Exit(1)
