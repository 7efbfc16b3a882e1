"""The parent's side of a device's trusted helper: one `DeviceHelper` per GPU, owning its process and calls.

The helper (`inside.helper.HelperRole`) is a sandboxed runner with a CUDA context of its own that never
imports task or candidate code. It is started once per device and process (in the background when a runner
supply is made: its start takes seconds), restarted when it is gone, and ended with the process. Every
failure of the helper is the evaluation's (`InfraFailure`), never the candidate's.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import select
import threading
from typing import Any

from cudal1.eval.outcomes import InfraFailure
from cudal1.eval.runner_process import RunnerFailed, RunnerProcess
from cudal1.eval.shared.doorbell import ARMED, DONE, GO, Doorbell, DoorbellTimeout
from cudal1.eval.shared.protocol import (
    ArenasMade,
    Bracket,
    Bracketed,
    CheckInputs,
    Compare,
    Compared,
    DropArenas,
    ErrorReply,
    Flush,
    Flushed,
    HelperReady,
    InputsChecked,
    MakeArenas,
    Message,
    SetupHelper,
)
from cudal1.eval.supply import core_split

logger = logging.getLogger(__name__)

START_TIMEOUT_S = 120.0


class AnsweredEarly(DoorbellTimeout):
    """The helper answered on its socket while the parent waited for it to arm: its reply says why."""


class DeviceHelper:
    """The trusted helper of one device (module docstring)."""

    def __init__(self, device: str):
        self.device = device
        self.runner = RunnerProcess(device, warm=True, model_imports=False)  # it never runs a model
        self.doorbell = Doorbell.create()
        split = core_split(device)
        if split is not None and split.helper is not None:
            self.runner.pin(split.helper)
        try:
            ready = self._ask(SetupHelper(device=device), START_TIMEOUT_S, fds=(self.doorbell.fd,))
            assert isinstance(ready, HelperReady)
            # Device arenas unless the driver lacks them or the user asks for host memory (a comparison).
            self.device_arenas = ready.device_arenas and os.environ.get("CUDAL1_HOST_ARENAS") != "1"
            rates = [self.flush().GBps for _ in range(3)]
        except (InfraFailure, AssertionError) as exc:
            self.close()
            raise InfraFailure(f"the device helper could not start: {exc}") from None
        #: The fill's write bandwidth (GB/s), which the physical floor of a task's time uses.
        self.bandwidth_gbps = max(rates) if rates else None
        self._armed: Bracket | None = None  # the bracket the helper is in
        self._seq = 0  # bracket numbers: increasing over the helper's life, whatever the session

    def alive(self) -> bool:
        return self.runner.proc.poll() is None

    def _ask(self, request: Message, timeout_s: float, fds: tuple[int, ...] = ()) -> Message:
        try:
            reply = self.runner.ask(request, timeout_s, fds)
        except RunnerFailed as failure:
            raise InfraFailure(f"the device helper failed ({request.OP}): {failure.reason}") from None
        if isinstance(reply, ErrorReply):
            raise InfraFailure(f"the device helper failed ({request.OP}): {reply.message or reply.kind}")
        return reply

    def flush(self, timeout_s: float = 60.0) -> Flushed:
        reply = self._ask(Flush(), timeout_s)
        assert isinstance(reply, Flushed)
        return reply

    def make_arenas(self, sid: str, ref: dict[str, int], cand: dict[str, int]) -> tuple[ArenasMade, list[int]]:
        try:
            reply, fds = self.runner.ask_descriptors(MakeArenas(sid=sid, ref=ref, cand=cand), 60.0, count=2)
        except RunnerFailed as failure:
            raise InfraFailure(f"the device helper failed to make device arenas: {failure.reason}") from None
        if not isinstance(reply, ArenasMade) or len(fds) != 2:
            for fd in fds:
                os.close(fd)
            message = reply.message if isinstance(reply, ErrorReply) else "no descriptors"
            raise InfraFailure(f"the device helper failed to make device arenas: {message}")
        return reply, fds

    def drop_arenas(self, sid: str) -> None:
        try:
            self.runner.ask(DropArenas(sid=sid), 30.0)
        except RunnerFailed:
            pass  # a helper that is gone took the arenas with it

    def attach_host_arena(self, arena: Any) -> None:
        from cudal1.eval.shared.protocol import AttachArena

        self._ask(AttachArena(layout=arena.layout.to_dict()), 60.0, fds=(arena.fd,))

    def compare(self, request: Compare, timeout_s: float) -> Compared:
        reply = self._ask(request, timeout_s)
        assert isinstance(reply, Compared)
        return reply

    def check_inputs(self, request: CheckInputs, timeout_s: float) -> InputsChecked:
        reply = self._ask(request, timeout_s)
        assert isinstance(reply, InputsChecked)
        return reply

    # ------------------------------------------------------------------ its part of a bracket

    def arm(self, request: Bracket, timeout_s: float) -> None:
        """Send the bracket's request (numbered here) and wait until the helper has probed the device and
        armed."""
        self._seq += 1
        request = dataclasses.replace(request, seq=self._seq)
        try:
            self.runner.send(request)
            self._armed = request
            self.doorbell.wait(ARMED, request.seq, timeout_s, tick=self._tick)
        except (RunnerFailed, DoorbellTimeout) as exc:
            reason = str(exc)
            if isinstance(exc, AnsweredEarly):  # it failed before arming: its reply says why
                reply = self.runner.reply(request, 10.0)
                reason = getattr(reply, "message", reason)
            self._armed = None
            raise InfraFailure(f"the device helper did not arm: {reason}") from None

    def ring(self, phase: int, timeout_s: float) -> float:
        """Ring phase `phase` (0: stage, 1: end probe) of the armed bracket; the clock reading when done."""
        assert self._armed is not None, "no bracket armed"
        value = 2 * self._armed.seq + phase
        self.doorbell.ring(GO, value)
        try:
            return self.doorbell.wait(DONE, value, timeout_s, tick=self._tick)
        except DoorbellTimeout:
            raise InfraFailure("the device helper did not answer within the bracket") from None

    def finish(self, timeout_s: float) -> Bracketed:
        """The helper's reply to the bracket; a bracket left half-way (the model failed) is rung to its end."""
        request, self._armed = self._armed, None
        assert request is not None, "no bracket armed"
        for value in (2 * request.seq, 2 * request.seq + 1):  # harmless when already rung
            if self.doorbell.read(GO) < value:
                self.doorbell.ring(GO, value)
        try:
            reply = self.runner.reply(request, timeout_s)
        except RunnerFailed as failure:
            raise InfraFailure(f"the device helper failed in a bracket: {failure.reason}") from None
        if not isinstance(reply, Bracketed):
            raise InfraFailure(f"the device helper failed in a bracket: {getattr(reply, 'message', reply)}")
        return reply

    def _tick(self) -> None:
        if not self.alive():
            raise DoorbellTimeout("the device helper exited")
        if select.select([self.runner.channel.sock], [], [], 0)[0] and self._armed is not None \
                and self.doorbell.read(ARMED) < self._armed.seq:  # it failed before arming: its reply says why
            raise AnsweredEarly("the device helper answered before it armed")

    def close(self) -> None:
        self.runner.close()
        self.doorbell.close()


# --------------------------------------------------------------------------- one helper per device


_helpers: dict[str, DeviceHelper] = {}
_helpers_lock = threading.Lock()


def helper_for(device: str) -> DeviceHelper:
    """The trusted helper of `device` in this process, started on first use and restarted when gone."""
    with _helpers_lock:
        known = _helpers.get(device)
        if known is not None and known.alive():
            return known
        if known is not None:
            known.close()
        _helpers[device] = DeviceHelper(device)
        return _helpers[device]


def prestart_helper(device: str) -> None:
    """Start the helper of `device` in the background (its start, ~10 s on an H200 host, then overlaps the
    builds and the runners' starts instead of delaying the first evaluation); a failure here is left to the
    first evaluation's own `helper_for`, which reports it."""
    def start() -> None:
        try:
            helper_for(device)
        except Exception:  # noqa: BLE001 - reported by the evaluation that needs the helper
            logger.debug("the device helper did not start ahead", exc_info=True)

    threading.Thread(target=start, name=f"cudal1-helper-{device}", daemon=True).start()


def discard_helper(device: str) -> None:
    """End the helper of `device` (if any); the next `helper_for` starts a new one."""
    with _helpers_lock:
        known = _helpers.pop(device, None)
    if known is not None:
        known.close()


def close_helpers() -> None:
    with _helpers_lock:
        for helper in _helpers.values():
            helper.close()
        _helpers.clear()
