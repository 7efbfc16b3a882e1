"""Shared fixtures of the report tests: a small synthetic run, and its plots drawn once per session."""

from __future__ import annotations

import pytest

from cudal1.metrics.rows import ResultRow


def make_rows() -> list[ResultRow]:
    """3 levels, eager + torch_compile, SOL fractions on correct rows, published scores for an audit.

    Eager over all rows with failures as 1: [2, .5, 1, 4, 1, 1] -> mean 1.58, median 1.00, p25 1.00,
    p75 1.75, max 4.00, success 4/6, >1.01x 2/6, geomean 4^(1/4) = 1.41, fast_p 66.7/50/50/33.3/33.3/16.7%.
    """
    return [
        ResultRow("t1", level=1, status="correct", speedup=2.0, baselines={"torch_compile": 1.0},
                  kernel_class="custom_cuda", flags=["extra_cuda_stream"], published={"score_default": 2.0},
                  sol={"reference": 0.2, "candidate": 0.4}),
        ResultRow("t2", level=1, status="correct", speedup=0.5, baselines={"torch_compile": 0.25},
                  kernel_class="pytorch_only", published={"score_default": 1.2},
                  sol={"reference": 0.3, "candidate": 0.15}),
        ResultRow("t3", level=1, status="incorrect", kernel_class="custom_cuda", flags=["fp16_downgrade"],
                  published={"score_default": 8.0}),
        ResultRow("t4", level=2, status="correct", speedup=4.0, baselines={"torch_compile": 2.0},
                  kernel_class="custom_cuda", flags=["extra_cuda_stream", "fp16_downgrade"],
                  published={"score_default": 4.4}, sol={"reference": 0.1, "candidate": 0.4}),
        ResultRow("t5", level=2, status="compile_error"),
        ResultRow("t10", level=3, status="correct", speedup=1.0, kernel_class="flags_only",
                  published={"score_default": 1.05}),
    ]


META = {"gpu": "NVIDIA H100 80GB HBM3", "torch": "2.11.0", "cuda": "13.0", "protocol": "cold-l2, 7 buckets",
        "date": "1999-12-31"}


@pytest.fixture(scope="session")
def meta() -> dict[str, str]:
    return dict(META)


@pytest.fixture(scope="session")
def rows() -> list[ResultRow]:
    return make_rows()


@pytest.fixture(scope="session")
def pngs(rows) -> dict[str, bytes]:
    """The plots of `rows`, drawn once (matplotlib is slow to import and to draw)."""
    pytest.importorskip("matplotlib")
    from cudal1.report.plots import render_plots

    return render_plots(rows)
