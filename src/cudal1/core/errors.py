"""Typed errors. Each is raised where the problem is found and carries a one-line, user-facing message."""

from __future__ import annotations


class Cudal1Error(Exception):
    """Base class: anything the CLI should print as one line instead of a traceback.

    `fix`, when set, is the (setting, value) that resolves the error, named by its config field, and the message
    ends with `setting=value`: the CLI writes it as the command at hand spells it (`--sandbox none`, or
    `--set eval_sandbox=none` in training), so that an error never names an option its command lacks."""

    fix: tuple[str, str] | None = None


class TaskError(Cudal1Error):
    """A task source is malformed (syntax error, missing names, get_inputs raising, unreadable file)."""

    def __init__(self, task_id: str, message: str):
        self.task_id = task_id
        self.reason = message
        super().__init__(f"{task_id}: {message}")


class SourceError(Cudal1Error):
    """A task source specification cannot be resolved (missing path, no network for a dataset, bad JSONL)."""


class ConfigError(Cudal1Error, ValueError):
    """A configuration value is invalid or two values contradict each other."""

    def __init__(self, message: str, *, fix: tuple[str, str] | None = None):
        super().__init__(message)
        self.fix = fix


class MissingDependencyError(Cudal1Error, ImportError):
    """An optional dependency is needed; the message names the extra that installs it."""

    def __init__(self, package: str, extra: str, purpose: str = ""):
        what = f" for {purpose}" if purpose else ""
        super().__init__(f"'{package}' is needed{what}: pip install 'cudal1[{extra}]'")


class PromptTruncatedError(Cudal1Error):
    """The trainer fed the model fewer prompt tokens than the prompt has (a library truncated it): training on
    a prompt without its reference or exemplars is training on another task."""
