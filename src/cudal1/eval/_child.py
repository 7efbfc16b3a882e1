"""Entry point of an isolated child process (see `cudal1.eval.isolation`).

Usage (by `run_isolated` only): python -m cudal1.eval._child MODULE:FUNC IN.json OUT.json [DATA_LIMIT_BYTES]
The signing key arrives on stdin before any untrusted code runs and is kept in this module's closure.
"""

from __future__ import annotations

import importlib
import json
import os
import resource
import sys
import traceback


def _make_writer(key: bytes, out_path: str):
    from cudal1.eval.isolation import sign

    def write(message: dict) -> None:
        body = json.dumps(message, default=str)
        tmp = out_path + ".tmp"
        with open(tmp, "w") as f:
            json.dump({"body": body, "sig": sign(key, body.encode())}, f)
        os.replace(tmp, out_path)

    return write


def main() -> None:
    entry, in_path, out_path = sys.argv[1:4]
    key = bytes.fromhex(sys.stdin.readline().strip())
    sys.stdin.close()
    write = _make_writer(key, out_path)
    del key
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if len(sys.argv) > 4:
        limit = int(sys.argv[4])
        resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))
    with open(in_path) as f:
        payload = json.load(f)
    module_name, func_name = entry.split(":")
    try:
        func = getattr(importlib.import_module(module_name), func_name)
        value = func(payload)
        message = {"value": value}
    except BaseException as exc:  # noqa: BLE001 - the harness reports anything, the parent decides
        tb = traceback.format_exc(limit=4)
        message = {"__harness_error__": f"{type(exc).__name__}: {exc}"[:2000], "traceback": tb}
    sys.stdout.flush()
    write(message)
    # Skip interpreter teardown: CUDA contexts and candidate threads can hang or crash at exit.
    os._exit(0)


if __name__ == "__main__":
    main()
