"""`cudal1 tasks list|show`: browse and validate task sources."""

from __future__ import annotations

import json

import typer
from rich.console import Console
from rich.table import Table

from cudal1.core.errors import TaskError
from cudal1.tasks import find_task, load_tasks
from cudal1.tasks.inspect import inspect_task

app = typer.Typer(help="List, validate and describe tasks.", no_args_is_help=True, rich_markup_mode=None)
console = Console()

SOURCE_HELP = "builtin, a KernelBench folder, hf:NAME_OR_FILE[:SPLIT], jsonl:PATH or FILE.py."


@app.command("list")
def list_tasks(
    source: str = typer.Option("builtin", "--source", "-s", help=SOURCE_HELP),
    validate: bool = typer.Option(False, "--validate", help="Run each task's factories on the meta device; exit 1 "
                                                           "if any task is invalid."),
    as_json: bool = typer.Option(False, "--json", help="Print a JSON list instead of a table."),
) -> None:
    """List the tasks of a source.

    List the tasks of a source (with their candidates' presence for releases).
    """
    from cudal1.tasks.sources import load_candidates

    is_release = source.startswith("jsonl:") or source.endswith(".jsonl")
    pairs = load_candidates(source) if is_release else [(t, None) for t in load_tasks(source)]
    rows = []
    for task, cand in pairs:
        row = {"id": task.id, "level": task.level, "description": task.description}
        if is_release:
            row["has_candidate"] = cand is not None
            row["published"] = cand.published if cand else {}
        if validate:
            try:
                inspect_task(task)
                row["valid"], row["error"] = True, None
            except TaskError as exc:
                row["valid"], row["error"] = False, str(exc)
        rows.append(row)
    if as_json:
        typer.echo(json.dumps(rows, indent=1))
        if validate and not all(r["valid"] for r in rows):
            raise typer.Exit(1)
        return
    table = Table(title=f"{len(rows)} tasks from {source}")
    # Ids are what users copy: never cut or wrapped; the description gives way instead (one line, shortened).
    id_width = max((len(r["id"]) for r in rows), default=2)
    extra = (("candidate",) if is_release else ()) + (("valid",) if validate else ())
    table.add_column("id", no_wrap=True, min_width=id_width)
    table.add_column("level", no_wrap=True)
    table.add_column("description", no_wrap=True, overflow="ellipsis")
    for col in extra:
        table.add_column(col)
    room = max(12, min(70, console.width - id_width - 5 - 12 * len(extra) - 3 * (3 + len(extra)) - 1))
    for r in rows:
        text = r["description"]
        cells = [r["id"], str(r["level"] or ""), text if len(text) <= room else text[: room - 1] + "…"]
        if is_release:
            cells.append("yes" if r["has_candidate"] else "-")
        if validate:
            cells.append("ok" if r["valid"] else f"[red]{r['error']}[/red]")
        table.add_row(*cells)
    console.print(table)
    if is_release:
        console.print(f"{sum(r['has_candidate'] for r in rows)} of {len(rows)} tasks have a candidate")
    if validate and not all(r["valid"] for r in rows):
        raise typer.Exit(1)  # so that --validate can gate a pipeline


@app.command("show")
def show_task(
    task_id: str = typer.Argument(..., help="Task id, e.g. builtin/level1/softmax_lastdim."),
    source: list[str] = typer.Option(["builtin"], "--source", "-s", help=SOURCE_HELP),
    sizes: str = typer.Option("full", help="full, or small (the task's SMALL_SIZES)."),
    code: bool = typer.Option(False, "--code", help="Also print the reference source."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Show a task: origin, sizes, input and output shapes.

    Show a task: where it comes from, its sizes, input and output shapes.
    """
    task = find_task(task_id, source)
    info = inspect_task(task, sizes=sizes)
    if as_json:
        typer.echo(json.dumps({**info.to_dict(), "origin": task.origin, "hash": task.hash}, indent=1))
        return
    console.print(f"[bold]{task.id}[/bold]  (level {task.level}, from {task.origin})")
    if info.description:
        console.print(info.description)
    console.print(f"sizes ({sizes}): " + ", ".join(f"{k}={v}" for k, v in info.constants.items()))
    console.print(f"init inputs: {', '.join(map(str, info.init_inputs)) or '-'}")
    console.print(f"inputs:      {', '.join(map(str, info.inputs)) or '-'}")
    console.print(f"outputs:     {', '.join(map(str, info.outputs)) or '-'}")
    if info.note:
        console.print(f"[yellow]{info.note}[/yellow]")
    if code:
        typer.echo(task.source)  # verbatim: no wrapping, so the output is the module itself
