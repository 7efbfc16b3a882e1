"""The reward server: an HTTP service (FastAPI) that evaluates candidates for trainers on other machines.

    cudal1 serve --workers local --token-file token.txt          # binds 127.0.0.1:8765

Endpoints (JSON bodies; every one but /healthz needs `Authorization: Bearer <token>`):
- `POST /v1/evaluate`        {"task_id", "source", "reference_source"?, "label"?} -> EvalResult.to_dict()
- `POST /v1/evaluate_batch`  {"items": [ ...as above... ]}                         -> {"results": [...]}
- `GET  /healthz`            {"status": "ok", "n_devices", "queue_depth", "admitted", "max_queue"}
- `GET  /metrics`            Prometheus text: requests, rejections, queue depth, evaluations by status,
                             evaluation latency histogram.

Task ids resolve through the configured task sources (`find_task`'s sources, indexed once). An operator may
let requests carry the reference module itself (`reference_source`, off by default): it then runs only in
the sandboxed runners, like a candidate, and its task id is put under `request/` so that its rows can never
pass for a built-in or release task's. No reference or candidate code runs in the server process.
The evaluation protocol is the server's (`EvalConfig`); requests cannot change it, so every trainer
gets rewards measured the same way.

Protection: the token is compared in constant time (401 when missing or wrong); bodies larger than
`max_body_bytes` are refused (413), judged from Content-Length *and* while reading, so a chunked body
cannot slip past; at most `max_queue` items are admitted at once (queued or running), beyond which the
server answers 429 with Retry-After instead of queueing without bound. The server process is the single
writer of its results store: evaluations run through the pool, whose driver side (in this process) writes.

Faults: a request is answered within `request_timeout_s` (504 beyond; the work is cancelled if it has not
started); a client that disconnects cancels its queued work; identical submissions in flight are evaluated
once and every waiter gets that result; a slot that dies or sticks is replaced (`/healthz` counts it);
SIGTERM stops accepting, lets running requests finish for `shutdown_grace_s`, then stops.

Limits: no TLS (put it behind a reverse proxy, or keep it on 127.0.0.1 / an SSH tunnel); one shared token,
no per-user quotas; a request waits for its result on an open connection (clients set long timeouts).

The API for users (bodies, every error status, curl examples) is docs/serve.md; keep it in step with this.
"""

from __future__ import annotations

import asyncio
import errno
import hmac
import json
import logging
import math
import socket
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any

from cudal1.core.errors import ConfigError, Cudal1Error, MissingDependencyError, SourceError, TaskError
from cudal1.core.types import EvalResult
from cudal1.eval.config import EvalConfig
from cudal1.eval.evaluation import reap_once
from cudal1.service.factory import make_pool
from cudal1.service.pool import PoolBusyError
from cudal1.service.recheck import RecheckingPool
from cudal1.service.server_config import ENV_TOKEN, ServerConfig, is_loopback  # noqa: F401 (re-exported)
from cudal1.store import ResultsStore
from cudal1.tasks.sources import load_tasks
from cudal1.tasks.task import Task, check_syntax, size_problem, source_hash, text_problem

try:
    from fastapi import FastAPI, Request
    from fastapi.responses import JSONResponse, PlainTextResponse
except ImportError as _exc:  # pragma: no cover - exercised only without the extra
    raise MissingDependencyError("fastapi", "dist", "the reward server") from _exc

logger = logging.getLogger(__name__)

OPEN_PATHS = frozenset({"/healthz"})
KNOWN_PATHS = frozenset({"/healthz", "/metrics", "/v1/evaluate", "/v1/evaluate_batch"})
DISCONNECT_POLL_S = 1.0  # how often a waiting request looks whether its client is still there
# Rationale: evaluations take from under a second (cached) to minutes (a cold load_inline build).
LATENCY_BUCKETS_S = (0.1, 0.5, 1.0, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0, float("inf"))


class Metrics:
    """Counters and a latency histogram, rendered in the Prometheus text format."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.requests: dict[tuple[str, int], int] = {}
        self.rejected: dict[str, int] = {}
        self.evaluations: dict[str, int] = {}
        self.latency_counts = [0] * len(LATENCY_BUCKETS_S)
        self.latency_sum_s = 0.0
        self.latency_n = 0
        self.joined = 0  # submissions answered by an identical evaluation already in flight

    def count_request(self, path: str, code: int) -> None:
        path = path if path in KNOWN_PATHS else "other"  # a label per path a client invents would grow forever
        with self._lock:
            self.requests[(path, code)] = self.requests.get((path, code), 0) + 1

    def count_joined(self) -> None:
        with self._lock:
            self.joined += 1

    def count_rejected(self, reason: str) -> None:
        with self._lock:
            self.rejected[reason] = self.rejected.get(reason, 0) + 1

    def observe(self, result: EvalResult, seconds: float) -> None:
        with self._lock:
            status = result.status.value
            self.evaluations[status] = self.evaluations.get(status, 0) + 1
            self.latency_sum_s += seconds
            self.latency_n += 1
            for i, bound in enumerate(LATENCY_BUCKETS_S):
                if seconds <= bound:
                    self.latency_counts[i] += 1

    def render(self, gauges: dict[str, float]) -> str:
        """The Prometheus exposition text."""
        out: list[str] = []
        with self._lock:
            out += ["# TYPE cudal1_requests_total counter"]
            out += [f'cudal1_requests_total{{path="{p}",code="{c}"}} {n}' for (p, c), n in sorted(self.requests.items())]
            out += ["# TYPE cudal1_rejected_total counter"]
            out += [f'cudal1_rejected_total{{reason="{r}"}} {n}' for r, n in sorted(self.rejected.items())]
            out += ["# TYPE cudal1_joined_duplicates_total counter", f"cudal1_joined_duplicates_total {self.joined}"]
            out += ["# TYPE cudal1_evaluations_total counter"]
            out += [f'cudal1_evaluations_total{{status="{s}"}} {n}' for s, n in sorted(self.evaluations.items())]
            out += ["# TYPE cudal1_evaluation_seconds histogram"]
            for bound, n in zip(LATENCY_BUCKETS_S, self.latency_counts, strict=True):
                le = "+Inf" if bound == float("inf") else f"{bound:g}"
                out.append(f'cudal1_evaluation_seconds_bucket{{le="{le}"}} {n}')
            out += [f"cudal1_evaluation_seconds_sum {self.latency_sum_s:.6f}",
                    f"cudal1_evaluation_seconds_count {self.latency_n}"]
        for name, value in gauges.items():
            out += [f"# TYPE {name} gauge", f"{name} {value:g}"]
        return "\n".join(out) + "\n"


class GuardMiddleware:
    """ASGI middleware: bearer-token check and body size limit before the app sees a request."""

    def __init__(self, app: Any, *, token: str | None, max_body_bytes: int, metrics: Metrics):
        self.app = app
        self.token = token.encode() if token else None
        self.max_body_bytes = max_body_bytes
        self.metrics = metrics

    async def __call__(self, scope: dict[str, Any], receive: Callable[[], Awaitable[dict]],
                       send: Callable[[dict], Awaitable[None]]) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = scope.get("path", "")

        async def counting_send(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start":
                self.metrics.count_request(path, int(message["status"]))
            await send(message)

        headers = {k.decode("latin-1").lower(): v for k, v in scope.get("headers", [])}
        if path not in OPEN_PATHS and not self._authorized(headers.get("authorization", b"")):
            self.metrics.count_rejected("auth")
            await _send_json(counting_send, 401, {"detail": "missing or invalid bearer token"},
                             {"www-authenticate": "Bearer"})
            return
        body = await self._read_body(headers, receive)
        if body is None:
            self.metrics.count_rejected("size")
            await _send_json(counting_send, 413, {"detail": f"request body over {self.max_body_bytes} bytes"},
                             {"connection": "close"})
            return
        replayed = False

        async def replay() -> dict[str, Any]:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, counting_send)

    def _authorized(self, header: bytes) -> bool:
        if self.token is None:
            return True
        scheme, _, given = header.partition(b" ")
        return scheme.lower() == b"bearer" and hmac.compare_digest(given.strip(), self.token)

    async def _read_body(self, headers: dict[str, bytes], receive: Callable[[], Awaitable[dict]]) -> bytes | None:
        """The whole body, or None when it exceeds the limit (judged from Content-Length, then by counting)."""
        declared = headers.get("content-length")
        if declared is not None:
            try:
                if int(declared) > self.max_body_bytes:
                    return None
            except ValueError:
                return None
        chunks: list[bytes] = []
        size, drained = 0, 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return b""
            chunk = message.get("body", b"")
            if size <= self.max_body_bytes:
                chunks.append(chunk)
                size += len(chunk)
            else:
                drained += len(chunk)  # read on a little so the client sees the 413, not a reset
            if not message.get("more_body", False) or drained > self.max_body_bytes:
                break
        return None if size > self.max_body_bytes else b"".join(chunks)


async def _send_json(send: Callable[[dict], Awaitable[None]], status: int, body: dict[str, Any],
                     extra_headers: dict[str, str] | None = None) -> None:
    data = json.dumps(body).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())]
    headers += [(k.encode(), v.encode()) for k, v in (extra_headers or {}).items()]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": data})


class RequestError(Cudal1Error):
    """A request the server refuses, with its HTTP status."""

    def __init__(self, status: int, message: str):
        self.status = status
        super().__init__(message)


class ServerState:
    """What the handlers share: the pool, the admission counter, the task index, the metrics."""

    def __init__(self, config: ServerConfig, pool: Any, eval_config: EvalConfig | None, metrics: Metrics):
        self.config = config
        self.pool = pool
        self.eval_config = eval_config or getattr(pool, "config", None)
        self.metrics = metrics
        self.admitted = 0
        self._lock = threading.Lock()
        self._tasks: dict[str, Task] | None = None
        self._inflight: dict[tuple[str, str, str], _Shared] = {}  # touched on the event loop only

    def admit(self, n: int) -> bool:
        with self._lock:
            if self.admitted + n > self.config.max_queue:
                return False
            self.admitted += n
            return True

    def release(self, n: int) -> None:
        with self._lock:
            self.admitted -= n

    def task_index(self) -> dict[str, Task]:
        """Every task of the configured sources by id (built-in tasks also by bare name), loaded once."""
        with self._lock:
            if self._tasks is None:
                index: dict[str, Task] = {}
                for spec in self.config.sources:
                    for task in load_tasks(spec):
                        index.setdefault(task.id, task)
                        if spec == "builtin":
                            index.setdefault(task.name, task)
                self._tasks = index
            return self._tasks

    def parse_item(self, data: Any) -> tuple[Task, str, str]:
        """(task, candidate source, label) from one request item; `RequestError` when malformed."""
        if not isinstance(data, dict):
            raise RequestError(422, "an item must be a JSON object")
        task_id, source = data.get("task_id"), data.get("source")
        if not isinstance(task_id, str) or not task_id or not isinstance(source, str):
            raise RequestError(422, "an item needs string fields task_id and source")
        label = data.get("label") or ""
        if not isinstance(label, str):
            raise RequestError(422, "label must be a string")
        for name, text in (("task_id", task_id), ("source", source), ("label", label)):
            problem = text_problem(text)
            if problem:
                raise RequestError(400, f"{name} cannot be evaluated: {problem}")
        _check_size("source", source)
        reference = data.get("reference_source")
        if reference is not None:
            return self._request_task(task_id, reference), source, label
        try:
            task = self.task_index().get(task_id)
        except (SourceError, TaskError) as exc:
            raise RequestError(500, f"cannot load the task sources: {exc}") from None
        if task is None:
            raise RequestError(404, f"unknown task {task_id!r} (sources: {', '.join(self.config.sources)})")
        return task, source, label

    def _request_task(self, task_id: str, reference: Any) -> Task:
        """A client's own reference, under `request/` whatever id it claims (never a built-in's rows)."""
        if not self.config.allow_reference_source:
            raise RequestError(403, "this server does not accept reference_source (serve --allow-reference-source)")
        if not isinstance(reference, str):
            raise RequestError(422, "reference_source must be a string")
        problem = text_problem(reference)
        if problem:
            raise RequestError(400, f"reference_source cannot be evaluated: {problem}")
        _check_size("reference_source", reference)
        try:
            check_syntax(reference, task_id)  # parsing only: the reference runs in the sandboxed runners
        except TaskError as exc:
            raise RequestError(400, str(exc)) from None
        return Task(id="request/" + task_id.removeprefix("request/"), source=reference, origin="request")

    async def evaluate(self, task: Task, source: str, label: str,
                       disconnected: Callable[[], Awaitable[bool]]) -> EvalResult:
        """The result of one admitted item. Identical items in flight share one evaluation; the wait ends at
        the request's deadline (504) or when the client goes away (its share of the work is then dropped)."""
        key = (task.id, task.hash, source_hash(source))
        shared = self._inflight.get(key)
        if shared is None:
            shared = _Shared(asyncio.ensure_future(self._run(task, source, label)))
            self._inflight[key] = shared
            shared.task.add_done_callback(lambda _: self._inflight.pop(key, None) if self._inflight.get(key) is shared
                                          else None)
        else:
            self.metrics.count_joined()
        shared.waiters += 1
        try:
            return await self._wait(shared, disconnected)
        finally:
            shared.waiters -= 1
            if shared.waiters == 0 and not shared.task.done():
                shared.cancel()
                if self._inflight.get(key) is shared:
                    del self._inflight[key]

    async def _run(self, task: Task, source: str, label: str) -> EvalResult:
        started = time.monotonic()
        try:
            future = self.pool.submit(task, source, self.eval_config, label=label, block=False)
        except PoolBusyError:
            future = await asyncio.to_thread(self.pool.submit, task, source, self.eval_config, label=label)
        result = await asyncio.wrap_future(future)  # cancelling this cancels a pool job not yet started
        self.metrics.observe(result, time.monotonic() - started)
        return result

    async def _wait(self, shared: _Shared, disconnected: Callable[[], Awaitable[bool]]) -> EvalResult:
        deadline = time.monotonic() + self.config.request_timeout_s
        while True:
            left = deadline - time.monotonic()
            done, _ = await asyncio.wait({shared.task}, timeout=max(0.0, min(DISCONNECT_POLL_S, left)))
            if done:
                return shared.task.result()
            if await disconnected():
                self.metrics.count_rejected("client_gone")
                raise ClientGone()
            if time.monotonic() >= deadline:
                self.metrics.count_rejected("deadline")
                raise RequestError(504, f"no result within {self.config.request_timeout_s:.0f} s (request_timeout_s)")


def _check_size(name: str, text: str) -> None:
    """413 for a source over `MAX_SOURCE_BYTES`, the one size limit of a source (the CLI's and the loaders'),
    before anything is queued."""
    problem = size_problem(text)
    if problem:
        raise RequestError(413, f"{name} cannot be evaluated: it is {problem}")


class ClientGone(Exception):
    """The client of a request disconnected before its answer."""


class _Shared:
    """One evaluation in flight and the number of requests waiting for it."""

    def __init__(self, task: asyncio.Task):
        self.task = task
        self.waiters = 0

    def cancel(self) -> None:
        """Nobody waits any more: drop the work if the pool has not started it (a running one finishes, and
        its result is stored for the next identical request)."""
        self.task.cancel()


async def _json_body(request: Request) -> Any:
    try:
        return json.loads(await request.body())
    except ValueError:
        raise RequestError(400, "the body is not valid JSON") from None
    except RecursionError:
        raise RequestError(400, "the body nests too deeply") from None


def _error(exc: RequestError, retry_after_s: int | None = None) -> JSONResponse:
    headers = {"Retry-After": str(retry_after_s)} if retry_after_s is not None else None
    return JSONResponse({"detail": str(exc)}, status_code=exc.status, headers=headers)


def create_app(config: ServerConfig, pool: Any, store: Any = None, *,
               eval_config: EvalConfig | None = None) -> FastAPI:
    """The FastAPI app over `pool` (which must own `store`, if any: the server is its single writer).

    `store`, when given and the pool has none yet, is handed to the pool; `eval_config` defaults to the
    pool's config.
    """
    token = config.resolve_token()
    if store is not None and getattr(pool, "store", "absent") is None:
        pool.store = store
    metrics = Metrics()
    state = ServerState(config, pool, eval_config, metrics)
    app = FastAPI(title="cudal1 reward server", docs_url=None, redoc_url=None, openapi_url=None)
    app.state.cudal1 = state

    async def run_items(items: list[Any], request: Request) -> list[EvalResult]:
        parsed = [state.parse_item(item) for item in items]
        if not state.admit(len(parsed)):
            metrics.count_rejected("queue")
            raise RequestError(429, f"the evaluation queue is full ({config.max_queue} items); retry later")
        try:
            return list(await asyncio.gather(*(state.evaluate(t, s, lbl, request.is_disconnected)
                                               for t, s, lbl in parsed)))
        finally:
            state.release(len(parsed))

    def refusal(exc: RequestError) -> JSONResponse:
        return _error(exc, config.retry_after_s if exc.status == 429 else None)

    @app.post("/v1/evaluate")
    async def evaluate(request: Request) -> JSONResponse:
        try:
            results = await run_items([await _json_body(request)], request)
        except RequestError as exc:
            return refusal(exc)
        except ClientGone:
            return JSONResponse({"detail": "client disconnected"}, status_code=499)
        return JSONResponse(results[0].to_dict())

    @app.post("/v1/evaluate_batch")
    async def evaluate_batch(request: Request) -> JSONResponse:
        try:
            data = await _json_body(request)
            items = data.get("items") if isinstance(data, dict) else None
            if not isinstance(items, list) or not items:
                raise RequestError(422, "the body needs a non-empty list 'items'")
            limit = min(config.max_batch_items, config.max_queue)  # a batch over the queue could never be admitted
            if len(items) > limit:
                raise RequestError(413, f"{len(items)} items; at most {limit} per batch")
            results = await run_items(items, request)
        except RequestError as exc:
            return refusal(exc)
        except ClientGone:
            return JSONResponse({"detail": "client disconnected"}, status_code=499)
        return JSONResponse({"results": [r.to_dict() for r in results]})

    @app.get("/healthz")
    async def healthz() -> JSONResponse:
        slots = pool.health() if hasattr(pool, "health") else {}
        return JSONResponse({"status": "ok", "n_devices": pool.n_devices, "queue_depth": pool.queue_depth,
                             "admitted": state.admitted, "max_queue": config.max_queue, **slots})

    @app.get("/metrics")
    async def metrics_endpoint() -> PlainTextResponse:
        text = metrics.render({"cudal1_queue_depth": pool.queue_depth, "cudal1_admitted_items": state.admitted,
                               "cudal1_devices": pool.n_devices})
        return PlainTextResponse(text, media_type="text/plain; version=0.0.4")

    app.add_middleware(GuardMiddleware, token=token, max_body_bytes=config.max_body_bytes, metrics=metrics)
    return app


def bind_socket(host: str, port: int) -> socket.socket:
    """The server's listening address, taken now: a port in use is a one-line `ConfigError` before any work
    (uvicorn would find out only when it starts, after the pool did)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn does: restarts reuse the port
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        hint = " (another server? choose another --port)" if exc.errno == errno.EADDRINUSE else ""
        raise ConfigError(f"cannot serve on {host}:{port}: {exc.strerror or exc}{hint}") from None
    sock.set_inheritable(True)
    return sock


def serve(config: ServerConfig, eval_config: EvalConfig, *, workers: str = "local", store_path: str | None = None,
          recheck: bool = True, pool_options: dict[str, Any] | None = None,
          on_ready: Callable[[str], None] | None = None) -> None:
    """Take the address, open the store, start the pool (re-checking outliers when it has two devices) and
    serve until stopped; `on_ready(url)` is called once all that worked, before the first request."""
    try:
        import uvicorn
    except ImportError:
        raise MissingDependencyError("uvicorn", "dist", "the reward server") from None

    config.resolve_token()  # fail before starting workers
    sock = bind_socket(config.host, config.port)
    try:
        reap_once()  # what a killed earlier run left (runner folders, control groups), before serving again
        store = ResultsStore(store_path)
        pool: Any = make_pool(workers, eval_config, store=store, **(pool_options or {}))
    except BaseException:
        sock.close()
        raise
    if recheck:
        pool = RecheckingPool(pool, store=store)
    try:
        app = create_app(config, pool, store, eval_config=eval_config)
        port = sock.getsockname()[1]
        logger.info("reward server on http://%s:%d (%d device(s), store %s)", config.host, port,
                    pool.n_devices, store.path)
        if on_ready is not None:
            on_ready(f"http://{config.host}:{port}")
        # SIGTERM (uvicorn's handler): stop accepting, let running requests finish for the grace, then stop.
        grace_s = int(math.ceil(config.shutdown_grace_s))
        server = uvicorn.Server(uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=grace_s))
        server.run(sockets=[sock])
    finally:
        sock.close()
        pool.close()
        store.close()
