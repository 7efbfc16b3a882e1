"""The README's commands are exact: every `cudal1 ...` line parses (its options exist), the laptop recipe
runs as written (slow: on request), and CI runs the quick start and ruff."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cudal1.cli.main import main

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def _commands(text: str) -> list[list[str]]:
    """The `cudal1` invocations of the bash blocks of `text` (continuations joined, comments dropped)."""
    found = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        for line in re.sub(r"\\\n\s*", " ", block).splitlines():
            line = line.split(" #")[0].strip()
            for part in re.split(r"&&|;", line):
                words = shlex.split(part)
                if "cudal1" in words:
                    found.append(words[words.index("cudal1") + 1:])
    return found


def _section(title: str) -> str:
    return README.split(f"## {title}\n", 1)[1].split("\n## ", 1)[0]


@pytest.mark.parametrize("argv", [c for c in _commands(README) if "..." not in c], ids=" ".join)
def test_every_cudal1_command_of_the_readme_parses(argv, capsys):
    """Option names and subcommands exist (`--help` is eager: parsing happens, the command does not run)."""
    assert main([*argv, "--help"]) == 0, capsys.readouterr().err


def test_ci_runs_the_readme_quick_start_and_ruff():
    ci = (ROOT / ".ci" / "run").read_text()
    assert "/^## Quick start/" in ci and 'bash -euo pipefail -c "$quickstart"' in ci
    assert "ruff check src tests" in ci
    quick = _commands(_section("Quick start"))
    assert quick[0] == ["quickstart"]


def test_the_quick_start_installs_as_root_without_sudo_and_with_it(tmp_path):
    """A root container has no sudo binary: the first command stopped at a bare `sudo`."""
    first = _section("Quick start").split("```bash\n", 1)[1].splitlines()[0]
    install = first.split("&&")[0].strip()
    assert install.startswith("$(command -v sudo) apt-get install") and " sudo " not in f" {install} "
    (tmp_path / "apt-get").write_text("#!/bin/sh\necho apt-get ran\n")
    (tmp_path / "sudo").write_text('#!/bin/sh\necho through sudo; exec "$@"\n')
    for tool in ("apt-get", "sudo"):
        (tmp_path / tool).chmod(0o755)
    without = tmp_path / "without"
    without.mkdir()
    (without / "apt-get").symlink_to(tmp_path / "apt-get")
    for path, said in ((str(without), "apt-get ran"), (str(tmp_path), "through sudo")):
        done = subprocess.run([shutil.which("bash"), "-c", install], env={"PATH": path}, capture_output=True,
                              text=True, timeout=30)
        assert done.returncode == 0 and said in done.stdout, (path, done.stdout, done.stderr)
    assert "download.pytorch.org/whl/cpu" in _section("Quick start")  # the wheel a CPU-only machine wants


@pytest.mark.slow
def test_the_laptop_recipe_runs_as_written(tmp_path):
    """Every command of "Training on a laptop" (but pip), in a fresh folder with its own store (~8 min)."""
    env = {**os.environ, "CUDAL1_STORE": str(tmp_path / "store.sqlite"), "PYTHONPATH": str(ROOT / "src")}
    for argv in _commands(_section("Training on a laptop")):
        done = subprocess.run([sys.executable, "-m", "cudal1.cli.main", *argv], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=1800)
        assert done.returncode == 0, (argv, done.stderr[-2000:])
    assert (tmp_path / "sft_data" / "sft.jsonl").is_file()
    assert (tmp_path / "runs" / "rl" / "exemplars.sqlite").is_file()
    for stage in ("ss", "rl"):
        lines = (tmp_path / "runs" / stage / "completions.jsonl").read_text().splitlines()
        assert lines and all("status" in json.loads(line) for line in lines)
    assert "form: torch" in (tmp_path / "runs" / "rl" / "config.yaml").read_text()
