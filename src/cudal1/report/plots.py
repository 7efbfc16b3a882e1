"""PNG plots of a run: speedup CDF per baseline, speedups per level, speed-of-light scatter.

`planned_plots` says which plots the rows support without importing matplotlib; `render_plots` draws them
and returns PNG bytes. Matplotlib is imported lazily and used through its object API with the Agg canvas
(no pyplot, no global backend switch), so a library user's own plotting is left untouched.

Determinism: for a fixed input and a fixed matplotlib version the PNG bytes are identical across calls
(no "Software" metadata, fixed sizes and dpi, rcParams pinned where they matter). Bytes may still differ
across matplotlib or FreeType versions.
"""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from cudal1.core.errors import MissingDependencyError
from cudal1.metrics.aggregate import baselines_present
from cudal1.metrics.rows import ResultRow

CDF_PLOT = "speedup_cdf.png"
LEVEL_PLOT = "speedup_by_level.png"
SOL_PLOT = "speed_of_light.png"

_DPI = 100
# Pinned so that a user's matplotlibrc changes neither the look nor the bytes of our PNGs.
_RC = {"font.size": 9.0, "axes.grid": True, "grid.alpha": 0.3, "svg.hashsalt": "cudal1",
       "figure.dpi": _DPI, "savefig.dpi": _DPI, "savefig.bbox": None}


@dataclass(frozen=True)
class PlotSpec:
    """A plot the report can show: its file name (under `plots/`) and a one-line caption."""

    name: str
    caption: str


def has_sol(row: ResultRow) -> bool:
    """True when a correct row carries both SOL fractions (a wrong kernel's speed of light means nothing)."""
    return row.is_correct and row.sol.get("reference") is not None and row.sol.get("candidate") is not None


def planned_plots(rows: Sequence[ResultRow]) -> list[PlotSpec]:
    """The plots `render_plots` will draw for these rows, in report order (no matplotlib needed)."""
    specs = []
    if any(r.speedup_vs(b) is not None for r in rows for b in baselines_present(rows)):
        specs.append(PlotSpec(CDF_PLOT, "Cumulative distribution of speedups of correct tasks, per baseline "
                                        "(log x-axis; the dashed line is 1x)."))
    if any(r.speedup_vs("eager") is not None for r in rows):
        specs.append(PlotSpec(LEVEL_PLOT, "Speedup vs eager of correct tasks, per level (log y-axis)."))
    if any(has_sol(r) for r in rows):
        specs.append(PlotSpec(SOL_PLOT, "Speed-of-light fraction of the reference (x) and of the candidate "
                                        "(y); points above the diagonal got closer to the hardware limit."))
    return specs


def plots_available() -> bool:
    """Whether matplotlib (the `report` extra) is installed and imports."""
    try:
        _require_matplotlib()
    except MissingDependencyError:
        return False
    return True


def _require_matplotlib() -> Any:
    try:
        import matplotlib
        from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: F401
    except ImportError as exc:
        raise MissingDependencyError("matplotlib", "report", "report plots") from exc
    return matplotlib


def _new_axes(figsize: tuple[float, float]) -> tuple[Any, Any]:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=figsize, dpi=_DPI)
    FigureCanvasAgg(fig)
    return fig, fig.add_subplot()


def _to_png(fig: Any) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=_DPI, metadata={"Software": None})
    return buf.getvalue()


def _plain_log_ticks(axis: Any) -> None:
    """Label a log axis 0.5, 1, 2, 10 rather than 5x10^-1 (readable for the narrow ranges speedups span).

    Minor ticks get labels (only at mantissas 2, 3 and 5, to avoid crowding) when the view spans at most
    1.5 decades; wider views label the decades only.
    """
    from matplotlib.ticker import FuncFormatter

    def minor(value: float, _pos: int) -> str:
        lo, hi = sorted(axis.get_view_interval())
        if lo <= 0 or math.log10(hi / lo) > 1.5:
            return ""
        mantissa = value / 10 ** math.floor(math.log10(value) + 1e-9)
        return f"{value:g}" if round(mantissa) in (2, 3, 5) and abs(mantissa - round(mantissa)) < 1e-6 else ""

    axis.set_major_formatter(FuncFormatter(lambda value, _pos: f"{value:g}"))
    axis.set_minor_formatter(FuncFormatter(minor))


def _labels(rows: Sequence[ResultRow]) -> list[str]:
    return sorted({r.label for r in rows})


def _plot_cdf(rows: Sequence[ResultRow]) -> bytes:
    fig, ax = _new_axes((7.0, 4.5))
    labels = _labels(rows)
    styles = ["-", "--", ":", "-."]
    for li, label in enumerate(labels):
        in_label = [r for r in rows if r.label == label]
        for baseline in baselines_present(in_label):
            xs = sorted(v for v in (r.speedup_vs(baseline) for r in in_label) if v is not None)
            if not xs:
                continue
            ys = [(i + 1) / len(xs) for i in range(len(xs))]
            name = f"{label or 'unlabelled'}: {baseline}" if len(labels) > 1 else baseline
            ax.step(xs, ys, where="post", linestyle=styles[li % len(styles)], label=f"{name} (n={len(xs)})")
    ax.set_xscale("log")
    _plain_log_ticks(ax.xaxis)
    ax.axvline(1.0, color="0.4", linestyle="--", linewidth=1.0)
    ax.set_ylim(0.0, 1.02)
    ax.set_xlabel("speedup (x, log scale)")
    ax.set_ylabel("fraction of correct tasks with speedup <= x")
    ax.set_title("Speedup CDF per baseline")
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    return _to_png(fig)


def _level_name(level: int | None) -> str:
    return "unknown" if level is None else f"L{level}"


def _plot_levels(rows: Sequence[ResultRow]) -> bytes:
    fig, ax = _new_axes((7.0, 4.5))
    labels = _labels(rows)
    levels = sorted({r.level for r in rows}, key=lambda lv: (lv is None, lv or 0))
    data, ticks = [], []
    for level in levels:
        for label in labels:
            vals = [v for r in rows if r.level == level and r.label == label
                    for v in [r.speedup_vs("eager")] if v is not None]
            if vals:
                data.append(vals)
                run = f"\n{label or 'unlabelled'}" if len(labels) > 1 else ""
                ticks.append(f"{_level_name(level)}{run}\n(n={len(vals)})")
    positions = list(range(1, len(data) + 1))
    ax.boxplot(data, positions=positions, widths=0.6, showfliers=True)
    ax.set_xticks(positions)
    ax.set_xticklabels(ticks)
    ax.set_yscale("log")
    _plain_log_ticks(ax.yaxis)
    ax.axhline(1.0, color="0.4", linestyle="--", linewidth=1.0)
    ax.set_ylabel("speedup vs eager (x, log scale)")
    ax.set_title("Speedup vs eager per level (correct tasks)")
    fig.tight_layout()
    return _to_png(fig)


def _plot_sol(rows: Sequence[ResultRow]) -> bytes:
    fig, ax = _new_axes((5.5, 5.5))
    points = [r for r in rows if has_sol(r)]
    levels = sorted({r.level for r in points}, key=lambda lv: (lv is None, lv or 0))
    for level in levels:
        sel = [r for r in points if r.level == level]
        ax.scatter([r.sol["reference"] for r in sel], [r.sol["candidate"] for r in sel], s=18, alpha=0.8,
                   label=f"{_level_name(level)} (n={len(sel)})")
    ax.plot([0.0, 1.0], [0.0, 1.0], color="0.4", linestyle="--", linewidth=1.0)
    ax.set_xlim(-0.02, 1.02)
    ax.set_ylim(-0.02, 1.02)
    ax.set_aspect("equal")
    ax.set_xlabel("reference: fraction of speed of light")
    ax.set_ylabel("candidate: fraction of speed of light")
    ax.set_title("Speed of light")
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    return _to_png(fig)


_DRAW = {CDF_PLOT: _plot_cdf, LEVEL_PLOT: _plot_levels, SOL_PLOT: _plot_sol}


def render_plots(rows: Sequence[ResultRow]) -> dict[str, bytes]:
    """Draw every plot of `planned_plots(rows)`; returns file name -> PNG bytes, in report order.

    Raises:
        MissingDependencyError: matplotlib is not installed (extra `report`).
    """
    matplotlib = _require_matplotlib()
    out: dict[str, bytes] = {}
    with matplotlib.rc_context(_RC):
        for spec in planned_plots(rows):
            out[spec.name] = _DRAW[spec.name](rows)
    return out

