"""`cudal1 explain RESULT`: why a result has its verdict (each flag, its severity, the policy rule that
rejected it), or what it would be under another policy (`--policy`, nothing run again)."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from cudal1.core.errors import SourceError
from cudal1.policy.presets import policy_choices


def explain_command(
    result: Path = typer.Argument(..., help="A result as JSON (`cudal1 eval --json` writes one per line)."),
    line: int = typer.Option(1, "--line", min=1, help="Which line of a JSON-lines file."),
    policy: str = typer.Option("", "--policy", help=f"Re-judge under this policy: {policy_choices()}; "
                               "default: the one the result records."),
    as_json: bool = typer.Option(False, "--json", help="Print the explanation as JSON."),
) -> None:
    """Why a result has its verdict.

    Each flag, its severity and the policy rule that rejected it; --policy re-judges the stored result.
    """
    from cudal1.audit.explain import explain_verdict, format_verdict
    from cudal1.core.types import EvalResult

    try:
        text = result.read_text(encoding="utf-8")
    except OSError as exc:
        raise SourceError(f"cannot read {result}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise SourceError(f"cannot read {result}: not UTF-8 text") from None
    try:
        records = [json.loads(text)]  # one JSON object (indented or not)
    except ValueError:
        records = [t for t in text.splitlines() if t.strip()]  # JSON lines, parsed below
    if len(records) < line:
        raise SourceError(f"{result} has {len(records)} result line(s), not {line}")
    try:
        record = records[line - 1]
        loaded = EvalResult.from_dict(json.loads(record) if isinstance(record, str) else record)
    except (ValueError, KeyError, TypeError) as exc:
        raise SourceError(f"{result}: not a result ({exc})") from None
    explained = explain_verdict(loaded, policy or None)
    typer.echo(json.dumps(explained, indent=1) if as_json else format_verdict(explained))


def register(app: typer.Typer) -> None:
    """Add `cudal1 explain` to the CLI."""
    app.command("explain")(explain_command)
