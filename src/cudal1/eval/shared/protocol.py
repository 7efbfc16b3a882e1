"""Every message between the trusted parent and its runners, as frozen dataclasses.

A request is one of the classes below whose `OP` names it; `encode` makes its JSON object
(`{"op": OP, **fields}`), `decode_request` turns an object back into its class, checking every field's type.
Each request names its reply class (`REPLY`); the parent decodes every reply with `decode_reply`, which raises
`MalformedReply` for anything that is not that class (a wrong type, a missing field, an error reply whose kind
is not a string): a candidate's runner that answers nonsense is the candidate's `runtime_error`, never an
exception deep in the parent. A failure a runner reports is an `ErrorReply` (`kind`, `message`).

Tensors never travel here: they lie in arenas (`arena.py`), and messages carry their descriptor trees as
plain dicts, which the arena that reads them validates.
"""

from __future__ import annotations

import dataclasses
import functools
import typing
from dataclasses import dataclass, field
from typing import Any, ClassVar


class MalformedMessage(ValueError):
    """A message that is not one of the protocol's (unknown op, wrong or missing field)."""


class MalformedReply(MalformedMessage):
    """A reply that is not the class its request expects."""


# --------------------------------------------------------------------------- field checking

_JSON_SCALARS = (type(None), bool, int, float, str)


def _check(value: Any, hint: Any, where: str) -> Any:
    """`value` if it has the type `hint` describes (JSON kinds only), else MalformedMessage."""
    origin = typing.get_origin(hint)
    if hint is Any:
        return value
    if isinstance(hint, type) and issubclass(hint, Message):
        return hint.decode(value)
    if origin is typing.Union or str(origin) == "<class 'types.UnionType'>":
        for option in typing.get_args(hint):
            try:
                return _check(value, option, where)
            except MalformedMessage:
                continue
        raise MalformedMessage(f"{where}: unexpected {type(value).__name__}")
    if hint is type(None):
        if value is None:
            return None
    elif hint is bool:
        if isinstance(value, bool):
            return value
    elif hint is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif hint is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    elif hint is str:
        if isinstance(value, str):
            return value
    elif origin is list or hint is list:
        if isinstance(value, list):
            args = typing.get_args(hint)
            return [_check(v, args[0], where) for v in value] if args else value
    elif origin is dict or hint is dict:
        if isinstance(value, dict) and all(isinstance(k, str) for k in value):
            args = typing.get_args(hint)
            return {k: _check(v, args[1], where) for k, v in value.items()} if args else value
    else:  # pragma: no cover - a field type this module does not support is a programming error
        raise TypeError(f"unsupported field type {hint!r}")
    raise MalformedMessage(f"{where}: expected {getattr(hint, '__name__', hint)}, got {type(value).__name__}")


@functools.cache
def _fields(cls: type) -> tuple[tuple[str, Any, bool], ...]:
    """(name, type, required) of a message class's fields, resolved once (`get_type_hints` parses the
    annotations: a millisecond per message otherwise)."""
    hints = typing.get_type_hints(cls)
    return tuple((f.name, hints[f.name], f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING)
                 for f in dataclasses.fields(cls))


class Message:
    """Base of every request and reply: `encode` and the checked `decode`."""

    OP: ClassVar[str] = ""

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
    def decode(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            raise MalformedMessage(f"{cls.__name__}: not an object")
        values = {}
        for name, hint, required in _fields(cls):
            if name in data:
                values[name] = _check(data[name], hint, f"{cls.__name__}.{name}")
            elif required:
                raise MalformedMessage(f"{cls.__name__}: missing {name}")
        return cls(**values)


# --------------------------------------------------------------------------- replies


@dataclass(frozen=True)
class ErrorReply(Message):
    """A request that failed in the runner: `kind` says whose failure (the parent decides what it means)."""

    kind: str
    message: str = ""
    compile_log: str = ""
    traceback: str = ""


@dataclass(frozen=True)
class Done(Message):
    """A request that returns nothing but its success."""


@dataclass(frozen=True)
class Hello(Message):
    OP: ClassVar[str] = "hello"
    pid: int
    torch: str
    total_memory: int = 0


@dataclass(frozen=True)
class ReferenceReady(Message):
    constants: dict[str, Any]
    setup_ms: float


@dataclass(frozen=True)
class TwinReady(Message):
    """The candidate's runner holds the reference's model as its calibration twin (no candidate code yet)."""

    setup_ms: float


@dataclass(frozen=True)
class BuildOutcome(Message):
    """One `load_inline`/`load` call of the candidate's set-up: whether it built, the compiler's log if not."""

    name: str
    ok: bool
    log: str = ""


@dataclass(frozen=True)
class CandidateReady(Message):
    flags: list[dict[str, Any]]
    import_ms: float
    construct_ms: float
    constants: dict[str, Any]
    own_inputs: dict[str, Any]
    #: Every build its set-up made, failed ones included: a failure its own code caught (falling back to
    #: something that runs) is what the result reports as `custom_build_failed`.
    builds: list[BuildOutcome] = field(default_factory=list)


@dataclass(frozen=True)
class HelperReady(Message):
    device_arenas: bool


@dataclass(frozen=True)
class Attached(Message):
    pinned: bool = False


@dataclass(frozen=True)
class EntryResult(Message):
    value: Any


@dataclass(frozen=True)
class Described(Message):
    inputs: dict[str, Any]
    outputs: dict[str, Any]
    call_ms: float
    memory: dict[str, int] | None = None


@dataclass(frozen=True)
class Staged(Message):
    """Inputs made into the reference's staging region: their descriptor tree there (a list with one item per
    call of a bracket, each the inputs of one call)."""

    tree: dict[str, Any]
    nbytes: int


@dataclass(frozen=True)
class Called(Message):
    """One bracket's calls as their runner reports them: times of its own over all of them (device events or a
    host timer), where it committed the outputs (a list, one per call), and its allocator's figures. The
    parent trusts none of it blindly."""

    ms: float
    stream_ms: float
    out: dict[str, Any]
    memory: dict[str, int] | None = None
    cpu_ms: float | None = None  # the runner process's CPU time over the calls (CPU devices), as `ms` is wall


@dataclass(frozen=True)
class Analysis(Message):
    """The reference's own figures for a trial's inputs: its float32 error against a float64 run
    (`ref_errors`) or why not (`precision_skipped`), its rounding noise per output, whether most outputs
    were not finite (inputs the reference cannot handle)."""

    ref_errors: list[float | None] | None = None
    precision_skipped: str = ""
    noise: list[float | None] | None = None
    not_finite: bool = False


@dataclass(frozen=True)
class FlagsReply(Message):
    flags: list[dict[str, Any]]


@dataclass(frozen=True)
class Profiled(Message):
    profile: dict[str, Any]
    raw_kernels: list[str]


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


@dataclass(frozen=True)
class Compared(Message):
    match: bool
    message: str = ""
    errors: list[float | None] = field(default_factory=list)
    mismatch: dict[str, Any] | None = None
    unreadable: str = ""
    hack: str = ""
    memory: dict[str, int] | None = None


@dataclass(frozen=True)
class InputsChecked(Message):
    changed: list[int] = field(default_factory=list)
    ref_same: bool = True
    unreadable: str = ""


# --------------------------------------------------------------------------- requests


@dataclass(frozen=True)
class ModelSettings(Message):
    """What both model runners are set up with alike (device, numerics, threads, memory cap)."""

    device: str
    task_id: str
    ref_source: str
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
    cand_source: str
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
    payload: dict[str, Any] = field(default_factory=dict)
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


def decode_reply(request: Message, data: Any) -> Message:
    """The reply to `request`: its REPLY class or an ErrorReply; MalformedReply for anything else."""
    if not isinstance(data, dict) or not isinstance(data.get("ok"), bool):
        raise MalformedReply(f"the reply to {request.OP} is not a reply")
    body = {k: v for k, v in data.items() if k != "ok"}
    try:
        if not data["ok"]:
            return ErrorReply.decode(body)
        return request.REPLY.decode(body)  # type: ignore[attr-defined]
    except MalformedMessage as exc:
        raise MalformedReply(f"the reply to {request.OP} is malformed: {exc}") from None
