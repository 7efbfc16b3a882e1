"""`cudal1 check`: static analysis of a candidate (no code is run)."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from cudal1.analysis.presets import preset_choices
from cudal1.cli.common import read_source
from cudal1.core.names import canonical_preset


def check_command(
    candidate: Path = typer.Argument(..., help="Candidate module to analyse (or a kernel-form spec to check)."),
    ref: Path | None = typer.Option(None, "--ref", help="Reference module, to compare sizes and get_inputs."),
    preset: str = typer.Option("strict", "--preset", help=f"Static preset: {preset_choices()}.",
                               callback=canonical_preset),
    as_json: bool = typer.Option(False, "--json", help="Print the report as JSON."),
) -> None:
    """Static analysis of a candidate: class and flags.

    Class: custom_cuda, triton, pytorch_only or flags_only.

    Exits 1 when a flag rejects the candidate under the preset, or it does not parse (so it can gate a
    pipeline), else 0. A kernel-form spec (JSON) has no Python to analyse: its structure and its steps against
    the kernels' signatures are checked (the build and the scan are `cudal1 eval`'s).
    """
    from cudal1.analysis import analyze_source, format_report, rejecting_flags
    from cudal1.core.forms import is_kernel_form

    source = read_source(candidate, "candidate")
    if is_kernel_form(source):
        _check_spec(source, as_json)
        return
    reference = read_source(ref, "reference") if ref is not None else None
    report = analyze_source(source, reference_source=reference, preset=preset)
    if as_json:
        typer.echo(json.dumps(report.to_dict(), indent=1))
    else:
        typer.echo(format_report(report))
    # A source that does not parse cannot be evaluated at all (`cudal1 eval` calls it compile_error).
    if rejecting_flags(report, preset) or any(f.rule == "syntax_error" for f in report.flags):
        raise typer.Exit(1)


def _check_spec(source: str, as_json: bool) -> None:
    """A kernel-form spec's structure and steps (`parse_spec`, `check_against_source`); exit 1 when wrong."""
    from cudal1.kernel_form.errors import SpecError
    from cudal1.kernel_form.spec import check_against_source, parse_spec

    try:
        spec = parse_spec(source)
        check_against_source(spec)
    except SpecError as exc:
        error = str(exc)
    else:
        error = ""
    if as_json:
        typer.echo(json.dumps({"form": "kernel", "ok": not error, "error": error or None}, indent=1))
    else:
        typer.echo(f"kernel-form spec: {error}" if error else
                   f"kernel-form spec: valid ({len(spec.steps)} step(s): "
                   f"{', '.join(dict.fromkeys(s.kernel for s in spec.steps))}); build and scan: cudal1 eval")
    if error:
        raise typer.Exit(1)
