"""Messages and shared memory between the parent and its runners (cudal1.eval.shared.channel)."""

from __future__ import annotations

import fcntl
import os

import pytest
import torch

from cudal1.eval.shared.channel import (
    Arena,
    ArenaFull,
    Channel,
    ChannelTimeout,
    OpaqueValue,
    UnsupportedValue,
    changed_inputs,
    describe_value,
    socket_pair,
    tree_nbytes,
)


def _dtypes():
    names = ["float32", "float64", "float16", "bfloat16", "int64", "int8", "uint8", "bool", "complex64",
             "float8_e4m3fn", "float8_e5m2"]
    return [getattr(torch, n) for n in names if hasattr(torch, n)]


@pytest.mark.parametrize("dtype", _dtypes(), ids=str)
def test_every_dtype_crosses_bit_for_bit(dtype):
    x = torch.randn(3, 5).to(dtype) if dtype != torch.bool else torch.rand(3, 5) > 0.5
    value = (x, [x[0], torch.tensor(2.5)], 7, None, "s", x.t())
    arena = Arena.create(0, 4096)
    try:
        tree = arena.pack(value, "out")
        back = arena.unpack(tree)
        assert isinstance(back, tuple) and isinstance(back[1], list) and back[2:5] == (7, None, "s")
        for a, b in ((x, back[0]), (x[0], back[1][0]), (x.t().contiguous(), back[5])):  # strided: by value
            assert a.dtype == b.dtype and a.shape == b.shape
            assert torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))
    finally:
        arena.close()


def test_unpacked_values_are_copies_that_later_writes_do_not_change():
    arena = Arena.create(0, 4096)
    tree = arena.pack(torch.ones(16), "out")
    snapshot = arena.unpack(tree)
    arena.pack(torch.zeros(16), "out")  # the runner overwrites its arena after the parent copied
    assert torch.equal(snapshot, torch.ones(16))
    arena.close()


def test_views_see_the_shared_memory_itself():
    arena = Arena.create(4096, 0)
    tree = arena.pack([torch.arange(8, dtype=torch.float32)], "in")
    view = arena.unpack(tree, copy=False)[0]
    arena.write_region("in", torch.full((8,), 3.0).numpy().tobytes())
    assert torch.equal(view, torch.full((8,), 3.0))
    arena.close()


def test_changed_inputs_compares_bytes_across_arenas():
    """The trial's input check: an input the candidate changed in place is named, and only counts when the
    reference leaves it unchanged; a missing input counts as changed; NaN payloads compare bit for bit."""
    given_x, given_y = torch.randn(4, 4), torch.tensor([float("nan"), 1.0])
    ref, cand = Arena.create(4096, 4096), Arena.create(4096, 4096)
    try:
        given = ref.pack([given_x, given_y], "in")
        ref_after = ref.pack([given_x.clone(), given_y.clone()], "out")
        cand_after = cand.pack([given_x * 2, given_y.clone()], "out")
        assert changed_inputs((ref, given), (ref, ref_after), (cand, cand_after)) == ([0], True)
        cand_after = cand.pack([given_x.clone()], "out")
        assert changed_inputs((ref, given), (ref, ref_after), (cand, cand_after)) == ([1], True)
        ref_after = ref.pack([given_x + 1, given_y.clone()], "out")  # the reference itself changes x
        assert changed_inputs((ref, given), (ref, ref_after), (cand, cand.pack([given_x, given_y], "out")))[1] is False
    finally:
        ref.close()
        cand.close()


def test_an_arena_cannot_be_resized_by_either_side():
    arena = Arena.create(4096, 4096)
    seals = fcntl.fcntl(arena.fd, fcntl.F_GET_SEALS)
    assert seals & fcntl.F_SEAL_SHRINK and seals & fcntl.F_SEAL_GROW
    with pytest.raises(PermissionError):
        os.ftruncate(arena.fd, 0)  # a runner that shrank it would crash the parent with SIGBUS
    arena.close()


def test_outputs_larger_than_the_region_are_refused():
    arena = Arena.create(0, 1024)
    with pytest.raises(ArenaFull):
        arena.pack(torch.zeros(1024), "out")
    arena.close()


@pytest.mark.parametrize("tree", [
    {"t": "tensor", "offset": 10**9, "nbytes": 4, "dtype": "float32", "shape": [1]},
    {"t": "tensor", "offset": 0, "nbytes": 8, "dtype": "float32", "shape": [1]},
    {"t": "tensor", "offset": 0, "nbytes": 4, "dtype": "os.system", "shape": [1]},
    {"t": "tensor", "offset": 0, "nbytes": 4, "dtype": "float32", "shape": [-1, -4]},
    "not a dict",
])
def test_descriptors_that_do_not_fit_the_arena_are_refused(tree):
    arena = Arena.create(0, 1024)
    with pytest.raises(UnsupportedValue):
        arena.unpack({"t": "seq", "type": "tuple", "items": [tree]})
    arena.close()


def test_values_json_cannot_carry_are_opaque_and_compare_by_repr():
    arena = Arena.create(0, 1024)
    back = arena.unpack(arena.pack(object, "out"))
    assert isinstance(back, OpaqueValue) and back == OpaqueValue("type", repr(object))
    arena.close()


def test_describe_value_sizes_what_pack_writes():
    value = [torch.zeros(100), (torch.zeros(3, dtype=torch.float64), 2)]
    arena = Arena.create(0, 8192)
    assert tree_nbytes(describe_value(value)) == tree_nbytes(arena.pack(value, "out"))
    arena.close()


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


@pytest.mark.gpu
def test_helper_compares_across_many_pinned_arenas():
    """The device helper lives across evaluations and pins each new arena: a range left registered after an
    arena closed made the next arena at that address fail to pin, and that failure surfaced as the error of
    the helper's next comparison (seen on an H200 as `infra_error` for 9 of 30 candidates)."""
    from cudal1.eval.inside.runner import HelperRole

    helper = HelperRole({"device": "cuda"})
    for round_ in range(6):
        size = 2**20 * (1 + round_ % 2)
        arena = Arena.create(0, 2 * size)
        x = torch.randn(size // 8)
        ref = arena.pack(x, "out")
        cand, _ = arena.copy_from(arena, ref, "out", size)
        attached = Arena.attach(os.dup(arena.fd), 0)
        assert helper.attach(attached)["pinned"], f"round {round_}: the arena could not be pinned"
        reply = helper.handle("compare", {"ref": ref, "cand": cand, "profile": "strict", "trial": 0})
        assert reply["ok"] and reply["match"], reply
        arena.close()
    helper.arena.close()
    torch.ones(4, device="cuda").add_(1)
    torch.cuda.synchronize()


@pytest.mark.gpu
def test_helper_device_arenas_copy_compare_and_check_inputs():
    """A session's device arenas in the helper: trial inputs copied from the reference's arena into the
    candidate's, outputs compared where they lie, input changes found, a malformed candidate tree refused as
    the candidate's (not the helper's) failure, and the arenas attachable from their descriptors."""
    from cudal1.eval.shared.device_arena import DeviceArena
    from cudal1.eval.inside.runner import HelperRole

    helper = HelperRole({"device": "cuda"})
    assert helper.setup_reply()["device_arenas"]
    reply = helper.handle("device_arenas", {"sid": "s1", "ref": [1 << 20, 4 << 20], "cand": [1 << 20, 4 << 20]})
    fds = reply.pop("_fds")
    ref_side, cand_side = (DeviceArena.attach(fd, reply[w]["in_bytes"], reply[w]["size"]) for fd, w in
                           zip(fds, ("ref", "cand"), strict=True))
    x = torch.randn(256, 256, device="cuda")
    in_tree = ref_side.pack([x], "in")
    moved = helper.handle("copy", {"sid": "s1", "tree": in_tree, "src": "ref", "dst": "cand", "region": "in"})["tree"]
    got = cand_side.unpack(moved, device="cuda")[0]
    assert torch.equal(got, x)
    ref_out = ref_side.pack((x * 2, [x]), "out")
    good = cand_side.pack((got * 2, [got]), "out")
    assert helper.handle("compare", {"sid": "s1", "ref": ref_out, "cand": good, "profile": "strict", "trial": 0})["match"]
    bad = cand_side.pack((got * 2 + 1, [got.mul_(3)]), "out")
    assert not helper.handle("compare", {"sid": "s1", "ref": ref_out, "cand": bad, "profile": "strict", "trial": 0})["match"]
    checked = helper.handle("inputs_changed", {"sid": "s1", "given": in_tree, "ref_after": ref_out["items"][1],
                                               "cand_after": bad["items"][1]})
    assert checked["changed"] == [0] and checked["ref_same"], checked
    outside = {"t": "tensor", "offset": 1 << 40, "nbytes": 4, "dtype": "float32", "shape": [1], "cls": "Tensor"}
    refused = helper.handle("compare", {"sid": "s1", "ref": ref_out, "cand": outside, "profile": "strict", "trial": 0})
    assert refused["ok"] and refused["unreadable"], refused
    assert helper.handle("drop_arenas", {"sid": "s1"})["ok"] and "s1" not in helper.sessions
    for arena in (ref_side, cand_side):
        arena.close()
    torch.cuda.synchronize()
