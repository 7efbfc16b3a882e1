"""Trusted entries the sandbox tests run inside a runner (`processes.run_isolated`): each reports what the
sandbox lets a process see and do."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time


def echo(payload: dict) -> dict:
    return {"payload": payload, "pid": os.getpid()}


def look_around(payload: dict) -> dict:
    """What a sandboxed process can reach: other processes, the network, writable places, the environment."""
    out: dict = {"uid": os.getuid(), "pids": sorted(int(p) for p in os.listdir("/proc") if p.isdigit()),
                 "env": sorted(os.environ)}
    target = payload.get("parent_pid")
    try:
        with open(f"/proc/{target}/environ", "rb") as f:
            out["parent_environ"] = f.read()[:100].decode(errors="replace")
    except OSError as exc:
        out["parent_environ_error"] = type(exc).__name__
    try:
        with socket.create_connection(("127.0.0.1", int(payload["port"])), timeout=2) as s:
            s.sendall(b"escaped")
            out["connected"] = True
    except OSError as exc:
        out["connected"] = False
        out["connect_error"] = type(exc).__name__
    writes = {}
    for path in payload.get("write_to", []):
        try:
            with open(path, "w") as f:
                f.write("planted")
            writes[path] = "written"
        except OSError as exc:
            writes[path] = type(exc).__name__
    out["writes"] = writes
    reads = {}
    for path in payload.get("read", []):
        try:
            with open(path, "rb") as f:
                reads[path] = f.read(64).decode(errors="replace")
        except OSError as exc:
            reads[path] = type(exc).__name__
    out["reads"] = reads
    return out


def leave_a_daemon(payload: dict) -> dict:
    """Start a detached grandchild (new session) that would keep running after the runner ends."""
    code = f"import time\ntime.sleep({float(payload.get('seconds', 60))})\n"
    proc = subprocess.Popen([sys.executable, "-c", code, payload["marker"]], start_new_session=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return {"daemon": proc.pid}


def hog_memory(payload: dict) -> dict:
    blocks = []
    for _ in range(int(payload["gib"] * 8)):
        blocks.append(bytearray(2**27))  # 128 MiB each, touched
        time.sleep(0.01)
    return {"held": len(blocks)}


def refault_heap(payload: dict) -> dict:
    """Minor page faults of allocating again what was just freed: small blocks (below the mmap threshold)
    come from the heap's top, which glibc gives back to the system unless told to keep it."""
    import resource

    def faults() -> int:
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt

    size, count = int(payload.get("bytes", 100_000)), int(payload.get("count", 200))
    held = [bytearray(size) for _ in range(count)]
    del held
    before = faults()
    again = [bytearray(size) for _ in range(count)]
    return {"faults": faults() - before, "pages": sum(len(b) for b in again) // 4096}


def fill_shm(payload: dict) -> dict:
    written = 0
    try:
        with open("/dev/shm/fill", "wb") as f:
            for _ in range(int(payload["mib"])):
                f.write(b"\0" * 2**20)
                written += 1
    except OSError as exc:
        return {"written_mib": written, "error": type(exc).__name__}
    return {"written_mib": written}


def spam(payload: dict) -> dict:
    """Write `mb` megabytes to stdout and stderr, then answer (a runner's output has a cap, not its answer)."""
    import sys

    line = "x" * 1023 + "\n"
    for _ in range(int(payload.get("mb", 1)) * 1024):
        sys.stdout.write(line)
    sys.stdout.flush()
    sys.stderr.write("the last line\n")
    sys.stderr.flush()
    return {"done": True}


def sleep(payload: dict) -> dict:
    """Sleep `s` seconds (an entry that misses its deadline)."""
    import time

    time.sleep(float(payload.get("s", 3600)))
    return {}
