"""`cudal1` entry point: registers the subcommands and turns user errors into one red line."""

from __future__ import annotations

import logging
import sys

import typer
from rich.console import Console
from rich.markup import escape

from cudal1.core.errors import Cudal1Error

# rich_markup_mode=None: click's plain help, which wraps at the terminal's width; Rich's boxed panels cut
# examples and option names short at 80 columns.
app = typer.Typer(name="cudal1", no_args_is_help=True, add_completion=False, rich_markup_mode=None,
                  pretty_exceptions_enable=False,
                  help="CUDA-L1 end to end: make PyTorch modules faster with LLM-written CUDA, verified.")
err_console = Console(stderr=True)
_state = {"verbose": False}  # --verbose of the current invocation: an unexpected error shows its traceback


def _register() -> None:
    from cudal1.cli import check_cmd, eval_cmd, quickstart_cmd, tasks_cmd

    app.add_typer(tasks_cmd.app, name="tasks")
    app.command("eval")(eval_cmd.eval_command)
    app.command("check")(check_cmd.check_command)
    app.command("quickstart")(quickstart_cmd.quickstart_command)
    for optional in ("baseline_cmd", "report_cmd", "audit_cmd", "audit_chunks_cmd", "optimize_cmd", "augment_cmd",
                     "train_cmd", "serve_cmd", "policy_cmd", "judge_cmd", "explain_cmd"):
        try:
            module = __import__(f"cudal1.cli.{optional}", fromlist=["register"])
        except ModuleNotFoundError as exc:
            if (exc.name or "").split(".")[0] == "cudal1":
                raise  # a broken import of our own is a bug, never a missing optional extra
            continue
        module.register(app)


_register()


def _show_version(value: bool) -> None:
    if value:
        from cudal1 import __version__

        typer.echo(f"cudal1 {__version__}")
        raise typer.Exit()


@app.callback()
def _root(verbose: bool = typer.Option(False, "--verbose", "-v", help="Log progress details to stderr."),
          version: bool = typer.Option(False, "--version", callback=_show_version, is_eager=True,
                                       help="Print the version and exit.")) -> None:
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    _state["verbose"] = verbose


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns the exit code (0 ok, 1 failed verdicts where a command says so, 2 user error)."""
    _state["verbose"] = False
    try:
        rc = app(args=argv, standalone_mode=False)
    except Cudal1Error as exc:
        # soft_wrap: one line in a log too; escape: a message may hold brackets that are not markup.
        message = spelled_fix(str(exc), exc.fix, sys.argv[1:] if argv is None else argv)
        err_console.print(f"[red]error:[/red] {escape(message)}", highlight=False, soft_wrap=True)
        return 2
    except typer.Exit as exc:
        return exc.exit_code
    except typer.Abort:
        err_console.print("aborted")
        return 130
    except Exception as exc:
        # Usage errors come from click or from the click copy that newer typer vendors: same interface.
        if hasattr(exc, "show") and hasattr(exc, "exit_code"):
            return _usage_error(exc)
        return _unexpected(exc)
    # Without standalone mode, click returns the code of a `typer.Exit` instead of raising it.
    return rc if isinstance(rc, int) else 0


def invoked_command(argv: list[str]) -> object | None:
    """The click command `argv` runs (the leaf of its subcommands), or None when it names none."""
    import typer.main

    command = typer.main.get_command(app)
    for word in argv:
        subcommands = getattr(command, "commands", None)
        if not subcommands:
            return command
        if word in subcommands:
            command = subcommands[word]
    return None if getattr(command, "commands", None) else command


def spelled_fix(message: str, fix: tuple[str, str] | None, argv: list[str]) -> str:
    """`message` with its closing `setting=value` (a `Cudal1Error.fix`) as the invoked command spells it: its
    own option (`--sandbox none`), an evaluation setting (`--eval-set sandbox=none`; `--set sandbox=none` where
    `--set` sets the evaluator's), a training setting (`--set eval_sandbox=none`), or left as it is when the
    command has none of them."""
    tail = f"{fix[0]}={fix[1]}" if fix else ""
    command = invoked_command(argv) if fix and message.endswith(tail) else None
    if command is None:
        return message
    opts = {o for param in getattr(command, "params", []) for o in getattr(param, "opts", [])}
    option = "--" + fix[0].replace("_", "-")
    if option in opts:
        spelling = f"{option} {fix[1]}"
    elif "--eval-set" in opts:
        spelling = f"--eval-set {tail}"
    elif "--set" in opts:  # a training stage's settings, or (eval, serve) the evaluator's
        import dataclasses

        from cudal1.eval.config import EvalConfig
        from cudal1.train.config import CommonTrainConfig

        training = getattr(command, "callback", None).__module__.endswith("train_cmd")
        fields = {f.name for f in dataclasses.fields(CommonTrainConfig if training else EvalConfig)}
        # a training stage: its evaluator's settings are eval_<name>, its pool's `workers`
        names = (f"eval_{fix[0]}", fix[0]) if training else (fix[0],)
        name = next((n for n in names if n in fields), None)
        if name is None:
            return message
        spelling = f"--set {name}={fix[1]}"
    else:
        return message
    return message[:-len(tail)] + spelling


def _usage_error(exc: Exception) -> int:
    """A bad option or argument: one line naming it and where the help is (`cudal1` alone shows the help)."""
    if type(exc).__name__ == "NoArgsIsHelpError" or not hasattr(exc, "format_message"):
        exc.show()  # type: ignore[attr-defined]
        return int(exc.exit_code)  # type: ignore[attr-defined]
    ctx = getattr(exc, "ctx", None)
    where = ctx.command_path if ctx is not None else "cudal1"
    message = " ".join(str(exc.format_message()).split())
    err_console.print(f"[red]error:[/red] {escape(message)} (see {escape(where)} --help)", highlight=False,
                      soft_wrap=True)
    return int(exc.exit_code)  # type: ignore[attr-defined]


def _unexpected(exc: Exception) -> int:
    """An exception no command turned into a user-facing error: a bug of ours, or a library's error we did not
    foresee. One line, like every error; the traceback with --verbose."""
    if _state["verbose"]:
        err_console.print_exception()
    first = (str(exc).strip().splitlines() or [""])[0][:300]
    if isinstance(exc, OSError):  # the machine's answer (disk full, permission denied), not a bug of ours
        err_console.print(f"[red]error:[/red] {escape(first)}", highlight=False, soft_wrap=True)
        return 2
    err_console.print(f"[red]error:[/red] unexpected {type(exc).__name__}: {escape(first)} (a bug: please "
                      "report it; --verbose shows the traceback)", highlight=False, soft_wrap=True)
    return 2


if __name__ == "__main__":
    sys.exit(main())
