"""Errors of the kernel-only candidate form, each with a one-line message naming the field or kernel at fault.

All derive from `cudal1.core.errors.Cudal1Error`, so the CLI prints them as one line.
"""

from __future__ import annotations

from cudal1.core.errors import Cudal1Error


class KernelFormError(Cudal1Error):
    """Base class of the kernel form's errors."""


class SpecError(KernelFormError):
    """The launch spec is malformed; the message starts with the field's path (`steps[0].grid[1]: ...`)."""

    def __init__(self, field: str, problem: str):
        self.field = field
        self.problem = problem
        super().__init__(f"{field}: {problem}" if field else problem)


class ExpressionError(KernelFormError):
    """A size expression is refused (a name, an operator or a size outside the whitelist) or cannot be
    evaluated (division by zero, a value out of range)."""


class KernelBuildError(KernelFormError):
    """The source did not build to a cubin (the message: the trimmed compiler log), a step names a kernel the
    cubin does not define, or the build child failed (crash, memory, `timed_out`)."""

    def __init__(self, message: str, log: str = "", *, timed_out: bool = False):
        self.log = log
        self.timed_out = timed_out
        super().__init__(message)


class KernelRejectedError(KernelFormError):
    """The cubin's scan found something the form forbids (device-side launches, unresolved symbols)."""


class KernelLaunchError(KernelFormError):
    """A step could not be planned or launched: a buffer missing or of the wrong dtype, a driver error."""
