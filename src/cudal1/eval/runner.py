"""Entry point of every runner process: `python -m cudal1.eval.runner FD WARM_DEVICE [bare]`.

Started by `processes.RunnerProcess` inside the sandbox. FD is the runner's end of its channel, WARM_DEVICE a
device to create the CUDA context on before any request ("-": none); a third argument `bare` skips the imports
only model runners need (the helper's start). The runner says hello, then serves
requests one at a time until the parent closes the channel:

- `setup {role, ...}` makes it the reference's runner, the candidate's runner or the device's trusted helper
  (`reference_runner.ReferenceRole`, `candidate_runner.CandidateRole`, `HelperRole` below);
- `arena {in_bytes}` with a memfd attached maps shared memory for tensors (`device`: a device allocation);
- `run_entry {entry, payload, env}` runs one trusted function (a build, a peak measurement) and returns its dict;
- any other op goes to the role.

Every reply is data: `{"ok": true, ...}` or `{"ok": false, "error": KIND, "message": ...}`. A runner holds no
key and no verdict; the parent decides what replies mean.
"""

from __future__ import annotations

import importlib
import json
import os
import resource
import socket
import sys
import traceback
from typing import Any


class HelperRole:
    """A device's trusted helper, in a process that never imports task or candidate code:

    - `flush`: evicts L2 from a context the candidate does not control, before each timed call of either
      model, and resets the persisting-L2 lines (which an ordinary flush does not evict); times itself, so
      that a device kept busy by another context shows;
    - `device_arenas`: creates a session's two device arenas (`device_arena.DeviceArena`) and sends their
      descriptors to the parent, which gives each runner its own; `drop_arenas` frees them;
    - `copy`: copies a trial's inputs from the reference's device arena into the candidate's;
    - `compare`: compares two outputs where they lie (the session's device arenas) or as the parent copied
      them into its host arena, by the same `compare_outputs` as the parent uses on the CPU;
    - `inputs_changed`: the byte-for-byte input check of a trial, on the device arenas.
    """

    def __init__(self, message: dict[str, Any]):
        import torch

        from cudal1.eval.calls import use_device
        from cudal1.eval.cudart import persisting_l2_reset

        self.device = use_device(message["device"])
        props = torch.cuda.get_device_properties(self.device)
        l2 = int(getattr(props, "L2_cache_size", 0) or 0)
        self.buffer = torch.empty(max(2 * l2, 256 * 2**20) // 4, dtype=torch.float32, device=self.device)
        self.reset = persisting_l2_reset()
        self.arena: Any = None
        self.sessions: dict[str, dict[str, Any]] = {}  # session id -> {"ref": DeviceArena, "cand": DeviceArena}

    def setup_reply(self) -> dict[str, Any]:
        from cudal1.eval import cuda_vmm

        return {"ok": True, "device_arenas": cuda_vmm.available()}

    def attach(self, arena: Any) -> dict[str, Any]:
        if self.arena is not None:
            self.arena.close()
        self.arena = arena
        return {"ok": True, "pinned": arena.register_with_cuda()}

    def handle(self, op: str, message: dict[str, Any]) -> dict[str, Any]:
        if op == "flush":
            return self._flush()
        if op == "compare":
            return self._compare(message)
        if op == "device_arenas":
            return self._device_arenas(message)
        if op == "drop_arenas":
            for arena in self.sessions.pop(str(message.get("sid")), {}).values():
                arena.close()
            self._release_cache()
            return {"ok": True}
        if op == "copy":
            return self._copy(message)
        if op == "inputs_changed":
            return self._inputs_changed(message)
        return {"ok": False, "error": "unknown_op", "message": op}

    def _flush(self) -> dict[str, Any]:
        import torch

        from cudal1.eval.cudart import clear_last_error

        torch.cuda.synchronize(self.device)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        self.buffer.fill_(1.0)
        end.record()
        if self.reset is not None and self.reset() != 0:
            clear_last_error()  # else torch's next launch check reports the failed reset as its own error
        end.synchronize()
        ms = start.elapsed_time(end)
        return {"ok": True, "ms": ms, "GBps": self.buffer.numel() * 4 / max(ms, 1e-6) / 1e6}

    def _release_cache(self) -> None:
        """Give the allocator's cached blocks back to the device between sessions: this process outlives
        every evaluation, and what one session's comparisons cached (several times its outputs' size) would
        otherwise stay taken beside the next session's two runners, which may each use their capped share."""
        import torch

        torch.cuda.synchronize(self.device)
        torch.cuda.empty_cache()

    def _device_arenas(self, message: dict[str, Any]) -> dict[str, Any]:
        from cudal1.eval.device_arena import DeviceArena

        sid = str(message["sid"])
        for arena in self.sessions.pop(sid, {}).values():
            arena.close()
        made = {who: DeviceArena.create(int(message[who][0]), int(message[who][1])) for who in ("ref", "cand")}
        self.sessions[sid] = made
        return {"ok": True, "ref": made["ref"].share(), "cand": made["cand"].share(),
                "_fds": [made["ref"].take_descriptor(), made["cand"].take_descriptor()]}

    def _arenas(self, message: dict[str, Any]) -> dict[str, Any]:
        arenas = self.sessions.get(str(message.get("sid")))
        if arenas is None:
            raise ValueError("no device arenas for this session")
        return arenas

    def _copy(self, message: dict[str, Any]) -> dict[str, Any]:
        arenas = self._arenas(message)
        tree, _ = arenas[message["dst"]].copy_from(arenas[message["src"]], message["tree"], str(message["region"]))
        return {"ok": True, "tree": tree}

    def _inputs_changed(self, message: dict[str, Any]) -> dict[str, Any]:
        from cudal1.eval.channel import UnsupportedValue, changed_inputs

        arenas = self._arenas(message)
        try:
            changed, ref_same = changed_inputs((arenas["ref"], message["given"]), (arenas["ref"], message["ref_after"]),
                                               (arenas["cand"], message["cand_after"]))
        except (UnsupportedValue, ValueError, TypeError, KeyError) as exc:
            return {"ok": True, "unreadable": str(exc)[:300]}
        return {"ok": True, "changed": changed, "ref_same": ref_same}

    def _compare(self, message: dict[str, Any]) -> dict[str, Any]:
        import dataclasses

        from cudal1.eval.calls import gpu_memory
        from cudal1.eval.channel import ArenaFull, UnsupportedValue
        from cudal1.eval.config import PROFILES
        from cudal1.eval.correctness import OutputHackError, compare_outputs

        if "sid" in message:  # outputs where the runners committed them: views, no copies
            arenas = self._arenas(message)
            ref = arenas["ref"].unpack(message["ref"], device=self.device, copy=False)
            try:
                cand = arenas["cand"].unpack(message["cand"], device=self.device, copy=False)
            except (UnsupportedValue, ArenaFull, ValueError, TypeError, KeyError) as exc:
                return {"ok": True, "match": False, "unreadable": str(exc)[:300]}
        else:
            assert self.arena is not None, "no arena attached"
            ref = self.arena.unpack(message["ref"], device=self.device)
            cand = self.arena.unpack(message["cand"], device=self.device)
        try:
            result = compare_outputs(ref, cand, PROFILES[message["profile"]], int(message.get("trial", -1)),
                                     noise=message.get("noise"), errors=bool(message.get("errors")))
        except OutputHackError as exc:
            return {"ok": True, "match": False, "hack": str(exc)}
        return {"ok": True, "match": result.ok, "message": result.message, "errors": list(result.errors),
                "mismatch": dataclasses.asdict(result.mismatch) if result.mismatch else None,
                "memory": gpu_memory(self.device)}


def _make_role(message: dict[str, Any], channel: Any) -> Any:
    role = message.get("role")
    if role == "reference":
        from cudal1.eval.reference_runner import ReferenceRole

        return ReferenceRole(message)
    if role == "candidate":
        from cudal1.eval.candidate_runner import CandidateRole

        return CandidateRole(message, channel)
    if role == "helper":
        return HelperRole(message)
    raise ValueError(f"unknown role {role!r}")


def _call_entry(message: dict[str, Any]) -> dict[str, Any]:
    os.environ.update({str(k): str(v) for k, v in (message.get("env") or {}).items()})
    module_name, _, func_name = str(message["entry"]).partition(":")
    value = getattr(importlib.import_module(module_name), func_name)(message.get("payload") or {})
    json.dumps(value)  # a trusted function must return JSON; fail here, not in the parent
    return {"ok": True, "value": value}


def serve(sock: socket.socket, warm_device: str, model_imports: bool = True) -> None:
    from cudal1.eval.channel import Channel, ChannelClosed

    channel = Channel(sock)
    import torch

    hello: dict[str, Any] = {"op": "hello", "pid": os.getpid(), "torch": torch.__version__}
    if warm_device != "-" and warm_device.startswith("cuda") and torch.cuda.is_available():
        if model_imports:
            # Rationale: torch.profiler (the decoy check) and torch.compile pull in torch._dynamo, seconds of
            # imports on first use (the profiled forward took 5-7 s on the H200 host); the candidate's build
            # hooks import torch.utils.cpp_extension (0.5 s there, setuptools included). A started runner pays
            # them before its work, and a candidate that triggers them is not taken for one that patched torch.
            import torch._dynamo  # noqa: F401
            import torch.profiler  # noqa: F401
            import torch.utils.cpp_extension  # noqa: F401

        torch.zeros(1, device=warm_device)  # the CUDA context, before any request
        hello["total_memory"] = int(torch.cuda.get_device_properties(torch.device(warm_device)).total_memory)
    channel.send(hello)
    role: Any = None
    while True:
        try:
            message, fds = channel.recv(max_fds=2)
        except ChannelClosed:
            return
        op = str(message.get("op", ""))
        try:
            if op == "setup":
                role = _make_role(message, channel)
                reply = role.setup_reply() if hasattr(role, "setup_reply") else {"ok": True}
            elif op == "arena":
                if not fds or role is None:
                    raise ValueError("an arena needs a role and a descriptor")
                reply = role.attach(_attach_arena(message, fds[0])) if hasattr(role, "attach") else {"ok": True}
            elif op == "run_entry":
                reply = _call_entry(message)
            elif op == "exit":
                channel.send({"ok": True})
                return
            elif role is None:
                reply = {"ok": False, "error": "no_role", "message": f"{op} before setup"}
            else:
                reply = role.handle(op, message)
        except Exception as exc:  # noqa: BLE001 - reported as data; the parent decides
            kind = getattr(exc, "kind", None)
            reply = {"ok": False, "error": kind or "internal",
                     "message": str(exc)[:500] if kind else f"{type(exc).__name__}: {str(exc)[:500]}",
                     "compile_log": str(getattr(exc, "compile_log", ""))[:4000],
                     "traceback": traceback.format_exc(limit=6)[-2000:]}
        out_fds = reply.pop("_fds", None) or []
        try:
            channel.send(reply, out_fds)
        finally:
            for fd in out_fds:
                os.close(fd)


def _attach_arena(message: dict[str, Any], fd: int) -> Any:
    """The arena a request's descriptor maps: a host memfd, or a device allocation the helper created."""
    if message.get("device"):
        from cudal1.eval.device_arena import DeviceArena

        return DeviceArena.attach(fd, int(message.get("in_bytes", 0)), int(message.get("size", 0)))
    from cudal1.eval.channel import Arena

    return Arena.attach(fd, int(message.get("in_bytes", 0)))


def main() -> None:
    fd, warm_device = int(sys.argv[1]), sys.argv[2]
    model_imports = sys.argv[3:4] != ["bare"]
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    sock = socket.socket(fileno=fd)
    try:
        serve(sock, warm_device, model_imports)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        # Skip interpreter teardown: CUDA contexts and candidate threads can hang or crash at exit.
        os._exit(0)


if __name__ == "__main__":
    main()
