"""`cudal1 serve`: run the reward server (FastAPI + uvicorn) over a local or Ray evaluator pool."""

from __future__ import annotations

from pathlib import Path

import typer

from cudal1.cli import common

TokenFileOpt = typer.Option(None, "--token-file", help="File with the bearer token (default: $CUDAL1_SERVER_TOKEN).")
SourceOpt = typer.Option(["builtin"], "--source", "-s", help="Task sources resolving task ids.")


def serve_command(
    host: str = typer.Option("127.0.0.1", "--host", help="Address to bind (loopback by default)."),
    port: int = typer.Option(8765, "--port", help="Port to bind."),
    workers: str = typer.Option("local", "--workers", help="Evaluator pool: local, ray:auto or ray://HOST:PORT."),
    token_file: Path | None = TokenFileOpt,
    insecure_no_auth: bool = typer.Option(False, "--insecure-no-auth", help="Serve without a token."),
    store_path: Path | None = common.StoreOpt,
    source: list[str] = SourceOpt,
    max_body_bytes: int = typer.Option(8 * 2**20, "--max-body-bytes", help="Largest request body (413 beyond)."),
    max_queue: int = typer.Option(256, "--max-queue", help="Items admitted at once (429 beyond)."),
    max_batch_items: int = typer.Option(64, "--max-batch-items", help="Items per evaluate_batch request."),
    cpu_slots: int = typer.Option(1, "--cpu-slots", help="Local pool on a CPU-only machine: parallel slots."),
    no_recheck: bool = typer.Option(False, "--no-recheck", help="Do not re-check outlier speedups on a 2nd GPU."),
    device: str = common.DeviceOpt, profile: str = common.ProfileOpt, trials: int = common.TrialsOpt,
    sizes: str = common.SizesOpt,
) -> None:
    """Serve evaluations over HTTP to trainers on other machines (see `cudal1.dist.server`)."""
    from cudal1.dist.server import ServerConfig, serve

    config = ServerConfig(host=host, port=port, token_file=str(token_file) if token_file else None,
                          insecure_no_auth=insecure_no_auth, max_body_bytes=max_body_bytes, max_queue=max_queue,
                          max_batch_items=max_batch_items, sources=tuple(source))
    eval_config = common.make_config(device, profile, trials, sizes)
    options = {"cpu_slots": cpu_slots} if workers == "local" else {}
    common.console.print(f"reward server on http://{host}:{port} (workers {workers}); Ctrl-C stops it")
    serve(config, eval_config, workers=workers, store_path=str(store_path) if store_path else None,
          recheck=not no_recheck, pool_options=options)


def register(app: typer.Typer) -> None:
    """Add `cudal1 serve` to the CLI."""
    app.command("serve")(serve_command)
