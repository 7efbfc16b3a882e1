"""Entry point of every runner process: `python -m cudal1.eval.inside.runner FD WARM_DEVICE [bare]`.

Started by `runner_process.RunnerProcess` inside the sandbox. FD is the runner's end of its channel,
WARM_DEVICE a device to create the CUDA context on before any request ("-": none); a third argument `bare`
skips the imports only model runners need (the helper's start). The runner says hello, then serves requests
(`shared.protocol`) one at a time until the parent closes the channel:

- `SetupReference`, `SetupTwin` or `SetupHelper` gives it its role (`reference.ReferenceRole`,
  `candidate.CandidateRole`, `helper.HelperRole`); the candidate's runner starts as the reference's twin and
  becomes the candidate's on `ImportCandidate`;
- `AttachArena` maps the arena (and doorbell) whose descriptors travel with it;
- `RunEntry` runs one trusted function (a build, a peak measurement) and returns its JSON value;
- any other request goes to the role.

Every reply is data: the request's reply class, or an `ErrorReply` naming the kind of failure. A runner holds
no key and no verdict; the parent decides what replies mean. This module and its role modules import nothing
of the trusted parent (`tests/eval/test_layout.py` checks what a bare runner has loaded).
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

from cudal1.eval.shared.channel import Channel, ChannelClosed
from cudal1.eval.shared.protocol import (
    AttachArena,
    Attached,
    Done,
    EntryResult,
    ErrorReply,
    Exit,
    Hello,
    MalformedMessage,
    Message,
    RunEntry,
    SetupHelper,
    SetupReference,
    SetupTwin,
    decode_request,
    encode_reply,
)


def _make_role(request: Message, channel: Channel, fds: list[int]) -> Any:
    if isinstance(request, SetupReference):
        from cudal1.eval.inside.reference import ReferenceRole

        return ReferenceRole(request)
    if isinstance(request, SetupTwin):
        from cudal1.eval.inside.candidate import CandidateRole

        return CandidateRole(request, channel)
    from cudal1.eval.inside.helper import HelperRole
    from cudal1.eval.shared.doorbell import Doorbell

    return HelperRole(request, Doorbell.attach(fds[0]) if fds else None)


def _call_entry(request: RunEntry) -> EntryResult:
    os.environ.update({str(k): str(v) for k, v in request.env.items()})
    module_name, _, func_name = request.entry.partition(":")
    value = getattr(importlib.import_module(module_name), func_name)(request.payload)
    json.dumps(value)  # a trusted function must return JSON; fail here, not in the parent
    return EntryResult(value=value)


def loaded_modules(payload: dict[str, Any]) -> dict[str, Any]:
    """The cudal1 modules this runner has loaded (a `RunEntry` for checking what a runner holds)."""
    return {"modules": sorted(name for name in sys.modules if name == "cudal1" or name.startswith("cudal1."))}


def _attach(role: Any, request: AttachArena, fds: list[int]) -> Attached:
    """Map the arena (first descriptor) and the doorbell (the second, and its eventfds where it blocks: model
    runners) and hand them to the role."""
    from cudal1.eval.shared.arena import Arena, ArenaLayout
    from cudal1.eval.shared.doorbell import Doorbell

    if role is None or not fds:
        raise ValueError("an arena needs a role and a descriptor")
    layout = ArenaLayout.from_dict(request.layout)
    if request.device:
        from cudal1.eval.shared.device_arena import DeviceArena

        arena: Any = DeviceArena.attach(fds[0], layout, request.size)
    else:
        arena = Arena.attach(fds[0], layout)
    bell = Doorbell.attach(fds[1], events=(fds[2], fds[3]) if len(fds) >= 4 else None) if len(fds) > 1 else None
    return role.attach(arena, bell)


def _answer(role: Any, request: Message, channel: Channel, fds: list[int]) -> tuple[Any, Message | tuple]:
    """(the role from now on, the reply) of one request."""
    if isinstance(request, (SetupReference, SetupTwin, SetupHelper)):
        role = _make_role(request, channel, fds)
        return role, role.ready()
    if isinstance(request, AttachArena):
        return role, _attach(role, request, fds)
    if isinstance(request, RunEntry):
        return role, _call_entry(request)
    if role is None:
        return role, ErrorReply(kind="no_role", message=f"{request.OP} before setup")
    return role, role.handle(request)


def serve(sock: socket.socket, warm_device: str, model_imports: bool = True) -> None:
    channel = Channel(sock)
    import torch

    total_memory = 0
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
        total_memory = int(torch.cuda.get_device_properties(torch.device(warm_device)).total_memory)
    channel.send(Hello(pid=os.getpid(), torch=torch.__version__, total_memory=total_memory).encode())
    role: Any = None
    while True:
        try:
            data, fds = channel.recv(max_fds=4)
        except ChannelClosed:
            return
        out_fds: list[int] = []
        try:
            request = decode_request(data)
            if isinstance(request, Exit):
                channel.send(encode_reply(Done()))
                return
            role, reply = _answer(role, request, channel, fds)
            if isinstance(reply, tuple):
                reply, out_fds = reply
        except MalformedMessage as exc:
            reply = ErrorReply(kind="protocol", message=str(exc)[:500])
        except Exception as exc:  # noqa: BLE001 - reported as data; the parent decides
            kind = getattr(exc, "kind", None)
            reply = ErrorReply(kind=str(kind or "internal")[:64],
                               message=str(exc)[:500] if kind else f"{type(exc).__name__}: {str(exc)[:500]}",
                               compile_log=str(getattr(exc, "compile_log", ""))[:4000],
                               traceback=traceback.format_exc(limit=6)[-2000:])
        try:
            channel.send(encode_reply(reply), out_fds)
        finally:
            for fd in out_fds:
                os.close(fd)


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
