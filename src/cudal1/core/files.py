"""Files that several processes share (build caches, markers): each written whole or not at all."""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path


def write_atomically(path: Path, data: bytes | str) -> None:
    """Write `data` to `path` through a temporary file of its own in the same folder, then a rename: a process
    reading meanwhile sees the old content or the new, never half of it, and concurrent writers never share a
    temporary file. The folder is made if missing; a failed write leaves no temporary file behind. Raises
    OSError."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name[:32]}.", suffix=".tmp", dir=path.parent)
    try:
        mode, encoding = ("wb", None) if isinstance(data, bytes) else ("w", "utf-8")
        with os.fdopen(fd, mode, encoding=encoding) as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
