"""What a trusted process can see of another process's GPU work, and what a call's round trip costs.

    PYTHONPATH=src python scripts/probe_cross_context.py OUT_DIR

Three processes, as in the evaluator: this one (the parent, with no CUDA context), a *worker* (it stands for
a candidate's runner) and a *prober* (it stands for the device helper). They talk through doorbells: 64-bit
counters in shared memory that each side spins on, as the timed call's bracket does.

Measured (each printed and written to OUT_DIR/cross_context.json):
1. the doorbell round trip parent -> worker -> parent against a SOCK_SEQPACKET round trip;
2. for work the worker leaves running on the GPU without waiting for it (one busy kernel of X us, or ten of
   X/10 us), how long the prober's tiny kernel takes from its launch to its completion when launched right
   after: if it waits for the worker's work, a process that cannot see the worker's kernels still sees
   them end;
3. the prober's probes against a worker kernel that spins for 20 ms: how the GPU shares time between two
   contexts (the slice length);
4. the prober's 256 MB fill with the GPU idle and beside a spinning worker.
"""

from __future__ import annotations

import json
import mmap
import multiprocessing as mp
import os
import socket
import statistics
import sys
import time
from pathlib import Path

SLOTS = 8  # counters: 0 parent->worker, 1 worker->parent, 2 parent->prober, 3 prober->parent, 4.. payload


def _view(buf: mmap.mmap) -> memoryview:
    return memoryview(buf).cast("q")


def _wait(view: memoryview, slot: int, value: int, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    n = 0
    while view[slot] != value:
        n += 1
        if n % 100000 == 0 and time.monotonic() > deadline:
            raise TimeoutError(f"slot {slot} never reached {value}")


def _pin(core: int) -> None:
    try:
        os.sched_setaffinity(0, {core})
    except OSError:
        pass


def worker(fd: int, core: int, sock_fd: int) -> None:
    """Spins on its doorbell; each ring carries a command in slot 4 (work pattern) and 5 (microseconds)."""
    import torch

    _pin(core)
    buf = mmap.mmap(fd, SLOTS * 8)
    view = _view(buf)
    sock = socket.socket(fileno=sock_fd)
    if not torch.cuda.is_available():  # the doorbells alone (a machine without a GPU)
        view[1] = -1
        seen = 0
        while True:
            seen += 1
            _wait(view, 0, seen, timeout_s=600)
            if view[4] == 1:
                sock.recv(64)
                sock.send(b"k")
            view[1] = seen
            if view[4] == 9:
                return
    torch.cuda.init()
    x = torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    # cycles per microsecond of torch.cuda._sleep, measured with events
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(10_000_000)
    end.record()
    end.synchronize()
    cycles_per_us = 10_000_000 / (start.elapsed_time(end) * 1e3)
    view[6] = int(cycles_per_us * 1000)
    seen = 0
    view[1] = -1  # ready
    while True:
        seen += 1
        _wait(view, 0, seen, timeout_s=600)
        command, us = view[4], view[5]
        if command == 0:  # doorbell echo
            view[1] = seen
        elif command == 1:  # socket echo
            sock.recv(64)
            sock.send(b"k")
            view[1] = seen
        elif command in (2, 3):  # leave X us of work running: one kernel, or ten
            torch.cuda.synchronize()
            if us > 0:
                if command == 2:
                    torch.cuda._sleep(int(us * cycles_per_us))
                else:
                    for _ in range(10):
                        torch.cuda._sleep(int(us * cycles_per_us / 10))
            view[1] = seen  # launched, not waited for
            torch.cuda.synchronize()
            view[7] = seen  # drained
        elif command == 9:
            view[1] = seen
            return
        x.add_(1)


def prober(fd: int, core: int) -> None:
    import torch

    _pin(core)
    buf = mmap.mmap(fd, SLOTS * 8)
    view = _view(buf)
    if not torch.cuda.is_available():
        view[3] = -1
        return
    torch.cuda.init()
    probe = torch.zeros(1, device="cuda")
    fill = torch.empty(64 * 2**20, device="cuda")  # 256 MB
    torch.cuda.synchronize()
    view[3] = -1
    seen = 0
    while True:
        seen += 1
        _wait(view, 2, seen, timeout_s=600)
        command = view[4]
        t0 = time.perf_counter()
        if command == 4:  # the 256 MB fill, timed by events
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            fill.fill_(1.0)
            e.record()
            e.synchronize()
            view[5] = int(s.elapsed_time(e) * 1e3)  # ns
        elif command == 9:
            view[3] = seen
            return
        else:
            probe.add_(1)
            torch.cuda.synchronize()
            view[5] = int((time.perf_counter() - t0) * 1e9)
        view[3] = seen


def quantiles(values: list[float]) -> dict[str, float]:
    xs = sorted(values)
    pick = lambda q: xs[min(len(xs) - 1, int(q * len(xs)))]  # noqa: E731
    return {"n": len(xs), "median": statistics.median(xs), "p10": pick(0.1), "p90": pick(0.9), "p99": pick(0.99),
            "min": xs[0], "max": xs[-1]}


def main() -> None:
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    cores = sorted(os.sched_getaffinity(0))
    fd = os.memfd_create("doorbells")
    os.ftruncate(fd, SLOTS * 8)
    buf = mmap.mmap(fd, SLOTS * 8)
    view = _view(buf)
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    ctx = mp.get_context("fork")  # the parent holds no CUDA context: forking is safe
    w = ctx.Process(target=worker, args=(fd, cores[1 % len(cores)], b.fileno()), daemon=True)
    p = ctx.Process(target=prober, args=(fd, cores[2 % len(cores)]), daemon=True)
    b.set_inheritable(True)
    os.set_inheritable(fd, True)
    w.start()
    p.start()
    _pin(cores[0])
    _wait(view, 1, -1, 300)
    _wait(view, 3, -1, 300)
    results: dict = {"cycles_per_us": view[6] / 1000}
    rings = {"w": 0, "p": 0}

    def ring_worker(command: int, us: int = 0) -> float:
        rings["w"] += 1
        view[4], view[5] = command, us
        t0 = time.perf_counter()
        view[0] = rings["w"]
        if command == 1:
            a.send(b"g")
            a.recv(64)
        _wait(view, 1, rings["w"])
        return (time.perf_counter() - t0) * 1e6

    def ring_prober(command: int) -> tuple[float, float]:
        rings["p"] += 1
        view[4] = command
        t0 = time.perf_counter()
        view[2] = rings["p"]
        _wait(view, 3, rings["p"])
        return (time.perf_counter() - t0) * 1e6, view[5] / 1e3

    results["doorbell_round_trip_us"] = quantiles([ring_worker(0) for _ in range(3000)][500:])
    results["socket_round_trip_us"] = quantiles([ring_worker(1) for _ in range(3000)][500:])
    print("doorbell", results["doorbell_round_trip_us"], "\nsocket", results["socket_round_trip_us"], flush=True)
    if not results["cycles_per_us"]:
        ring_worker(9)
        (out / "cross_context.json").write_text(json.dumps(results, indent=1))
        return
    idle = [ring_prober(5)[0] for _ in range(400)][50:]
    results["probe_idle_us"] = quantiles(idle)
    print("probe idle", results["probe_idle_us"], flush=True)
    leftover: dict[str, dict[str, dict[str, float]]] = {}
    for command, name in ((2, "one_kernel"), (3, "ten_kernels")):
        leftover[name] = {}
        for us in (0, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000):
            lat, drained_after = [], []
            for _ in range(30 if us < 1000 else 10):
                ring_worker(command, us)
                t0 = time.perf_counter()
                lat.append(ring_prober(5)[0])
                _wait(view, 7, rings["w"])
                drained_after.append((time.perf_counter() - t0) * 1e6)
            leftover[name][str(us)] = {"probe_us": statistics.median(lat), "probe_min_us": min(lat),
                                       "probe_max_us": max(lat), "worker_drained_us": statistics.median(drained_after)}
            print(name, us, leftover[name][str(us)], flush=True)
    results["probe_after_leftover"] = leftover
    # A 20 ms spinner in the worker; probes back to back in the prober.
    ring_worker(2, 20000)
    t0 = time.perf_counter()
    train = []
    while (time.perf_counter() - t0) < 0.025:
        train.append(ring_prober(5)[0])
    _wait(view, 7, rings["w"])
    results["probes_beside_20ms_spinner_us"] = train
    print("probes beside a 20 ms spinner:", [round(x) for x in train[:40]], flush=True)
    fills_idle = [ring_prober(4)[1] for _ in range(30)]
    ring_worker(2, 20000)
    fills_busy = [ring_prober(4)[1] for _ in range(10)]
    _wait(view, 7, rings["w"])
    results["fill_256MB_us"] = {"idle": quantiles(fills_idle), "beside_spinner": quantiles(fills_busy)}
    print("fill", results["fill_256MB_us"], flush=True)
    ring_worker(9)
    ring_prober(9)
    (out / "cross_context.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
