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
from typing import Any

import torch

from cudal1.eval.inside.harness import gpu_memory, use_device
from cudal1.eval.shared import gate
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

#: After the parent's second ring of a gated bracket, how long the helper waits for its end event before it
#: looks at the done word (an honest model's done is on the device before its runner rings done).
RESCUE_GRACE_S = 2.0
#: The byte a gated bracket fills the model's output region with before the call: float outputs of all
#: ones bits are NaN, so an output left unwritten (a done word written early) is seen in the comparison.
POISON_BYTE = 0xFF
#: How long the helper waits for a gated bracket's end once its words are written.
END_TIMEOUT_S = 60.0

#: How long the armed helper waits for each ring of a bracket (a model's call may take long: its limit is
#: the parent's, which ends the helper too when it gives up).
RING_TIMEOUT_S = 3600.0


def _word_view(ptr: int, device: torch.device) -> Any:
    """One int32 device word at `ptr`, for a copy (no ownership)."""
    class _Word:
        __cuda_array_interface__ = {"shape": (1,), "typestr": "<i4", "data": (ptr, False), "version": 3,
                                    "strides": None, "stream": None}
    return torch.as_tensor(_Word(), device=device)


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
        # Gated brackets run on a stream of the helper's own; a rescue (`_ended`) on another, which the first's
        # wait for a done word never blocks.
        self.stream = torch.cuda.Stream(self.device)
        self.rescue = torch.cuda.Stream(self.device)
        self.done_word = torch.zeros(1, dtype=torch.int32, device=self.device)
        self.release_word = torch.zeros(1, dtype=torch.int32, device=self.device)  # (bracket numbers only grow)
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
        if request.gate:
            if session is None:
                raise ValueError("a gated bracket needs device arenas")
            return self._gated(request, session)
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

    def _gated(self, request: Bracket, session: _Session) -> Bracketed:
        """A gated bracket (`gate` module docstring), all on the helper's own stream: on the first ring, behind
        a release word of the helper's own (so that the staging runs with no host gap in which the device
        could switch to the model's context while its inputs exist), the candidate's output region poisoned,
        the inputs staged into the slot, L2 flushed (between the events `pre` and `start`), then `start`,
        the gate opened, a wait for the model's done word, the output region's snapshot, `end`; one write
        releases it all, and the first ring is answered. On the second (the model rang done, or the parent
        gave up on it), `end` is waited for; if it does not come within `RESCUE_GRACE_S` while the done word
        is still short, the helper writes the words itself (the model never wrote done: `rescued`, a failed
        call) and the events still close. Any failure after the first ring rescues the same way, so that the
        helper's stream is never left waiting."""
        bell, seq, who = self.doorbell, request.seq, request.who
        assert bell is not None
        arena = session.arenas[who]
        gate_ptr, done_ptr = arena.gate_words()
        idle_us = self._probe_us()
        pre, start, end = (torch.cuda.Event(enable_timing=True) for _ in range(3))
        rescued, enqueued, completed = False, False, False
        release = self.release_word.data_ptr()
        bell.ring(ARMED, seq)
        try:
            bell.wait(GO, 2 * seq, RING_TIMEOUT_S)
            t0 = time.perf_counter()
            if request.flush and self.reset is not None and self.reset() != 0:
                clear_last_error()  # (a host call, not stream-ordered: before the staging is released)
            with torch.cuda.stream(self.stream):
                gate.wait_value(self.stream.cuda_stream, release, seq)
                enqueued = True
                pre.record()
                if who == "cand":  # (the reference's runner is trusted, and a null call there writes nothing)
                    out_start, _ = arena.region("out")
                    arena.bytes_tensor()[out_start: out_start + request.snapshot_bytes].fill_(POISON_BYTE)
                arena.copy_from(session.arenas["ref"], request.tree, f"slot{request.slot}", sync=False)
                if request.flush:
                    self.buffer.fill_(1.0)
                start.record()
                gate.write_value(self.stream.cuda_stream, gate_ptr, request.gate)
                gate.wait_value(self.stream.cuda_stream, done_ptr, request.gate)
                session.snapshots[who].take(arena, request.snapshot_bytes)
                end.record()
            gate.write_value(self.rescue.cuda_stream, release, seq)
            stage_us = (time.perf_counter() - t0) * 1e6
            bell.ring(DONE, 2 * seq)
            bell.wait(GO, 2 * seq + 1, RING_TIMEOUT_S)
            t1 = time.perf_counter()
            rescued = not self._ended(end, done_ptr, request.gate, gate_ptr)
            self._wait_event(end)
            completed = True
            end_us = (time.perf_counter() - t1) * 1e6
        except DoorbellTimeout:
            raise ValueError("the parent never finished the bracket") from None
        finally:
            if enqueued and not completed:  # failed half-way: release every wait enqueued, on either side
                for word, value in ((release, seq), (gate_ptr, request.gate), (done_ptr, request.gate)):
                    gate.write_value(self.rescue.cuda_stream, word, value)
                self._wait_event(self.stream)
            bell.ring(DONE, 2 * seq + 1)
        return Bracketed(idle_us=idle_us, stage_us=stage_us, end_us=end_us, gpu_ms=start.elapsed_time(end),
                         gpu_stage_ms=pre.elapsed_time(start), rescued=rescued)

    def _ended(self, end: Any, done_ptr: int, value: int, gate_ptr: int) -> bool:
        """Wait up to `RESCUE_GRACE_S` for `end`; True when it came, or the done word is set (the stream is
        only slow); else write both words from a stream of their own (the helper's stream then closes its
        events) and False."""
        deadline = time.perf_counter() + RESCUE_GRACE_S
        while time.perf_counter() < deadline:
            if end.query():
                return True
            time.sleep(50e-6)
        done = self.done_word  # allocated ahead: an allocation now could wait for the stuck stream
        with torch.cuda.stream(self.rescue):
            done.copy_(_word_view(done_ptr, self.device))
            if int(done.item()) - value >= 0:  # (signed 32-bit words; the gate values stay far below 2**31)
                return True
            gate.write_value(self.rescue.cuda_stream, gate_ptr, value)
            gate.write_value(self.rescue.cuda_stream, done_ptr, value)
        self.rescue.synchronize()
        return False

    def _wait_event(self, event: Any, timeout_s: float = END_TIMEOUT_S) -> None:
        """Wait for `event` (or a stream) by polling, at most `timeout_s` (a stream that never ends fails the
        helper, which the parent then restarts, rather than wedging it)."""
        deadline = time.perf_counter() + timeout_s
        while not event.query():
            if time.perf_counter() > deadline:
                raise ValueError(f"the helper's bracket did not end within {timeout_s:.0f} s")
            time.sleep(50e-6)

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
