"""Errors and help name only options that exist: every `--option` that a command's help, the CLI's own messages
or a library error a command can reach names belongs to that command, or to the command written before it
(`cudal1 eval --policy`). `cudal1 quickstart` said "pass --sandbox none" and had no --sandbox."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
import typer.main
from typer.testing import CliRunner

from cudal1.cli.main import app, spelled_fix

SRC = Path(__file__).resolve().parents[2] / "src" / "cudal1"
# An option, with the command that owns it when the text writes one before it ("cudal1 eval --policy").
OPTION = re.compile(r"(?:cudal1((?: [a-z][a-z-]*)+) )?(?<![\w-])(--[a-z][a-z0-9-]*)")


def _leaves(command=None, path=()):
    command = command or typer.main.get_command(app)
    subcommands = getattr(command, "commands", None)
    if not subcommands:
        yield " ".join(path), command
        return
    for name, sub in subcommands.items():
        yield from _leaves(sub, (*path, name))


COMMANDS = dict(_leaves())
EVALUATING = ["eval", "audit", "baseline", "quickstart", "optimize", "augment", "serve", "evaluate-policy",
              "train self-supervised", "train rl"]


ROOT = typer.main.get_command(app)


def _options(command) -> set[str]:
    """A command's options, and the root's (`cudal1 --verbose eval ...`)."""
    return {o for c in (command, ROOT) for p in c.params for o in (*p.opts, *getattr(p, "secondary_opts", ()))} \
        | {"--help"}


def _owner(words: str | None, default: str) -> str | None:
    """The command a `cudal1 WORDS --opt` mention names (its longest known prefix), else `default`."""
    if not words:
        return default
    parts = words.split()
    for n in range(len(parts), 0, -1):
        if " ".join(parts[:n]) in COMMANDS:
            return " ".join(parts[:n])
    return None


def unknown_options(text: str, command: str) -> list[str]:
    """The options `text` names that their command lacks (`command` unless the text names another)."""
    out = []
    for match in OPTION.finditer(" ".join(text.split())):
        owner = _owner(match.group(1), command)
        if owner is None or match.group(2) not in _options(COMMANDS[owner]):
            out.append(f"{owner or match.group(1)}: {match.group(2)}")
    return out


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_option_a_help_names_exists(command):
    outcome = CliRunner().invoke(app, [*command.split(), "--help"], terminal_width=1000, max_content_width=1000)
    assert outcome.exit_code == 0, outcome.output
    assert unknown_options(outcome.output, command) == []


def _messages(tree: ast.AST):
    """(enclosing class or function names, text) of every string literal in a raise, a print or an echo, f-strings
    joined (their holes dropped)."""
    def text(node: ast.AST) -> str:
        return " ".join(n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str))

    def visit(node: ast.AST, scope: tuple[str, ...]):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                yield from visit(child, (*scope, child.name))
                continue
            if isinstance(child, ast.Raise) and child.exc is not None:
                yield scope, text(child.exc)
            elif isinstance(child, ast.Call) and getattr(child.func, "attr", getattr(child.func, "id", "")) in (
                    "echo", "print", "secho", "BadParameter", "MissingDependencyError"):
                yield scope, text(child)
            yield from visit(child, scope)

    yield from visit(tree, ())


# Where a library error can surface: module (or module:Class/function) -> the commands that reach it.
# Each command must have every option the error names; a new module whose errors name options is listed here.
REACH = {
    "audit/pages.py": ["audit-pages", "audit-ingest"],
    "audit/select.py": ["audit"],
    "loops/augment.py": ["augment"],
    "service/server.py": ["serve"],
    "service/server_config.py": ["serve"],
    "train/config.py": ["train sft", "train self-supervised", "train rl"],
    "train/config.py:SFTStageConfig": ["train sft"],
    "train/policy_eval.py": ["evaluate-policy"],
    "train/sft.py": ["train sft"],
}
# Options of other programs, named in their own messages (compiler and sandbox command lines).
FOREIGN = {"raw_cuda/compiler.py", "eval/sandbox.py", "kernel_form/spec.py"}


def _reach(relative: str, scope: tuple[str, ...]) -> list[str] | None:
    for n in range(len(scope), -1, -1):
        key = relative + (":" + ".".join(scope[:n]) if n else "")
        if key in REACH:
            return REACH[key]
    return None


def test_every_option_an_error_names_exists_in_the_commands_that_reach_it():
    problems = []
    for path in sorted(SRC.rglob("*.py")):
        relative = path.relative_to(SRC).as_posix()
        if relative in FOREIGN:
            continue
        cli = relative.startswith("cli/")
        for scope, message in _messages(ast.parse(path.read_text())):
            if not OPTION.search(message):
                continue
            if cli:  # a command's own module: the commands it defines (shared modules: any command)
                module = "cudal1." + relative[:-3].replace("/", ".")
                own = [name for name, c in COMMANDS.items() if c.callback.__module__ == module] or list(COMMANDS)
                where = [name for name in own if c_name(COMMANDS[name]) in scope] or own
                if all(unknown_options(message, name) for name in where):
                    problems.append((relative, scope, message[:120], unknown_options(message, where[0])))
                continue
            reach = _reach(relative, scope)
            if reach is None:
                problems.append((relative, scope, message[:120], "not in REACH: say which commands reach it"))
                continue
            problems += [(relative, scope, name, bad) for name in reach if (bad := unknown_options(message, name))]
    assert problems == []


def c_name(command) -> str:
    return command.callback.__name__


@pytest.mark.parametrize("command, spelling", [
    ("eval", "--sandbox none"), ("quickstart", "--sandbox none"), ("baseline", "--sandbox none"),
    ("optimize", "--sandbox none"), ("evaluate-policy", "--sandbox none"),
    ("train rl", "--sandbox none"), ("train self-supervised", "--sandbox none"),
])
def test_the_missing_sandbox_error_names_each_evaluating_command_s_own_option(command, spelling):
    message = "profile 'strict' evaluates ... or run without one (recorded in every result): sandbox=none"
    shown = spelled_fix(message, ("sandbox", "none"), [*command.split(), "--device", "cpu"])
    assert shown.endswith(spelling) and unknown_options(shown, command) == []
    assert set(EVALUATING) <= set(COMMANDS)
    assert all("--sandbox" in _options(COMMANDS[name]) for name in EVALUATING)


def test_a_fix_is_spelled_as_training_spells_it_or_left_alone():
    device = "no CUDA GPU is visible; use device=cpu"
    assert spelled_fix(device, ("device", "cpu"), ["train", "rl", "-o", "x"]).endswith("use --set eval_device=cpu")
    assert spelled_fix(device, ("device", "cpu"), ["eval"]).endswith("use --device cpu")
    pool = "the Ray cluster has no GPU: ... this machine's GPUs: workers=local"
    assert spelled_fix(pool, ("workers", "local"), ["train", "rl"]).endswith("--set workers=local")
    assert spelled_fix(pool, ("workers", "local"), ["optimize", "t"]).endswith("--workers local")
    assert spelled_fix(device, ("device", "cpu"), ["tasks", "list"]) == device  # no such setting: as written
