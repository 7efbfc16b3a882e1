"""A device's trusted helper: a sandboxed process with a CUDA context of its own that never imports task or
candidate code.

- `Flush`: evicts L2 from a context the candidate does not control (and resets the persisting-L2 lines,
  which an ordinary flush does not evict), timed by its own events;
- `MakeArenas` / `DropArenas`: a session's two device arenas (`device_arena.DeviceArena`), whose descriptors
  go to the parent, which gives each runner its own; the helper alone maps both;
- `Bracket`: its part of one call's bracket. Before arming, an *idle probe*: a tiny kernel launched and
  waited for; work another context left on the device delays it (a kernel of this context waits for another
  context's queued kernels: no preemption was seen up to 3.5 ms on the H200 host, docs/log.md 2026-12-04).
  On the first ring it *stages* the call's inputs (the reference's staging region, copied into the calling
  model's slot) and flushes L2; on the second, after the model rang done, the *end probe*: a copy of the
  model's output region into the helper's own snapshot, which waits for whatever the model left queued,
  and keeps what it returned as it was at that moment (the next bracket's idle probe then waits for anything
  the model queued later);
- `Compare`: compares two outputs where they lie (the reference's out region, the candidate's snapshot) or
  as the parent copied them into the helper's host arena, by the same `compare_outputs` as the parent uses
  on the CPU;
- `CheckInputs`: whether the calls left each slot's inputs as staged, byte for byte.
"""

from __future__ import annotations

import dataclasses
import time

import torch

from cudal1.eval.inside.harness import gpu_memory, use_device
from cudal1.eval.shared.arena import (
    ArenaFull,
    ArenaLayout,
    RegionCopy,
    TensorArena,
    UnsupportedValue,
    changed_inputs,
)
from cudal1.eval.shared.compare import OutputHackError, compare_outputs, tolerances_from_wire
from cudal1.eval.shared.cudart import clear_last_error, persisting_l2_reset
from cudal1.eval.shared.doorbell import ARMED, DONE, GO, Doorbell, DoorbellTimeout
from cudal1.eval.shared.protocol import (
    ArenasMade,
    Attached,
    Bracket,
    Bracketed,
    CheckInputs,
    Compare,
    Compared,
    Done,
    DropArenas,
    Flush,
    Flushed,
    HelperReady,
    InputsChecked,
    MakeArenas,
    Message,
    SetupHelper,
)

#: How long the armed helper waits for each ring of a bracket (a model's call may take long: its limit is
#: the parent's, which ends the helper too when it gives up).
RING_TIMEOUT_S = 3600.0


@dataclasses.dataclass
class _Session:
    arenas: dict[str, TensorArena]
    snapshots: dict[str, RegionCopy]


class HelperRole:
    """The helper's requests (module docstring)."""

    def __init__(self, request: SetupHelper, doorbell: Doorbell | None):
        self.device = use_device(request.device)
        props = torch.cuda.get_device_properties(self.device)
        l2 = int(getattr(props, "L2_cache_size", 0) or 0)
        self.buffer = torch.empty(max(2 * l2, 256 * 2**20) // 4, dtype=torch.float32, device=self.device)
        self.probe = torch.zeros(1, device=self.device)
        self.reset = persisting_l2_reset()
        self.doorbell = doorbell
        self.host_arena: TensorArena | None = None
        self.sessions: dict[str, _Session] = {}

    def ready(self) -> HelperReady:
        from cudal1.eval.shared import cuda_vmm

        return HelperReady(device_arenas=cuda_vmm.available())

    def attach(self, arena: TensorArena, doorbell: Doorbell | None) -> Attached:
        """A host arena of the parent's, into which it copies outputs to compare (host-arena mode)."""
        if self.host_arena is not None:
            self.host_arena.close()
        self.host_arena = arena
        return Attached(pinned=arena.register_with_cuda())

    def handle(self, request: Message) -> Message | tuple[Message, list[int]]:
        if isinstance(request, Bracket):
            return self._bracket(request)
        if isinstance(request, Compare):
            return self._compare(request)
        if isinstance(request, CheckInputs):
            return self._check_inputs(request)
        if isinstance(request, Flush):
            ms = self._flush()
            return Flushed(ms=ms, GBps=self.buffer.numel() * 4 / max(ms, 1e-6) / 1e6)
        if isinstance(request, MakeArenas):
            return self._make_arenas(request)
        if isinstance(request, DropArenas):
            session = self.sessions.pop(request.sid, None)
            if session is not None:
                for arena in session.arenas.values():
                    arena.close()
            self._release_cache()
            return Done()
        raise ValueError(f"the device helper does not serve {request.OP}")

    # ------------------------------------------------------------------ the bracket

    def _flush(self) -> float:
        """Rewrite a buffer of twice the L2 and reset the persisting lines; the fill's own time (ms)."""
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        self.buffer.fill_(1.0)
        end.record()
        if self.reset is not None and self.reset() != 0:
            clear_last_error()  # else torch's next launch check reports the failed reset as its own error
        end.synchronize()
        return start.elapsed_time(end)

    def _probe_us(self) -> float:
        """A tiny kernel of this context, launched and waited for: microseconds (host clock)."""
        t0 = time.perf_counter()
        self.probe.add_(1.0)
        torch.cuda.synchronize(self.device)
        return (time.perf_counter() - t0) * 1e6

    def _bracket(self, request: Bracket) -> Bracketed:
        if self.doorbell is None:
            raise ValueError("a bracket needs the helper's doorbell")
        session = self.sessions.get(request.sid)
        bell, seq = self.doorbell, request.seq
        idle_us = self._probe_us()
        bell.ring(ARMED, seq)
        try:
            bell.wait(GO, 2 * seq, RING_TIMEOUT_S)
            t0 = time.perf_counter()
            if session is not None:  # device arenas: the inputs go from the reference's stage to the slot
                session.arenas[request.who].copy_from(session.arenas["ref"], request.tree, f"slot{request.slot}")
            flush_ms = self._flush() if request.flush else None
            torch.cuda.synchronize(self.device)
            stage_us = (time.perf_counter() - t0) * 1e6
            bell.ring(DONE, 2 * seq)
            bell.wait(GO, 2 * seq + 1, RING_TIMEOUT_S)
            t1 = time.perf_counter()
            if session is not None:
                session.snapshots[request.who].take(session.arenas[request.who], request.snapshot_bytes)
            self.probe.add_(1.0)
            torch.cuda.synchronize(self.device)
            end_us = (time.perf_counter() - t1) * 1e6
        except DoorbellTimeout:
            raise ValueError("the parent never finished the bracket") from None
        finally:
            bell.ring(DONE, 2 * seq + 1)
        return Bracketed(idle_us=idle_us, stage_us=stage_us, end_us=end_us, flush_ms=flush_ms)

    # ------------------------------------------------------------------ arenas, comparisons

    def _release_cache(self) -> None:
        """Give the allocator's cached blocks back to the device between sessions: this process outlives
        every evaluation, and what one session's comparisons cached (several times its outputs' size) would
        otherwise stay taken beside the next session's two runners, which may each use their capped share."""
        torch.cuda.synchronize(self.device)
        torch.cuda.empty_cache()

    def _make_arenas(self, request: MakeArenas) -> tuple[ArenasMade, list[int]]:
        from cudal1.eval.shared.device_arena import DeviceArena

        old = self.sessions.pop(request.sid, None)
        for arena in (old.arenas.values() if old else ()):
            arena.close()
        made = {who: DeviceArena.create(ArenaLayout.from_dict(layout))
                for who, layout in (("ref", request.ref), ("cand", request.cand))}
        self.sessions[request.sid] = _Session(made, {who: RegionCopy(a) for who, a in made.items()})
        fds = [made["ref"].take_descriptor(), made["cand"].take_descriptor()]
        return ArenasMade(ref=made["ref"].share(), cand=made["cand"].share()), [fd for fd in fds if fd is not None]

    def _session(self, sid: str) -> _Session:
        session = self.sessions.get(sid)
        if session is None:
            raise ValueError("no device arenas for this session")
        return session

    def _check_inputs(self, request: CheckInputs) -> InputsChecked:
        arenas = self._session(request.sid).arenas
        try:
            changed, ref_same = changed_inputs((arenas["ref"], request.given), (arenas["ref"], request.ref_after),
                                               (arenas["cand"], request.cand_after))
        except (UnsupportedValue, ValueError, TypeError, KeyError) as exc:
            return InputsChecked(unreadable=str(exc)[:300])
        return InputsChecked(changed=changed, ref_same=ref_same)

    def _compare(self, request: Compare) -> Compared:
        tolerances = tolerances_from_wire(request.tolerances)
        if request.sid:  # device arenas: the reference's output where it lies, the candidate's snapshot
            session = self._session(request.sid)
            ref = session.arenas["ref"].unpack(request.ref, device=self.device, copy=False)
            try:
                cand = session.snapshots["cand"].unpack(request.cand, device=self.device, copy=False)
            except (UnsupportedValue, ArenaFull, ValueError, TypeError, KeyError) as exc:
                return Compared(match=False, unreadable=str(exc)[:300])
        else:
            if self.host_arena is None:
                raise ValueError("no host arena attached")
            ref = self.host_arena.unpack(request.ref, device=self.device)
            cand = self.host_arena.unpack(request.cand, device=self.device)
        try:
            result = compare_outputs(ref, cand, tolerances, request.trial, noise=request.noise, errors=request.errors)
        except OutputHackError as exc:
            return Compared(match=False, hack=str(exc))
        return Compared(match=result.ok, message=result.message, errors=list(result.errors),
                        mismatch=dataclasses.asdict(result.mismatch) if result.mismatch else None,
                        memory=gpu_memory(self.device))
