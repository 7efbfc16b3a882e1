"""`core.files.write_atomically`: whole files or none, no temporary file left behind."""

from __future__ import annotations

import pytest

from cudal1.core.files import write_atomically


def test_a_file_is_written_whole_in_a_folder_made_for_it(tmp_path):
    path = tmp_path / "a" / "b" / "entry.json"
    write_atomically(path, '{"ok": true}')
    write_atomically(path.with_suffix(".cubin"), b"\x7fELF")
    assert path.read_text() == '{"ok": true}' and path.with_suffix(".cubin").read_bytes() == b"\x7fELF"
    write_atomically(path, "{}")  # replaced, not appended
    assert path.read_text() == "{}" and sorted(p.name for p in path.parent.iterdir()) == ["entry.cubin", "entry.json"]


def test_a_failed_write_keeps_the_old_content_and_leaves_no_temporary_file(tmp_path):
    path = tmp_path / "entry.json"
    write_atomically(path, "old")
    with pytest.raises(TypeError):
        write_atomically(path, 42)  # type: ignore[arg-type]  # fails inside the write, after the temporary file
    assert path.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["entry.json"]
