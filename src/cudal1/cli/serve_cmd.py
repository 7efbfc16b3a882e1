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
    insecure_no_auth: bool = typer.Option(False, "--insecure-no-auth", help="Serve without a token (loopback only)."),
    store_path: Path | None = common.StoreOpt,
    source: list[str] = SourceOpt,
    allow_reference_source: bool = typer.Option(
        False, "--allow-reference-source", help="Accept a reference module in requests (run sandboxed, stored "
                                                "under request/<task_id>)."),
    max_body_bytes: int = typer.Option(8 * 2**20, "--max-body-bytes", min=1024,
                                       help="Largest request body (413 beyond)."),
    max_queue: int = typer.Option(256, "--max-queue", min=1, help="Items admitted at once (429 beyond)."),
    max_batch_items: int = typer.Option(64, "--max-batch-items", min=1,
                                        help="Items per evaluate_batch request."),
    request_timeout_s: float = typer.Option(1800.0, "--request-timeout-s", callback=common.positive,
                                            help="A request's answer within this (504 beyond)."),
    shutdown_grace_s: float = typer.Option(30.0, "--shutdown-grace-s", min=0, callback=common.finite,
                                           help="On SIGTERM, how long running requests may finish."),
    cpu_slots: int = typer.Option(1, "--cpu-slots", min=1,
                                  help="Local pool evaluating on cpu (--device cpu, or no GPU): parallel slots."),
    no_recheck: bool = typer.Option(False, "--no-recheck", help="Do not re-check outlier speedups on a 2nd GPU."),
    device: str = common.DeviceOpt, profile: str = common.ProfileOpt, trials: int = common.TrialsOpt,
    sizes: str = common.SizesOpt, timeout_s: float = common.TimeoutOpt, sandbox: str = common.SandboxOpt,
    memory_gb: float | None = typer.Option(None, "--memory-gb", callback=common.positive,
                                           help="Host memory limit of each candidate's sandbox (default: "
                                                "from the task's data)."),
) -> None:
    """Serve evaluations over HTTP (the reward server).

    Serves evaluations to trainers on other machines; the API (endpoints, bodies, auth, errors) is in
    docs/serve.md.
    """
    from cudal1.service.server import ServerConfig, serve

    config = ServerConfig(host=host, port=port, token_file=str(token_file) if token_file else None,
                          insecure_no_auth=insecure_no_auth, max_body_bytes=max_body_bytes, max_queue=max_queue,
                          max_batch_items=max_batch_items, sources=tuple(source),
                          allow_reference_source=allow_reference_source, request_timeout_s=request_timeout_s,
                          shutdown_grace_s=shutdown_grace_s)
    eval_config = common.make_config(device, profile, trials, sizes, timeout_s=timeout_s, sandbox=sandbox,
                                     memory_bytes=int(memory_gb * 2**30) if memory_gb else None)
    options = {"cpu_slots": cpu_slots} if workers == "local" else {}
    def banner(url: str) -> None:  # once the address is taken and the pool runs: a busy port prints no banner
        common.console.print(f"reward server on {url} (workers {workers}); Ctrl-C stops it; API: "
                             "docs/serve.md", highlight=False, markup=False)

    serve(config, eval_config, workers=workers, store_path=str(store_path) if store_path else None,
          recheck=not no_recheck, pool_options=options, on_ready=banner)


def register(app: typer.Typer) -> None:
    """Add `cudal1 serve` to the CLI."""
    app.command("serve")(serve_command)
