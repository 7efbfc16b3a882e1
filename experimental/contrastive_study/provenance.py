"""Where a half of the study was made: the code (commit and a digest of the sources), the libraries, the host
and the date, recorded with the GPU table (`measure.py`) and with the CPU results (`run.py`).

The commit alone was not enough: the first table recorded 3d2a269, the stale git metadata of the device's
checkout, while it was measured with the code of 5672920. `source_sha256` hashes the study's and the
training stages' sources as they were imported, so two results made with the same code say so whatever git
says; `git_dirty` says whether the checkout differed from its commit.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import platform
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import cudal1

STUDY = Path(__file__).resolve().parent  # experimental/contrastive_study
PACKAGE = Path(cudal1.__file__).resolve().parent  # src/cudal1
#: The sources whose digest identifies the code of a result: the study's, and these packages of cudal1.
SOURCE_DIRS = ("train", "exemplars", "core")
LIBRARIES = ("torch", "transformers", "trl", "datasets", "tokenizers", "accelerate", "peft", "numpy")


def _git(*args: str) -> str | None:
    try:
        out = subprocess.run(["git", *args], capture_output=True, text=True, timeout=10, cwd=STUDY)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def source_sha256() -> str:
    """SHA-256 over the study's files and those of `SOURCE_DIRS` (relative path and content, in sorted
    order; the study's paths as `contrastive_study/...`)."""
    digest = hashlib.sha256()
    roots = [(STUDY.parent, STUDY)] + [(PACKAGE, PACKAGE / sub) for sub in SOURCE_DIRS]
    for base, folder in roots:
        for path in sorted(folder.rglob("*.py")):
            digest.update(str(path.relative_to(base)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {"python": platform.python_version()}
    for name in LIBRARIES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


def provenance(**extra: Any) -> dict[str, Any]:
    """The code, libraries, host and date of a result being made now (module docstring), plus `extra`."""
    status = _git("status", "--porcelain", "--untracked-files=no")
    return {"git_commit": _git("rev-parse", "HEAD"), "git_dirty": bool(status) if status is not None else None,
            "source_sha256": source_sha256(), "versions": versions(),
            "host": {"hostname": platform.node(), "platform": platform.platform(), "cpu": _cpu_model(),
                     "cpu_count": os.cpu_count()},
            "date": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"), "command": " ".join(sys.argv),
            **extra}
