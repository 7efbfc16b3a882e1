"""The committed audits read back: every audit folder under docs/audit rewrites byte for byte from its own
audit.json (`cudal1 audit --report-only --from-audit`), and the pages of the audit of every release are what
its committed records give."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from cudal1.audit.pages import PagesConfig, rebuild
from cudal1.audit.saved import report_saved_audit
from cudal1.report import plots_available

DOCS = Path(__file__).resolve().parents[2] / "docs" / "audit"
FOLDERS = sorted(p.parent for p in DOCS.rglob("audit.json"))
RELEASES = DOCS / "cuda-l1-releases"


def test_the_protocol_3_audit_is_among_the_folders():
    assert DOCS / "cuda-l1-h100-h200" in FOLDERS


@pytest.mark.parametrize("folder", FOLDERS, ids=lambda p: str(p.relative_to(DOCS)))
def test_every_audit_folder_reads_back_byte_for_byte(folder, tmp_path):
    plots = plots_available() and (folder / "plots").is_dir()
    written = report_saved_audit(folder, tmp_path, plots=plots)
    for name, path in written.items():
        if name.endswith((".png", ".html")) and not plots:
            continue
        assert path.read_bytes() == (folder / name).read_bytes(), name


@pytest.mark.skipif(not (RELEASES / "static").is_dir(), reason="no audit of every release committed")
def test_the_release_pages_are_what_the_records_give(tmp_path):
    copy = tmp_path / "audit"
    shutil.copytree(RELEASES, copy)
    plots = plots_available() and any((copy / name / "plots").is_dir() for name in ("h100", "a100"))
    written = rebuild(PagesConfig(audit_dir=str(copy), earlier=(f"h100={DOCS / 'cuda-l1-h100-h200'}",), plots=plots))
    for path in written:
        relative = path.relative_to(copy)
        if relative.suffix in (".png", ".html") and not plots:
            continue
        assert path.read_bytes() == (RELEASES / relative).read_bytes(), relative
