"""The typed protocol between the parent and its runners (cudal1.eval.shared.protocol)."""

from __future__ import annotations

import pytest

from cudal1.eval.shared import protocol as P


def settings() -> P.ModelSettings:
    return P.ModelSettings(device="cpu", task_id="t", ref_source="src", sizes="small", seed=42, threads=1,
                           exact_fp32=True, gpu_memory_fraction=0.45)


def test_every_request_round_trips_through_its_wire_form():
    requests = [P.SetupReference(model=settings()), P.SetupTwin(model=settings(), env={"A": "1"}),
                P.ImportCandidate(cand_source="x", seed=1), P.Call(seq=3, slot=1, inputs={"t": "seq"}),
                P.Bracket(sid="s", seq=2, who="cand", slot=0, tree={}, flush=True, snapshot_bytes=64),
                P.Compare(ref={}, cand={}, tolerances={"default": [1e-4, 1e-4]}, trial=-1, noise=[None, 0.5])]
    for request in requests:
        assert P.decode_request(P.encode(request)) == request
    assert set(P.REQUESTS) >= {r.OP for r in requests}
    assert all(isinstance(cls.REPLY, type) for cls in P.REQUESTS.values())  # every op names its reply


@pytest.mark.parametrize("data", [
    {"op": "nope"}, {"seq": 1}, {"op": "call", "seq": "1", "slot": 0, "inputs": {}},
    {"op": "call", "slot": 0, "inputs": {}}, {"op": "call", "seq": True, "slot": 0, "inputs": {}},
    {"op": "setup_reference", "model": {"device": "cpu"}}, ["op", "call"],
])
def test_malformed_requests_are_refused_by_name(data):
    with pytest.raises(P.MalformedMessage):
        P.decode_request(data)


@pytest.mark.parametrize("reply", [
    None, [], {"ms": 1.0}, {"ok": "yes"}, {"ok": True, "ms": "fast", "stream_ms": 1.0, "out": {}},
    {"ok": True, "ms": 1.0, "stream_ms": 1.0, "out": []}, {"ok": False, "kind": 7},
    {"ok": True, "ms": 1.0, "stream_ms": 1.0, "out": {}, "memory": {"allocated": "x"}},
])
def test_a_reply_that_is_not_its_requests_class_is_malformed(reply):
    """What a candidate's runner sends back is data the parent checks: anything but the request's reply class
    or an error reply raises `MalformedReply` (the candidate's runtime error), never a deep exception."""
    with pytest.raises(P.MalformedReply):
        P.decode_reply(P.Call(seq=1, slot=0, inputs={}), reply)


TENSOR = {"t": "tensor", "offset": 0, "nbytes": 16, "dtype": "float32", "shape": [2, 2], "device": "cpu",
          "cls": "Tensor"}


def test_replies_decode_to_their_class_or_an_error_reply():
    call = P.Call(seq=1, slot=0, inputs={})
    got = P.decode_reply(call, {"ok": True, "ms": 1, "stream_ms": 0.5, "out": TENSOR})
    assert got == P.Called(ms=1.0, stream_ms=0.5, out=TENSOR)
    assert P.decode_reply(call, P.encode_reply(P.ErrorReply(kind="raised", message="boom"))) == \
        P.ErrorReply(kind="raised", message="boom")


def test_the_set_up_reply_carries_its_builds_checked_one_by_one():
    ready = P.CandidateReady(flags=[], import_ms=1.0, construct_ms=2.0, constants={}, own_inputs={},
                             builds=[P.BuildOutcome(name="ext", ok=False, log="main.cpp: error"),
                                     P.BuildOutcome(name="other", ok=True)])
    request = P.ImportCandidate(cand_source="x", seed=1)
    assert P.decode_reply(request, P.encode_reply(ready)) == ready
    forged = {**P.encode_reply(ready), "builds": [{"name": "ext", "ok": "no"}]}
    with pytest.raises(P.MalformedReply):
        P.decode_reply(request, forged)


def test_sides_are_one_vocabulary_with_the_wire_values():
    """`Side` names whose runner, arena or call it is; its members are the strings that travel and are recorded
    ("ref", "cand"), so a dict keyed by either finds the other and JSON stays as it was. The parent's modules
    once spelled the two sides as ~45 string literals; none is left."""
    import json
    import re
    from pathlib import Path

    assert P.Side.REF == "ref" and P.Side.CAND == "cand" and str(P.Side.CAND) == "cand"
    assert {"ref": 1}[P.Side.REF] == 1 and {P.Side.CAND: 2}["cand"] == 2
    assert json.dumps({P.Side.REF: [P.Side.CAND]}) == '{"ref": ["cand"]}'
    parent = Path(P.__file__).resolve().parents[1]  # src/cudal1/eval
    literal = re.compile(r"""(?<![\w`])["'](ref|cand)["']""")
    spelled = [f"{path.name}:{n}" for path in sorted(parent.glob("*.py"))
               for n, line in enumerate(path.read_text().splitlines(), 1)
               if literal.search(line.split("#", 1)[0])]
    assert not spelled, spelled
