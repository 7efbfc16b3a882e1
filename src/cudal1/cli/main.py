"""`cudal1` entry point: registers the subcommands and turns user errors into one red line."""

from __future__ import annotations

import logging
import sys

import typer
from rich.console import Console
from rich.markup import escape

from cudal1.core.errors import Cudal1Error

app = typer.Typer(name="cudal1", no_args_is_help=True, add_completion=False,
                  help="CUDA-L1 end to end: make PyTorch modules faster with LLM-written CUDA, verified.")
err_console = Console(stderr=True)


def _register() -> None:
    from cudal1.cli import check_cmd, eval_cmd, quickstart_cmd, tasks_cmd

    app.add_typer(tasks_cmd.app, name="tasks")
    app.command("eval")(eval_cmd.eval_command)
    app.command("check")(check_cmd.check_command)
    app.command("quickstart")(quickstart_cmd.quickstart_command)
    for optional in ("baseline_cmd", "report_cmd", "audit_cmd", "optimize_cmd", "augment_cmd", "train_cmd",
                     "serve_cmd", "policy_cmd", "judge_cmd"):
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


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns the exit code (0 ok, 1 failed verdicts where a command says so, 2 user error)."""
    try:
        rc = app(args=argv, standalone_mode=False)
    except Cudal1Error as exc:
        # soft_wrap: one line in a log too; escape: a message may hold brackets that are not markup.
        err_console.print(f"[red]error:[/red] {escape(str(exc))}", highlight=False, soft_wrap=True)
        return 2
    except typer.Exit as exc:
        return exc.exit_code
    except typer.Abort:
        err_console.print("aborted")
        return 130
    except Exception as exc:
        # Usage errors come from click or from the click copy that newer typer vendors: same interface.
        if hasattr(exc, "show") and hasattr(exc, "exit_code"):
            exc.show()
            return int(exc.exit_code)
        raise
    # Without standalone mode, click returns the code of a `typer.Exit` instead of raising it.
    return rc if isinstance(rc, int) else 0


if __name__ == "__main__":
    sys.exit(main())
