"""`cudal1 serve`: run the reward server (FastAPI + uvicorn) over a local or Ray evaluator pool."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from cudal1.cli import common
from cudal1.cli.options import config_options, opt
from cudal1.eval.config import EvalConfig
from cudal1.service.server_config import ServerConfig

TokenFileOpt = typer.Option(None, "--token-file", help="File with the bearer token (default: $CUDAL1_SERVER_TOKEN).")
SourceOpt = typer.Option(["builtin"], "--source", "-s", help="Task sources resolving task ids.")


SERVER_FIELDS = [opt("host"), opt("port"), opt("insecure_no_auth"), opt("allow_reference_source"),
                 opt("max_body_bytes", min=1024), opt("max_queue", min=1), opt("max_batch_items", min=1),
                 opt("request_timeout_s", callback=common.positive), opt("shutdown_grace_s", min=0)]
EVAL_FIELDS = common.eval_options("device", "profile", "correctness_trials", "sizes", "timeout_s", "sandbox")


@config_options(ServerConfig, SERVER_FIELDS, into="server")
@config_options(EvalConfig, EVAL_FIELDS, into="evaluation")
def serve_command(
    workers: str = typer.Option("local", "--workers", help="Evaluator pool: local, ray:auto or ray://HOST:PORT."),
    token_file: Path | None = TokenFileOpt,
    store_path: Path | None = common.StoreOpt,
    source: list[str] = SourceOpt,
    cpu_slots: int = typer.Option(1, "--cpu-slots", min=1,
                                  help="Local pool evaluating on cpu (--device cpu, or no GPU): parallel slots."),
    no_recheck: bool = typer.Option(False, "--no-recheck", help="Do not re-check outlier speedups on a 2nd GPU."),
    memory_gb: float | None = typer.Option(None, "--memory-gb", callback=common.positive,
                                           help="Host memory limit of each candidate's sandbox (default: "
                                                "from the task's data)."),
    sets: list[str] = typer.Option([], "--set", help="Any other evaluation setting as KEY=VALUE (repeatable), "
                                                    "e.g. target_bucket_ms=20 (docs/configuration.md)."),
    server: dict[str, Any] | None = None, evaluation: dict[str, Any] | None = None,
) -> None:
    """Serve evaluations over HTTP (the reward server).

    Serves evaluations to trainers on other machines; the API (endpoints, bodies, auth, errors) is in
    docs/serve.md.
    """
    from cudal1.service.server import serve

    config = ServerConfig(**(server or {}), token_file=str(token_file) if token_file else None,
                          sources=tuple(source))
    memory = {"memory_bytes": int(memory_gb * 2**30)} if memory_gb else {}
    eval_config = common.eval_config({**(evaluation or {}), **memory}, sets)
    options = {"cpu_slots": cpu_slots} if workers == "local" else {}
    def banner(url: str) -> None:  # once the address is taken and the pool runs: a busy port prints no banner
        common.console.print(f"reward server on {url} (workers {workers}); Ctrl-C stops it; API: "
                             "docs/serve.md", highlight=False, markup=False)

    serve(config, eval_config, workers=workers, store_path=str(store_path) if store_path else None,
          recheck=not no_recheck, pool_options=options, on_ready=banner)


def register(app: typer.Typer) -> None:
    """Add `cudal1 serve` to the CLI."""
    app.command("serve")(serve_command)
