"""Entry point of an isolated child process (see `cudal1.eval.isolation`).

Usage (by `WorkerProcess` only): python -m cudal1.eval._child MODULE:FUNC OUT.json WARM_DEVICE DATA_LIMIT
stdin carries two lines: the signing key (read before anything else), then the JSON payload. Between
them the child imports the entry's module and, when WARM_DEVICE is not "-", creates the CUDA context,
so that a pre-started worker is ready the moment its payload arrives.
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


def _warm(module_name: str, device: str) -> None:
    importlib.import_module(module_name)
    if device != "-":
        import torch

        if torch.cuda.is_available():
            torch.zeros(1, device=device)


def main() -> None:
    entry, out_path, warm_device, data_limit = sys.argv[1:5]
    key = bytes.fromhex(sys.stdin.readline().strip())
    write = _make_writer(key, out_path)
    del key
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if int(data_limit):
        resource.setrlimit(resource.RLIMIT_DATA, (int(data_limit), int(data_limit)))
    module_name, func_name = entry.split(":")
    try:
        _warm(module_name, warm_device)
        line = sys.stdin.readline()
        sys.stdin.close()
        if not line:
            os._exit(0)  # discarded before a payload arrived
        payload = json.loads(line)
        os.environ.update(payload.pop("__env__", {}))
        func = getattr(importlib.import_module(module_name), func_name)
        message = {"value": func(payload)}
    except BaseException as exc:  # noqa: BLE001 - the harness reports anything, the parent decides
        message = {"__harness_error__": f"{type(exc).__name__}: {exc}"[:2000],
                   "traceback": traceback.format_exc(limit=4)}
    sys.stdout.flush()
    write(message)
    # Skip interpreter teardown: CUDA contexts and candidate threads can hang or crash at exit.
    os._exit(0)


if __name__ == "__main__":
    main()
