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
