"""Everything a runner sends is hostile input: the schema enforced at decode, the channel's limits, and a fuzz
of both with thousands of random and structured cases (cudal1.eval.shared.schema, .protocol, .channel)."""

from __future__ import annotations

import json
import math
import random
import socket

import pytest

from cudal1.eval.shared import protocol as P
from cudal1.eval.shared import schema as S
from cudal1.eval.shared.channel import Channel, ChannelClosed, ProtocolError, socket_pair

CALL = P.Call(seq=1, slot=0, inputs={})
TENSOR = {"t": "tensor", "offset": 0, "nbytes": 16, "dtype": "float32", "shape": [2, 2], "device": "cpu",
          "cls": "Tensor"}
HONEST = P.encode_reply(P.Called(ms=0.05, stream_ms=0.05, out={"t": "seq", "type": "tuple", "items": [TENSOR]},
                                 memory={"allocated": 1024}, cpu_ms=0.04))


def reply_with(**fields):
    return {**HONEST, **fields}


@pytest.mark.parametrize(("fields", "says"), [
    ({"ms": float("nan")}, "Called.ms is not finite"),
    ({"ms": float("inf")}, "Called.ms is not finite"),
    ({"ms": 0.0}, "Called.ms is 0, not above 0"),
    ({"ms": -1.0}, "not above 0"),
    ({"ms": 1e300}, "above its limit"),
    ({"stream_ms": -0.5}, "Called.stream_ms is -0.5, not at least 0"),
    ({"cpu_ms": float("nan")}, "Called.cpu_ms is not finite"),
    ({"memory": {"allocated": 10**40}}, "beyond 64 bits"),
    ({"memory": {"allocated": 1.5}}, "expected int"),
    ({"verdict": "correct"}, "unknown field 'verdict'"),
    ({"out": {"t": "tensor"}}, "Called.out.offset"),
    ({"out": {**TENSOR, "shape": [-1]}}, "Called.out.shape"),
    ({"out": {**TENSOR, "dtype": "__class__"}}, "not a dtype's name"),
    ({"out": {**TENSOR, "extra": 1}}, "malformed descriptor"),
])
def test_a_reply_outside_the_schema_names_what_is_wrong(fields, says):
    with pytest.raises(P.MalformedReply) as caught:
        P.decode_reply(CALL, reply_with(**fields))
    assert str(caught.value).startswith("protocol.malformed: ") and says in str(caught.value)


def test_the_honest_reply_and_its_error_form_pass():
    assert P.decode_reply(CALL, HONEST).ms == 0.05
    error = P.encode_reply(P.ErrorReply(kind="raised", message="forward raised ValueError: x"))
    assert isinstance(P.decode_reply(CALL, error), P.ErrorReply)


def test_trees_are_bounded_in_depth_and_size_without_recursion():
    deep: object = 0
    for _ in range(100_000):  # far deeper than Python's recursion limit
        deep = [deep]
    with pytest.raises(S.MalformedMessage, match="nested deeper"):
        S.check_tree(deep, "x")
    with pytest.raises(S.MalformedMessage, match="more than"):
        S.check_tree(list(range(S.MAX_TREE_NODES + 1)), "x")
    seq = TENSOR
    for _ in range(S.MAX_DESCRIPTOR_DEPTH + 1):
        seq = {"t": "seq", "type": "tuple", "items": [seq]}
    with pytest.raises(P.MalformedReply, match="deeper than a descriptor tree"):
        P.decode_reply(CALL, reply_with(out=seq))


def test_measured_errors_of_trusted_processes_may_overflow():
    """A mismatch's error or a reference's noise can be inf: those fields say so; times never may."""
    compared = {"ok": True, "match": True, "errors": [float("inf"), None, 0.1]}
    got = P.decode_reply(P.Compare(ref={}, cand={}, tolerances={"default": [0, 0]}, trial=0), compared)
    assert math.isinf(got.errors[0])


def test_the_channel_refuses_what_it_cannot_parse_and_what_exceeds_a_limit():
    parent, child = socket_pair()
    ours, theirs = Channel(parent), Channel(child)
    try:
        for raw, says in [(b"[" * 20_000 + b"]" * 20_000, "nested deeper"), (b"\xff{nope", "not JSON"),
                          (b"[1, 2]", "not a JSON object"), (b"{" + b" " * 70_000 + b"}", "exceeds its limit")]:
            theirs.sock.sendall(raw)
            with pytest.raises(ProtocolError, match=says):
                ours.recv(2.0, max_bytes=64 * 1024)
        theirs.sock.sendall(b'{"ok": true}')
        assert ours.recv(2.0) == ({"ok": True}, []) and ours.last_bytes == 12
    finally:
        ours.close()
        theirs.close()


# --------------------------------------------------------------------------- fuzz

def _mutations(rng: random.Random):
    """Structured mutations of an honest reply, each a JSON-able value or raw bytes."""
    junk = [float("nan"), float("inf"), -float("inf"), 10**30, -(10**30), 1e308, -1e-308, "", "x" * 70_000, True,
            None, [], {}, [[[]]], {"t": "tensor"}, 0, -1, 2**63, "NaN", {"a": float("nan")}]
    field = rng.choice(["ms", "stream_ms", "out", "memory", "cpu_ms", "ok", "kind", "message", "junk"])
    case = dict(HONEST)
    kind = rng.randrange(9)
    if kind == 0:
        case[field] = rng.choice(junk)
    elif kind == 1:
        case.pop(rng.choice(list(case)), None)
    elif kind == 2:  # a deep value somewhere (deeper than the parser takes: raw bytes)
        depth = rng.choice([10, 40, 500, 20_000])
        if depth > 500:
            return b'{"ok":true,"ms":1,"stream_ms":1,"out":' + b"[" * depth + b"]" * depth + b"}"
        deep: object = rng.choice(junk[:6])
        for _ in range(depth):
            deep = [deep] if rng.random() < 0.5 else {"k": deep}
        case[field] = deep
    elif kind == 3:  # a descriptor tree with one node wrong
        node = dict(TENSOR)
        node[rng.choice(list(TENSOR))] = rng.choice(junk)
        case["out"] = {"t": "seq", "type": "tuple", "items": [node] * rng.randrange(1, 4)}
    elif kind == 4:
        return json.dumps(case).encode()[: rng.randrange(1, 200)]  # truncated
    elif kind == 5:
        return bytes(rng.randrange(256) for _ in range(rng.randrange(1, 300)))  # garbage
    elif kind == 6:
        return json.dumps(rng.choice(junk)).encode()  # not an object
    elif kind == 7:
        case["out"] = {"t": "seq", "type": "tuple", "items": [TENSOR] * rng.choice([1, 10, 5000])}
    else:
        case = {"ok": False, "kind": rng.choice(junk + ["raised"]), "message": rng.choice(junk + ["m"])}
    return case


def test_fuzzed_replies_are_decoded_or_refused_never_anything_else():
    rng = random.Random(20261207)
    accepted = refused = 0
    for _ in range(3000):
        case = _mutations(rng)
        if isinstance(case, bytes):
            try:
                case = json.loads(case)
            except (ValueError, RecursionError):  # the channel's to refuse (the next test)
                refused += 1
                continue
        try:
            reply = P.decode_reply(CALL, case)
        except P.MalformedReply as exc:
            assert str(exc).startswith("protocol.malformed: ")
            refused += 1
            continue
        accepted += 1
        if isinstance(reply, P.Called):
            assert math.isfinite(reply.ms) and reply.ms > 0 and math.isfinite(reply.stream_ms)
    assert refused > 2000 and accepted > 10


def test_fuzzed_frames_through_the_channel_raise_only_the_protocols_errors():
    """The parent's receive: whatever frame arrives, `recv` returns an object or raises ProtocolError, and
    what it returns decodes or is refused by name (no RecursionError, OverflowError, TypeError...)."""
    rng = random.Random(7)
    parent, child = socket_pair()
    ours, theirs = Channel(parent), Channel(child)
    outcomes = {"decoded": 0, "malformed": 0, "protocol": 0}
    try:
        for _ in range(2000):
            case = _mutations(rng)
            raw = case if isinstance(case, bytes) else json.dumps(case).encode()
            if len(raw) > 4 * 2**20:
                continue
            theirs.sock.sendall(raw)
            try:
                message, _ = ours.recv(2.0, max_bytes=P.reply_limit(CALL))
                P.decode_reply(CALL, message)
                outcomes["decoded"] += 1
            except ProtocolError:
                outcomes["protocol"] += 1
            except P.MalformedReply:
                outcomes["malformed"] += 1
        theirs.close()
        with pytest.raises(ChannelClosed):
            ours.recv(2.0)
    finally:
        ours.close()
    assert outcomes["protocol"] > 100 and outcomes["malformed"] > 500, outcomes
    assert socket  # the channel is a real AF_UNIX SOCK_SEQPACKET pair
