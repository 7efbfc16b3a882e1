"""Verdict tables that stay readable in any terminal: `print_verdicts(console, rows, title)`.

What a table of verdicts shows, in this order of importance: the task id (what users copy: never cut or
wrapped), the status, the speedup, then as far as the terminal's width allows the stability, the speedup
with warm caches, both times and the kernel class. A column is left out when no row has a value in it;
one left out for want of width is named under the table. Messages go in a last column when there is room
for them, else under the table, one line per task, wrapped rather than cut. Under the table: a legend of
the columns shown, and notes on how the numbers were measured (the tasks' small sizes, a CPU's noise).

Limits: widths are counted in characters (ids and messages are ASCII in practice); a terminal too narrow for
the task id, status and speedup gets one block of lines per result instead of a table.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from cudal1.core.types import EvalResult, Status
from cudal1.metrics.noise import cpu_noise_note, measured_on_cpu, small_call_note, small_gpu_call

STATUS_STYLE = {
    Status.CORRECT: "green",
    Status.INCORRECT: "red",
    Status.HACK_DETECTED: "magenta",
    Status.COMPILE_ERROR: "yellow",
    Status.RUNTIME_ERROR: "red",
    Status.TIMEOUT: "yellow",
    Status.UNPARSEABLE: "yellow",
    Status.INFRA_ERROR: "yellow",
}
CACHED_MARK = "*"  # after a status read from the results store instead of measured now
MIN_MESSAGE_WIDTH = 24  # a narrower message column would wrap every message into a tall row
MESSAGE_CHARS = 300  # a message's first line, in full up to this (the JSON output has all of it)


def fmt(x: float | None, spec: str = ".2f", suffix: str = "") -> str:
    return "-" if x is None else f"{x:{spec}}{suffix}"


@dataclass(frozen=True)
class Column:
    """One column of numbers or words about a result: its header, its cell and its line in the legend."""

    name: str
    cell: Callable[[EvalResult], str]
    legend: str
    right: bool = True


def _warm(r: EvalResult) -> str:
    return fmt(r.timing.speedup_warm if r.timing else None, ".2f", "x")


SPEEDUP = Column(
    "speedup",
    lambda r: fmt(r.speedup, ".2f", "x"),
    "speedup: reference time / candidate time, caches flushed (above 1x: faster)",
)
#: The columns after task, status and speedup, most useful first: kept in this order while they fit.
OPTIONAL = (
    Column(
        "stab.",
        lambda r: fmt(r.stability, ".1%"),
        "stab.: its spread between timing buckets (IQR/median; lower: steadier)",
    ),
    Column("warm", _warm, "warm: the speedup with warm caches"),
    Column("ref ms", lambda r: fmt(r.ref_ms, ".3f"), "ref/cand ms: median time per call"),
    Column("cand ms", lambda r: fmt(r.candidate_ms, ".3f"), ""),
    Column(
        "class",
        lambda r: r.kernel_class.value if r.kernel_class else "-",
        "class: what the candidate is made of",
        right=False,
    ),
)


def _status(r: EvalResult) -> str:
    return r.status.value + (CACHED_MARK if r.cached else "")


def first_line(text: str, width: int = MESSAGE_CHARS) -> str:
    """A message's first line, with an ellipsis where it was cut (never a silent cut)."""
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line if len(line) <= width else line[: width - 1] + "…"


def _cost(width: int) -> int:
    """Characters a column of `width` takes in a boxed table: its cells, their padding and one border."""
    return width + 3


def plan_columns(rows: Sequence[tuple[str, EvalResult]], width: int) -> tuple[list[Column], list[str], bool]:
    """(optional columns that fit, names of those left out for want of width, whether messages fit inline)."""

    def widest(column: Column) -> int:
        return max(len(column.name), *(len(column.cell(r)) for _, r in rows))

    used = (
        1
        + _cost(max(len("task"), *(len(n) for n, _ in rows)))
        + _cost(max(len("status"), *(len(_status(r)) for _, r in rows)))
        + _cost(widest(SPEEDUP))
    )
    shown, left_out = [], []
    for column in OPTIONAL:
        if all(column.cell(r) == "-" for _, r in rows):
            continue  # empty: nothing to show, nothing to name
        if used + _cost(widest(column)) <= width:
            shown.append(column)
            used += _cost(widest(column))
        else:
            left_out.append(column.name)
    inline = width - used - 3 >= MIN_MESSAGE_WIDTH
    return shown, left_out, inline


def _fits(rows: Sequence[tuple[str, EvalResult]], width: int) -> bool:
    task = max(len("task"), *(len(n) for n, _ in rows))
    status = max(len("status"), *(len(_status(r)) for _, r in rows))
    return (
        1
        + _cost(task)
        + _cost(status)
        + _cost(max(len(SPEEDUP.name), *(len(SPEEDUP.cell(r)) for _, r in rows)))
        <= width
    )


def verdict_table(
    rows: Sequence[tuple[str, EvalResult]], title: str, width: int
) -> tuple[Table, list[str], bool]:
    """The table for a terminal of `width` columns, the columns left out, and whether messages are in it."""
    shown, left_out, inline = plan_columns(rows, width)
    messages = any(r.message.strip() for _, r in rows)
    table = Table(title=escape(title), title_justify="left")
    table.add_column("task", no_wrap=True, min_width=max(len(n) for n, _ in rows))
    table.add_column("status", no_wrap=True)
    table.add_column(SPEEDUP.name, justify="right", no_wrap=True)
    for column in shown:
        table.add_column(column.name, justify="right" if column.right else "left", no_wrap=True)
    if messages and inline:
        table.add_column("message", overflow="fold", ratio=1)
    for name, r in rows:
        style = STATUS_STYLE.get(r.status, "")
        cells = [escape(name), f"[{style}]{_status(r)}[/{style}]" if style else _status(r), SPEEDUP.cell(r)]
        cells += [escape(column.cell(r)) for column in shown]
        if messages and inline:
            cells.append(escape(first_line(r.message)))
        table.add_row(*cells)
    return table, left_out, messages and inline


def notes(rows: Sequence[tuple[str, EvalResult]]) -> list[str]:
    """How the numbers were measured, when a reader could take them for more than they are."""
    out = []
    small = [
        n for n, r in rows if str(r.protocol.get("sizes_applied", r.protocol.get("sizes", ""))) == "small"
    ]
    if small:
        which = "every task" if len(small) == len(rows) else f"{len(small)} of {len(rows)} results"
        out.append(
            f"Measured at the tasks' small sizes (SMALL_SIZES) for {which}: speedups at full size "
            "differ (--sizes full)."
        )
    if any(measured_on_cpu(r) and r.speedup is not None for _, r in rows):
        out.append(cpu_noise_note())
    small_calls = sum(small_gpu_call(r) for _, r in rows)
    if small_calls:
        out.append(small_call_note(small_calls, len(rows)))
    return out


def legend(rows: Sequence[tuple[str, EvalResult]], columns: Iterable[Column]) -> str:
    """One paragraph explaining the columns shown."""
    parts = ([SPEEDUP.legend] if any(r.speedup is not None for _, r in rows) else []) + [
        c.legend for c in columns if c.legend
    ]
    if any(r.cached for _, r in rows):
        parts.append(f"{CACHED_MARK}: read from the results store, not measured now (--force re-measures)")
    return "; ".join(parts) + "." if parts else ""


def print_verdicts(console: Console, rows: Sequence[tuple[str, EvalResult]], title: str) -> None:
    """The table of `rows` (name, result) at the console's width, then its messages, legend and notes."""
    rows = list(rows)
    if not rows:
        console.print(f"{escape(title)}: no results")
        return
    if not _fits(rows, console.width):
        _print_stacked(console, rows, title)
    else:
        table, left_out, inline = verdict_table(rows, title, console.width)
        console.print(table)
        if not inline:
            for name, r in rows:
                if r.message.strip():
                    console.print(f"{escape(name)}: {escape(first_line(r.message))}", highlight=False)
        shown = [c for c in OPTIONAL if c.name in {col.header for col in table.columns}]
        if legend(rows, shown):
            console.print(legend(rows, shown), highlight=False, style="dim")
        if left_out:
            console.print(f"Not shown at this width: {', '.join(left_out)}.", highlight=False, style="dim")
    for note in notes(rows):
        console.print(note, highlight=False, style="yellow")


def _print_stacked(console: Console, rows: Sequence[tuple[str, EvalResult]], title: str) -> None:
    console.print(escape(title), style="italic", highlight=False)
    for name, r in rows:
        console.print(escape(name), highlight=False, soft_wrap=True)  # one line, whatever the width: copyable
        numbers = ", ".join(f"{c.name} {c.cell(r)}" for c in (SPEEDUP, *OPTIONAL) if c.cell(r) != "-")
        console.print(f"  {_status(r)}" + (f", {numbers}" if numbers else ""), highlight=False)
        if r.message.strip():
            console.print(f"  {escape(first_line(r.message))}", highlight=False)
    if legend(rows, OPTIONAL):
        console.print(legend(rows, OPTIONAL), highlight=False, style="dim")
