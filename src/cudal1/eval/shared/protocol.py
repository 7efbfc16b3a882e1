"""Every message between the trusted parent and its runners, as frozen dataclasses.

A request is one of the classes below whose `OP` names it; `encode` makes its JSON object
(`{"op": OP, **fields}`), `decode_request` turns an object back into its class, checking every field's type.
Each request names its reply class (`REPLY`); the parent decodes every reply with `decode_reply`, which raises
`MalformedReply` for anything that is not that class. The schema is the fields' annotations, enforced at
decode (`schema.check`): types, finite numbers in stated ranges (a call's time above zero and below a day), bounded
strings, lists and trees (depth and size, checked without recursion), no unknown fields; each reply class also
bounds its encoded size (`MAX_BYTES`, which the receiver checks before parsing). A candidate's runner that
answers anything else is the candidate's `runtime_error` (`protocol.malformed: ...`), never an exception deep
in the parent. A failure a runner reports is an `ErrorReply` (`kind`, `message`).

Tensors never travel here: they lie in arenas (`arena.py`), and messages carry their descriptor trees as
plain dicts, checked node by node at decode (`schema.check_descriptors`).
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import typing
from dataclasses import dataclass, field
from typing import Annotated, Any, ClassVar

from cudal1.eval.shared.schema import (
    MAX_ITEMS,
    MAX_MS,
    MAX_SOURCE_CHARS,
    Count,
    Descriptors,
    MalformedMessage,
    MaxLen,
    Measured,
    Ms,
    NonNegMs,
    OneOf,
    Range,
    Tree,
    check,
)


class Side(str, enum.Enum):
    """Whose runner, arena or call: the reference's or the candidate's. A `str`, so its values are what travel
    and what is recorded (`Bracket.who`, the timing series' keys, JSON): "ref" and "cand"."""

    REF = "ref"
    CAND = "cand"

    def __str__(self) -> str:
        return self.value


class MalformedReply(MalformedMessage):
    """A reply that is not the class its request expects. `detail` says what is wrong; the text is
    `protocol.malformed: <detail>`."""

    def __init__(self, detail: str):
        super().__init__(f"{MALFORMED}: {detail}")
        self.detail = detail


@functools.cache
def _fields(cls: type) -> tuple[tuple[str, Any, bool], ...]:
    """(name, type, required) of a message class's fields, resolved once (`get_type_hints` parses the
    annotations: a millisecond per message otherwise)."""
    hints = typing.get_type_hints(cls, include_extras=True)
    return tuple((f.name, hints[f.name], f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING)
                 for f in dataclasses.fields(cls))


@functools.cache
def _names(cls: type) -> frozenset[str]:
    return frozenset(f.name for f in dataclasses.fields(cls))


class Message:
    """Base of every request and reply: `encode` and the checked `decode`."""

    OP: ClassVar[str] = ""
    #: The largest encoded message of this class a receiver accepts (bytes of JSON; the channel's own limit
    #: bounds every message). Sized from honest runs with a wide margin (docs/sandbox.md).
    MAX_BYTES: ClassVar[int] = 64 * 1024

    def encode(self) -> dict[str, Any]:
        out = {}
        for f in dataclasses.fields(self):  # type: ignore[arg-type]
            value = getattr(self, f.name)
            if isinstance(value, Message):
                value = value.encode()
            elif isinstance(value, list) and value and isinstance(value[0], Message):
                value = [v.encode() for v in value]
            out[f.name] = value
        if self.OP:
            out["op"] = self.OP
        return out

    @classmethod
    def decode(cls, data: Any, where: str = "") -> Any:
        where = where or cls.__name__
        if not isinstance(data, dict):
            raise MalformedMessage(f"{where} is not an object")
        unknown = [k for k in data if k not in _names(cls) and not (k == "op" and cls.OP and data[k] == cls.OP)]
        if unknown:
            raise MalformedMessage(f"{where} has an unknown field {str(unknown[0])[:40]!r}")
        values = {}
        for name, hint, required in _fields(cls):
            if name in data:
                values[name] = check(data[name], hint, f"{where}.{name}")
            elif required:
                raise MalformedMessage(f"{where} lacks {name}")
        return cls(**values)


# --------------------------------------------------------------------------- records inside replies


@dataclass(frozen=True)
class FlagRecord(Message):
    """A finding a runner reports (`core.types.Flag` on the wire)."""

    rule: Annotated[str, MaxLen(200)]
    severity: Annotated[str, OneOf(("error", "warning", "info"))]
    message: Annotated[str, MaxLen(2000)] = ""
    line: Annotated[int, Range(0, 10**9)] | None = None
    source: Annotated[str, MaxLen(40)] = "runtime"


@dataclass(frozen=True)
class KernelRecord(Message):
    """One name's GPU activity in a profile (`kernel_profile.KernelStat` on the wire)."""

    name: Annotated[str, MaxLen(4096)]
    calls: Count
    total_us: Annotated[float, Range(0.0, MAX_MS * 1e3)]
    kind: Annotated[str, MaxLen(40)] = "kernel"


@dataclass(frozen=True)
class ProfileRecord(Message):
    """What one profiled call ran (`kernel_profile.KernelProfile` on the wire)."""

    kernels: Annotated[list[KernelRecord], MaxLen(MAX_ITEMS)] = field(default_factory=list)
    device: Annotated[str, MaxLen(40)] = "cpu"
    available: bool = True
    note: Annotated[str, MaxLen(2000)] = ""
    wall_ms: NonNegMs | None = None
    total_us: Annotated[float, Range(0.0, MAX_MS * 1e3)] | None = None  # derived; the reader recomputes it


# --------------------------------------------------------------------------- replies


@dataclass(frozen=True)
class ErrorReply(Message):
    """A request that failed in the runner: `kind` says whose failure (the parent decides what it means)."""

    kind: Annotated[str, MaxLen(64)]
    message: Annotated[str, MaxLen(4000)] = ""
    compile_log: Annotated[str, MaxLen(8000)] = ""
    traceback: Annotated[str, MaxLen(4000)] = ""


@dataclass(frozen=True)
class Done(Message):
    """A request that returns nothing but its success."""


@dataclass(frozen=True)
class Hello(Message):
    OP: ClassVar[str] = "hello"
    pid: Count
    torch: Annotated[str, MaxLen(100)]
    total_memory: Count = 0


@dataclass(frozen=True)
class ReferenceReady(Message):
    constants: dict[str, Any]
    setup_ms: NonNegMs


@dataclass(frozen=True)
class TwinReady(Message):
    """The candidate's runner holds the reference's model as its calibration twin (no candidate code yet)."""

    setup_ms: NonNegMs


@dataclass(frozen=True)
class BuildOutcome(Message):
    """One `load_inline`/`load` call of the candidate's set-up: whether it built, the compiler's log if not."""

    name: Annotated[str, MaxLen(200)]
    ok: bool
    log: Annotated[str, MaxLen(8000)] = ""


@dataclass(frozen=True)
class CandidateReady(Message):
    MAX_BYTES: ClassVar[int] = 1024 * 1024
    flags: Annotated[list[FlagRecord], MaxLen(1000)]
    import_ms: NonNegMs
    construct_ms: NonNegMs
    constants: dict[str, Any]
    own_inputs: dict[str, Any]
    #: Every build its set-up made, failed ones included: a failure its own code caught (falling back to
    #: something that runs) is what the result reports as `custom_build_failed`.
    builds: Annotated[list[BuildOutcome], MaxLen(64)] = field(default_factory=list)


@dataclass(frozen=True)
class HelperReady(Message):
    device_arenas: bool


@dataclass(frozen=True)
class Attached(Message):
    pinned: bool = False
    gate: bool = False  # the runner can enqueue its calls behind the GPU clock's gate (`gate.usable`)


@dataclass(frozen=True)
class EntryResult(Message):
    """What a trusted function run in a sandbox returned (a build's outcome, measured figures)."""

    MAX_BYTES: ClassVar[int] = 4 * 1024 * 1024
    value: Annotated[Any, Tree(nodes=500_000)]


@dataclass(frozen=True)
class Described(Message):
    inputs: Annotated[dict[str, Any], Descriptors()]
    outputs: Annotated[dict[str, Any], Descriptors()]
    call_ms: NonNegMs
    memory: dict[str, Count] | None = None


@dataclass(frozen=True)
class Staged(Message):
    """Inputs made into the reference's staging region: their descriptor tree there (a list with one item per
    call of a bracket, each the inputs of one call)."""

    MAX_BYTES: ClassVar[int] = 1024 * 1024
    tree: Annotated[dict[str, Any], Descriptors()]
    nbytes: Count


@dataclass(frozen=True)
class Called(Message):
    """One bracket's calls as their runner reports them: times of its own over all of them (device events or a
    host timer), where it committed the outputs (a list, one per call), and its allocator's figures. The
    parent trusts none of it blindly."""

    ms: Ms
    stream_ms: NonNegMs
    out: Annotated[dict[str, Any], Descriptors()]
    memory: dict[str, Count] | None = None
    cpu_ms: NonNegMs | None = None  # the runner process's CPU time over the calls (CPU devices), as `ms` is wall


@dataclass(frozen=True)
class Analysis(Message):
    """The reference's own figures for a trial's inputs: its float32 error against a float64 run
    (`ref_errors`) or why not (`precision_skipped`), its rounding noise per output, whether most outputs
    were not finite (inputs the reference cannot handle)."""

    ref_errors: list[Measured | None] | None = None
    precision_skipped: Annotated[str, MaxLen(2000)] = ""
    noise: list[Measured | None] | None = None
    not_finite: bool = False


@dataclass(frozen=True)
class FlagsReply(Message):
    MAX_BYTES: ClassVar[int] = 1024 * 1024
    flags: Annotated[list[FlagRecord], MaxLen(1000)]


@dataclass(frozen=True)
class Profiled(Message):
    MAX_BYTES: ClassVar[int] = 1024 * 1024
    profile: ProfileRecord
    raw_kernels: Annotated[list[Annotated[str, MaxLen(4096)]], MaxLen(MAX_ITEMS)]


@dataclass(frozen=True)
class Flushed(Message):
    ms: float = 0.0
    GBps: float = 0.0


@dataclass(frozen=True)
class ArenasMade(Message):
    """The helper's two device arenas of a session (their descriptors travel with the reply)."""

    ref: dict[str, Any]
    cand: dict[str, Any]


@dataclass(frozen=True)
class Bracketed(Message):
    """The helper's side of one bracket (microseconds, its own clock): its idle probe before arming (work
    another context left on the device delays it), the staging of the inputs (and the L2 flush), the end
    probe after the model's call (it waits for whatever the model left queued)."""

    idle_us: float
    stage_us: float
    end_us: float
    flush_ms: float | None = None
    # The GPU clock (a gated bracket): the helper's events from the gate's opening to the output's snapshot,
    # and over its staging before it; `rescued` when the model's done word never came and the helper wrote it.
    gpu_ms: float | None = None
    gpu_stage_ms: float | None = None
    rescued: bool = False


@dataclass(frozen=True)
class Compared(Message):
    match: bool
    message: str = ""
    errors: list[Measured | None] = field(default_factory=list)
    mismatch: dict[str, Any] | None = None
    unreadable: str = ""
    hack: str = ""
    memory: dict[str, Count] | None = None


@dataclass(frozen=True)
class InputsChecked(Message):
    changed: list[Count] = field(default_factory=list)
    ref_same: bool = True
    unreadable: str = ""


# --------------------------------------------------------------------------- requests


@dataclass(frozen=True)
class ModelSettings(Message):
    """What both model runners are set up with alike (device, numerics, threads, memory cap)."""

    device: str
    task_id: str
    ref_source: Annotated[str, MaxLen(MAX_SOURCE_CHARS)]
    sizes: str
    seed: int
    threads: int
    exact_fp32: bool
    gpu_memory_fraction: float


@dataclass(frozen=True)
class SetupReference(Message):
    OP: ClassVar[str] = "setup_reference"
    REPLY: ClassVar[type] = ReferenceReady
    model: ModelSettings


@dataclass(frozen=True)
class SetupTwin(Message):
    """The candidate's runner, before any candidate code: the reference's model as a twin, timed against the
    reference's runner to calibrate this process's harness (`ImportCandidate` replaces it)."""

    OP: ClassVar[str] = "setup_twin"
    REPLY: ClassVar[type] = TwinReady
    model: ModelSettings
    env: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class ImportCandidate(Message):
    OP: ClassVar[str] = "import_candidate"
    REPLY: ClassVar[type] = CandidateReady
    cand_source: Annotated[str, MaxLen(MAX_SOURCE_CHARS)]
    seed: int


@dataclass(frozen=True)
class SetupHelper(Message):
    OP: ClassVar[str] = "setup_helper"
    REPLY: ClassVar[type] = HelperReady
    device: str


@dataclass(frozen=True)
class AttachArena(Message):
    """Map the arena (and the doorbell) whose descriptors travel with this request."""

    OP: ClassVar[str] = "attach_arena"
    REPLY: ClassVar[type] = Attached
    layout: dict[str, int]
    device: bool = False
    size: int = 0


@dataclass(frozen=True)
class RunEntry(Message):
    OP: ClassVar[str] = "run_entry"
    REPLY: ClassVar[type] = EntryResult
    entry: str
    # The parent's own payload, whose strings may be whole sources (a candidate's, a reference's)
    payload: Annotated[dict[str, Any], Tree(nodes=500_000, text=MAX_SOURCE_CHARS)] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Exit(Message):
    OP: ClassVar[str] = "exit"
    REPLY: ClassVar[type] = Done


@dataclass(frozen=True)
class Describe(Message):
    OP: ClassVar[str] = "describe"
    REPLY: ClassVar[type] = Described
    seed: int


@dataclass(frozen=True)
class MakeInputs(Message):
    """The reference's runner: the inputs of `count` calls into its staging region, one set per seed from `seed`
    on (`distribution`: reference or heavy)."""

    OP: ClassVar[str] = "make_inputs"
    REPLY: ClassVar[type] = Staged
    seed: int
    distribution: str = "reference"
    count: int = 1


@dataclass(frozen=True)
class Call(Message):
    """The calls of one bracket: the runner's model called on each item of the inputs that will lie in `slot`
    (`inputs`: their tree there, a list with one item per call), in the bracket of doorbell sequence `seq`: the
    runner arms, waits for the go, calls once per item, commits the outputs, rings done. Trials and timed calls
    are this same request."""

    OP: ClassVar[str] = "call"
    REPLY: ClassVar[type] = Called
    seq: int
    slot: int
    inputs: dict[str, Any]
    # The GPU clock: the calls are enqueued behind the gate word reaching `gate` and end with the done word
    # set to it, then the runner arms (`harness.ModelSide.call`); 0: the host clock's bracket. `null` (the
    # reference's runner only): no model call, the bracket's own cost.
    gate: Count = 0
    null: bool = False


@dataclass(frozen=True)
class Analyze(Message):
    """The reference's runner, after a trial's call: its own error and noise on the staged inputs."""

    OP: ClassVar[str] = "analyze"
    REPLY: ClassVar[type] = Analysis
    inputs: dict[str, Any]
    out: dict[str, Any]
    noise_atol: float
    precision: bool = False
    heavy: bool = False


@dataclass(frozen=True)
class FlushCpu(Message):
    OP: ClassVar[str] = "flush_cpu"
    REPLY: ClassVar[type] = Done


@dataclass(frozen=True)
class Guards(Message):
    OP: ClassVar[str] = "guards"
    REPLY: ClassVar[type] = FlagsReply
    phase: str = "the calls"


@dataclass(frozen=True)
class Profile(Message):
    OP: ClassVar[str] = "profile"
    REPLY: ClassVar[type] = Profiled
    seed: int


@dataclass(frozen=True)
class Flush(Message):
    """The helper: evict L2 (and the persisting lines), timed by its own events."""

    OP: ClassVar[str] = "flush"
    REPLY: ClassVar[type] = Flushed


@dataclass(frozen=True)
class MakeArenas(Message):
    OP: ClassVar[str] = "make_arenas"
    REPLY: ClassVar[type] = ArenasMade
    sid: str
    ref: dict[str, int]
    cand: dict[str, int]


@dataclass(frozen=True)
class DropArenas(Message):
    OP: ClassVar[str] = "drop_arenas"
    REPLY: ClassVar[type] = Done
    sid: str


@dataclass(frozen=True)
class Bracket(Message):
    """The helper's part of one call's bracket (its doorbell travels with `SetupHelper`): idle probe, then
    arm; on the first ring stage the reference's staged inputs (`tree`) into `who`'s `slot` (and flush L2
    with `flush`); on the second the end probe, with a snapshot of `who`'s output region (`snapshot_bytes`
    of it) for a later comparison."""

    OP: ClassVar[str] = "bracket"
    REPLY: ClassVar[type] = Bracketed
    sid: str
    seq: int
    who: str
    slot: int
    tree: dict[str, Any]
    flush: bool
    snapshot_bytes: int
    gate: Count = 0  # a gated bracket (`Call.gate`): the helper opens the gate and times the call on the device


@dataclass(frozen=True)
class Compare(Message):
    """Compare outputs where they lie: the reference's in its arena's out region, the candidate's in the
    helper's snapshot of its latest call (device arenas), or both in the helper's host arena (host arenas)."""

    OP: ClassVar[str] = "compare"
    REPLY: ClassVar[type] = Compared
    ref: dict[str, Any]
    cand: dict[str, Any]
    tolerances: dict[str, list[float]]
    trial: int
    sid: str = ""
    noise: list[float | None] | None = None
    errors: bool = False


@dataclass(frozen=True)
class CheckInputs(Message):
    """Byte-for-byte: did the calls leave the inputs in the two slots as staged?"""

    OP: ClassVar[str] = "check_inputs"
    REPLY: ClassVar[type] = InputsChecked
    sid: str
    given: dict[str, Any]
    ref_after: dict[str, Any]
    cand_after: dict[str, Any]


REQUESTS: dict[str, type] = {cls.OP: cls for cls in (
    SetupReference, SetupTwin, ImportCandidate, SetupHelper, AttachArena, RunEntry, Exit, Describe, MakeInputs,
    Call, Analyze, FlushCpu, Guards, Profile, Flush, MakeArenas, DropArenas, Bracket, Compare, CheckInputs)}


def encode(message: Message) -> dict[str, Any]:
    return message.encode()


def decode_request(data: Any) -> Message:
    """The request a runner received; MalformedMessage for an unknown op or a bad field."""
    if not isinstance(data, dict) or not isinstance(data.get("op"), str):
        raise MalformedMessage("a request needs an op")
    cls = REQUESTS.get(data["op"])
    if cls is None:
        raise MalformedMessage(f"unknown op {data['op']!r}")
    return cls.decode({k: v for k, v in data.items() if k != "op"})


def encode_reply(reply: Message) -> dict[str, Any]:
    """A reply as it travels: `ok` says which of the two shapes (the reply's class, or an ErrorReply)."""
    return {"ok": not isinstance(reply, ErrorReply), **reply.encode()}


#: How a runner's reply that breaks the schema is named in verdicts and flags (`core.flags.PROTOCOL_MALFORMED`).
MALFORMED = "protocol.malformed"


def reply_limit(request: Message) -> int:
    """The largest reply to `request` a receiver reads (bytes): its reply class's, or an error reply's."""
    return max(request.REPLY.MAX_BYTES, ErrorReply.MAX_BYTES)  # type: ignore[attr-defined]


def decode_reply(request: Message, data: Any) -> Message:
    """The reply to `request`: its REPLY class or an ErrorReply; MalformedReply for anything else, with a
    message that says what is wrong (`protocol.malformed: Called.ms is not finite`)."""
    if not isinstance(data, dict) or not isinstance(data.get("ok"), bool):
        raise MalformedReply(f"the reply to {request.OP} is not a reply")
    body = {k: v for k, v in data.items() if k != "ok"}
    try:
        if not data["ok"]:
            return ErrorReply.decode(body)
        return request.REPLY.decode(body)  # type: ignore[attr-defined]
    except MalformedMessage as exc:
        raise MalformedReply(str(exc)) from None
