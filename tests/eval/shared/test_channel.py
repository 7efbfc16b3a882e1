"""The socket between the parent and a runner (cudal1.eval.shared.channel)."""

from __future__ import annotations

import os

import pytest

from cudal1.eval.shared.channel import MAX_MESSAGE_BYTES, Channel, ChannelTimeout, ProtocolError, socket_pair


def test_channel_carries_messages_and_descriptors_and_times_out():
    a, b = socket_pair()
    left, right = Channel(a), Channel(b)
    r, w = os.pipe()
    left.send({"op": "x", "n": [1, 2]}, fds=(r,))
    message, fds = right.recv(timeout_s=5, max_fds=1)
    assert message == {"op": "x", "n": [1, 2]} and len(fds) == 1
    os.write(w, b"hi")
    assert os.read(fds[0], 2) == b"hi"
    ticks = []
    with pytest.raises(ChannelTimeout):
        right.recv(timeout_s=0.2, tick=lambda: ticks.append(1))
    assert ticks  # the watchdog ran while waiting
    for fd in (r, w, fds[0]):
        os.close(fd)
    left.close()
    right.close()


@pytest.mark.parametrize("raw", [b"not json", b"[1, 2]", b'"a string"'])
def test_what_is_not_a_json_object_breaks_the_protocol(raw):
    a, b = socket_pair()
    try:
        a.sendall(raw)
        with pytest.raises(ProtocolError):
            Channel(b).recv(timeout_s=5)
        with pytest.raises(ProtocolError):  # nor is anything beyond the size limit sent
            Channel(a).send({"x": "y" * MAX_MESSAGE_BYTES})
    finally:
        a.close()
        b.close()


def test_the_largest_source_fits_one_message_whatever_it_holds():
    """The size limit of a source (`MAX_SOURCE_BYTES`, checked where a source enters) is below what one message
    can carry even when every character is one JSON escapes into six (a control character: `\\u0001`), with
    room for the rest of the request: a source the loaders accept never fails as an oversized message."""
    from cudal1.eval.shared.protocol import ImportCandidate, ModelSettings, SetupReference
    from cudal1.tasks.task import MAX_SOURCE_BYTES, size_problem

    worst = "\x01" * MAX_SOURCE_BYTES
    assert size_problem(worst) is None and size_problem(worst + "x") is not None
    model = ModelSettings(device="cpu", task_id="t" * 300, ref_source=worst, sizes="full", seed=1, threads=1,
                          exact_fp32=True, gpu_memory_fraction=0.5)
    a, b = socket_pair()
    try:
        for message in (SetupReference(model=model), ImportCandidate(cand_source=worst, seed=1)):
            Channel(a).send(message.encode())
            received, _ = Channel(b).recv(timeout_s=30)
            assert len(received) >= 1
    finally:
        a.close()
        b.close()
