"""Where a session's tensors lie, and who moves, snapshots and compares them: one interface, two planes.

- `DevicePlane` (a GPU whose driver shares device memory by file descriptor): the device's helper allocates
  both runners' arenas and alone maps both. Inside a call's bracket it stages the inputs (the reference's
  staging region copied into the calling model's slot) and flushes L2, and after the call its end probe
  snapshots the model's output region; it compares outputs and checks inputs where they lie.
- `HostPlane` (the CPU, or a GPU without shared device memory): sealed memfds that the parent maps. The parent
  copies the inputs into the slot at the bracket's start and snapshots the output region when the model rings
  done; it compares on the CPU itself, or has the helper compare from copies in its host arena (a GPU). On a
  GPU the helper still flushes L2 and probes the device inside the bracket.

A session (`session.Session`) asks the plane, never the mode: `give_arenas`, `place`, `open_bracket`,
`stage`, `end`, `close_bracket`, `compare`, `inputs_changed`, `close`.
"""

from __future__ import annotations

import os
import secrets
from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any

from cudal1.core import flags as F
from cudal1.core.types import Mismatch, Status
from cudal1.eval.device_helper import DeviceHelper
from cudal1.eval.outcomes import InfraFailure, Verdict
from cudal1.eval.runner_process import RunnerFailed, RunnerProcess
from cudal1.eval.shared.arena import (
    Arena,
    ArenaFull,
    ArenaLayout,
    RegionCopy,
    TensorArena,
    UnsupportedValue,
    changed_inputs,
)
from cudal1.eval.shared.compare import (
    Comparison,
    OutputHackError,
    Tolerance,
    compare_outputs,
    tolerances_to_wire,
)
from cudal1.eval.shared.doorbell import Doorbell
from cudal1.eval.shared.protocol import (
    AttachArena,
    Attached,
    Bracket,
    Bracketed,
    CheckInputs,
    Compare,
    Compared,
    ErrorReply,
    Side,
)

#: Room in an arena's `out` region beyond the reference's outputs (alignment, small extras).
ARENA_SLACK_BYTES = 1 << 16
#: Input slots per arena (a bracket's inputs land in one drawn at random): as many as fit this many bytes.
SLOT_BUDGET_BYTES = 1 << 30
MAX_SLOTS = 4
#: A bracket holds the inputs and outputs of at most this many bytes of calls (`max_calls`).
GROUP_BUDGET_BYTES = 128 << 20
WHO = (Side.REF, Side.CAND)


def max_calls(in_bytes: int, out_bytes: int, wanted: int) -> int:
    """How many calls a bracket may hold: `wanted`, as far as their inputs and outputs fit the group budget."""
    return max(1, min(wanted, GROUP_BUDGET_BYTES // max(in_bytes + out_bytes, 1)))


def slot_count(in_bytes: int) -> int:
    return max(1, min(MAX_SLOTS, SLOT_BUDGET_BYTES // max(in_bytes, 1)))


def layouts(in_bytes: int, out_bytes: int) -> dict[str, ArenaLayout]:
    """The two runners' arena layouts: the reference's has a staging region, the candidate's does not."""
    slots, out = slot_count(in_bytes), out_bytes + ARENA_SLACK_BYTES
    return {Side.REF: ArenaLayout.of(in_bytes, out, slots, stage_bytes=in_bytes), Side.CAND: ArenaLayout.of(in_bytes, out, slots)}


@dataclass
class Runners:
    """The two model runners of a session and their doorbells."""

    ref: RunnerProcess
    cand: RunnerProcess

    def __getitem__(self, who: str) -> RunnerProcess:
        return self.ref if who == Side.REF else self.cand


class TensorPlane(ABC):
    """The operations a session needs from wherever its tensors lie (module docstring)."""

    kind = ""

    def __init__(self, runners: Runners, helper: DeviceHelper | None, tolerances: dict[str, Tolerance]):
        self.runners, self.helper, self.tolerances = runners, helper, tolerances
        self.layouts: dict[str, ArenaLayout] = {}
        self.doorbells: dict[str, Doorbell] = {}
        self.out_bytes = 0  # one call's outputs
        self.calls = 1  # calls per bracket now (the session sets it, up to `max_calls`)
        self.max_calls = 1
        self.helper_memory: dict[str, int] | None = None  # the helper's allocator after its last comparison
        self.gates: dict[str, bool] = {}  # per runner: whether it can gate its calls (`Attached.gate`)

    # ------------------------------------------------------------------ set-up

    def give_arenas(self, in_bytes: int, out_bytes: int, calls: int = 1) -> None:
        """Make both runners' arenas (room for brackets of up to `calls` calls of `in_bytes` of inputs and
        `out_bytes` of outputs each) and doorbells, and have each runner map its own."""
        self.layouts, self.out_bytes = layouts(calls * in_bytes, calls * out_bytes), out_bytes
        self.max_calls = calls
        # Without a helper (the CPU) the runner's CPU clock measures its calls: waits block instead of spinning.
        self.doorbells = {who: Doorbell.create(blocking=self.helper is None) for who in WHO}
        self._make_arenas()

    @abstractmethod
    def _make_arenas(self) -> None: ...

    def _give(self, who: str, request: AttachArena, fd: int) -> None:
        runner = self.runners[who]
        runner.thaw()
        try:
            reply = runner.ask(request, timeout_s=60.0, fds=(fd, *self.doorbells[who].descriptors))
        except RunnerFailed as failure:
            if who == Side.CAND:
                raise Verdict(Status.RUNTIME_ERROR, f"the candidate's process {failure.reason}") from None
            raise InfraFailure(f"the reference's runner failed to map its arena: {failure.reason}") from None
        finally:
            runner.freeze()
        if not isinstance(reply, Attached):
            message = reply.message if isinstance(reply, ErrorReply) else "malformed reply"
            if who == Side.CAND:
                raise Verdict(Status.RUNTIME_ERROR, f"the candidate's process failed to map its arena: {message}")
            raise InfraFailure(f"mapping an arena failed: {message}")
        self.gates[who] = reply.gate  # (before the candidate's import: the twin's answer)

    @property
    def snapshot_bytes(self) -> int:
        """What a bracket's end keeps of the model's `out` region: the outputs of its calls, and some room."""
        return min(self.layouts[Side.CAND].out_bytes, self.calls * self.out_bytes + ARENA_SLACK_BYTES)

    def place(self, who: str, stage_tree: dict[str, Any], slot: int) -> dict[str, Any]:
        """Where the inputs staged as `stage_tree` will lie in `who`'s slot `slot`."""
        return self.arena_view(who).place(stage_tree, f"slot{slot}")[0]

    @abstractmethod
    def arena_view(self, who: str) -> TensorArena:
        """An arena with `who`'s layout (the parent's mapping, or one only to compute trees with)."""

    # ------------------------------------------------------------------ the bracket

    def open_bracket(self, who: str, slot: int, stage_tree: dict[str, Any], flush: bool, timeout_s: float,
                     gate: int = 0) -> None:
        """Before the bracket (the model frozen): the helper probes the device and arms (`gate`: a gated
        bracket, `Call.gate`)."""
        if self.helper is not None:
            self.helper.arm(Bracket(sid=self.sid, seq=0, who=who, slot=slot, tree=stage_tree, flush=flush,
                                    snapshot_bytes=self.snapshot_bytes, gate=gate), timeout_s)

    @abstractmethod
    def stage(self, who: str, slot: int, stage_tree: dict[str, Any], timeout_s: float) -> None:
        """Inside the bracket, before the go: the call's inputs into `who`'s slot (and the L2 flush)."""

    @abstractmethod
    def end(self, who: str, timeout_s: float) -> None:
        """Inside the bracket, after the model rang done: its output region as it is now, kept aside."""

    def close_bracket(self, timeout_s: float) -> Bracketed | None:
        """After the bracket: the helper's figures (None without a helper)."""
        return self.helper.finish(timeout_s) if self.helper is not None else None

    # ------------------------------------------------------------------ checks

    @abstractmethod
    def compare(self, ref_tree: dict[str, Any], cand_tree: dict[str, Any], trial: int,
                noise: list[float | None] | None = None, *, errors: bool = False,
                tolerances: dict[str, Tolerance] | None = None) -> Comparison:
        """The candidate's last snapshot against the reference's (under `tolerances`, default the plane's); a
        `Verdict` for outputs that cannot be read or are not plain tensors."""

    @abstractmethod
    def inputs_changed(self, stage_tree: dict[str, Any], ref_slot: dict[str, Any],
                       cand_slot: dict[str, Any]) -> tuple[list[int], bool]:
        """(inputs the candidate's call changed, whether the reference's left all unchanged), byte for byte."""

    def close(self) -> None:
        for bell in self.doorbells.values():
            bell.close()

    @property
    def sid(self) -> str:
        return ""

    def _compared(self, reply: Compared) -> Comparison:
        """A helper's comparison as the session reads it; unreadable or non-plain outputs are verdicts."""
        self.helper_memory = reply.memory
        if reply.unreadable:
            raise _unreadable(ValueError(reply.unreadable))
        if reply.hack:
            raise _hack(reply.hack)
        mismatch = Mismatch.from_dict(reply.mismatch) if reply.mismatch else None
        return Comparison(reply.match, reply.message, mismatch, tuple(reply.errors))


def _unreadable(exc: Exception) -> Verdict:
    return Verdict(Status.INCORRECT, f"the candidate's outputs could not be read: {exc}")


def _hack(text: str) -> Verdict:
    return Verdict(Status.HACK_DETECTED, f"{F.OUTPUT_TYPE}: {text}", flag=F.OUTPUT_TYPE)


class DevicePlane(TensorPlane):
    """Device arenas that the helper allocates, stages, snapshots and compares (module docstring)."""

    kind = "device"

    def __init__(self, runners: Runners, helper: DeviceHelper, tolerances: dict[str, Tolerance]):
        super().__init__(runners, helper, tolerances)
        self.helper: DeviceHelper = helper
        self._sid = secrets.token_hex(8)
        self._views: dict[str, TensorArena] = {}

    @property
    def sid(self) -> str:
        return self._sid

    def _make_arenas(self) -> None:
        made, fds = self.helper.make_arenas(self.sid, self.layouts[Side.REF].to_dict(), self.layouts[Side.CAND].to_dict())
        try:
            for who, fd, share in ((Side.REF, fds[0], made.ref), (Side.CAND, fds[1], made.cand)):
                self._views[who] = _LayoutOnly(self.layouts[who])
                self._give(who, AttachArena(layout=self.layouts[who].to_dict(), device=True,
                                            size=int(share.get("size", 0))), fd)
        finally:
            for fd in fds:
                os.close(fd)

    def arena_view(self, who: str) -> TensorArena:
        return self._views[who]

    def stage(self, who: str, slot: int, stage_tree: dict[str, Any], timeout_s: float) -> None:
        self.helper.ring(0, timeout_s)

    def end(self, who: str, timeout_s: float) -> None:
        self.helper.ring(1, timeout_s)

    def compare(self, ref_tree: dict[str, Any], cand_tree: dict[str, Any], trial: int,
                noise: list[float | None] | None = None, *, errors: bool = False,
                tolerances: dict[str, Tolerance] | None = None) -> Comparison:
        reply = self.helper.compare(Compare(ref=ref_tree, cand=cand_tree, tolerances=tolerances_to_wire(tolerances or self.tolerances),
                                            trial=trial, sid=self.sid, noise=noise, errors=errors), 600.0)
        return self._compared(reply)

    def inputs_changed(self, stage_tree: dict[str, Any], ref_slot: dict[str, Any],
                       cand_slot: dict[str, Any]) -> tuple[list[int], bool]:
        reply = self.helper.check_inputs(CheckInputs(sid=self.sid, given=stage_tree, ref_after=ref_slot,
                                                     cand_after=cand_slot), 600.0)
        if reply.unreadable:
            raise Verdict(Status.INCORRECT, f"the candidate's inputs after the call could not be read: {reply.unreadable}")
        return reply.changed, reply.ref_same

    def close(self) -> None:
        self.helper.drop_arenas(self.sid)
        super().close()


class _LayoutOnly(TensorArena):
    """A layout to compute descriptor trees with (device arenas are mapped by the helper, not the parent)."""

    def bytes_tensor(self) -> Any:
        raise RuntimeError("a layout holds no bytes")


class HostPlane(TensorPlane):
    """Sealed memfds that the parent maps (module docstring)."""

    kind = "host"

    def __init__(self, runners: Runners, helper: DeviceHelper | None, tolerances: dict[str, Tolerance]):
        super().__init__(runners, helper, tolerances)
        self.arenas: dict[str, Arena] = {}
        self.snapshots: dict[str, RegionCopy] = {}
        self.helper_arena: Arena | None = None

    def _make_arenas(self) -> None:
        for who in WHO:
            self.arenas[who] = Arena.create(self.layouts[who])
            self.snapshots[who] = RegionCopy(self.arenas[who], device="cpu")
            self._give(who, AttachArena(layout=self.layouts[who].to_dict()), self.arenas[who].fd)
        if self.helper is not None:  # room for one output of each model, copied for the helper's comparison
            self.helper_arena = Arena.create(ArenaLayout.of(0, 2 * (self.out_bytes + ARENA_SLACK_BYTES)))
            self.helper.attach_host_arena(self.helper_arena)

    def arena_view(self, who: str) -> TensorArena:
        return self.arenas[who]

    def stage(self, who: str, slot: int, stage_tree: dict[str, Any], timeout_s: float) -> None:
        try:
            self.arenas[who].copy_from(self.arenas[Side.REF], stage_tree, f"slot{slot}")
        except (UnsupportedValue, ArenaFull, ValueError) as exc:  # the reference's inputs: the task's problem
            raise InfraFailure(f"the reference's inputs cannot cross to the models: {exc}") from None
        if self.helper is not None:
            self.helper.ring(0, timeout_s)  # the L2 flush, from the helper's context

    def end(self, who: str, timeout_s: float) -> None:
        self.snapshots[who].take(self.arenas[who], self.snapshot_bytes)
        if self.helper is not None:
            self.helper.ring(1, timeout_s)

    def compare(self, ref_tree: dict[str, Any], cand_tree: dict[str, Any], trial: int,
                noise: list[float | None] | None = None, *, errors: bool = False,
                tolerances: dict[str, Tolerance] | None = None) -> Comparison:
        ref, cand = self.snapshots[Side.REF], self.snapshots[Side.CAND]
        try:
            if self.helper is None or self.helper_arena is None:
                return compare_outputs(ref.unpack(ref_tree), cand.unpack(cand_tree), tolerances or self.tolerances,
                                       trial, noise=noise, errors=errors)
            ref_at, offset = self.helper_arena.copy_from(ref, ref_tree, "out")
            cand_at, _ = self.helper_arena.copy_from(cand, cand_tree, "out", offset)
        except OutputHackError as exc:
            raise _hack(str(exc)) from None
        except (UnsupportedValue, ArenaFull, ValueError, TypeError, KeyError) as exc:
            raise _unreadable(exc) from None
        reply = self.helper.compare(Compare(ref=ref_at, cand=cand_at, tolerances=tolerances_to_wire(tolerances or self.tolerances),
                                            trial=trial, noise=noise, errors=errors), 600.0)
        return self._compared(reply)

    def inputs_changed(self, stage_tree: dict[str, Any], ref_slot: dict[str, Any],
                       cand_slot: dict[str, Any]) -> tuple[list[int], bool]:
        try:
            return changed_inputs((self.arenas[Side.REF], stage_tree), (self.arenas[Side.REF], ref_slot),
                                  (self.arenas[Side.CAND], cand_slot))
        except (UnsupportedValue, ValueError, TypeError, KeyError) as exc:
            raise Verdict(Status.INCORRECT, f"the candidate's inputs after the call could not be read: {exc}") from None

    def close(self) -> None:
        for arena in (*self.arenas.values(), self.helper_arena):
            if arena is not None:
                arena.close()
        super().close()


def make_plane(runners: Runners, helper: DeviceHelper | None, tolerances: dict[str, Tolerance]) -> TensorPlane:
    """Device arenas where the helper can share device memory, host arenas elsewhere."""
    if helper is not None and helper.device_arenas:
        return DevicePlane(runners, helper, tolerances)
    return HostPlane(runners, helper, tolerances)
