"""Arenas: shared memory for tensors in regions, and their descriptor trees (cudal1.eval.shared.arena)."""

from __future__ import annotations

import fcntl
import os

import pytest
import torch

from cudal1.eval.shared.arena import (
    Arena,
    ArenaFull,
    ArenaLayout,
    OpaqueValue,
    RegionCopy,
    UnsupportedValue,
    changed_inputs,
    describe_value,
    tree_nbytes,
)


def arena(slot: int = 0, out: int = 4096, slots: int = 1, stage: int = 0) -> Arena:
    return Arena.create(ArenaLayout.of(slot, out, slots, stage))


def _dtypes():
    names = ["float32", "float64", "float16", "bfloat16", "int64", "int8", "uint8", "bool", "complex64",
             "float8_e4m3fn", "float8_e5m2"]
    return [getattr(torch, n) for n in names if hasattr(torch, n)]


@pytest.mark.parametrize("dtype", _dtypes(), ids=str)
def test_every_dtype_crosses_bit_for_bit(dtype):
    x = torch.randn(3, 5).to(dtype) if dtype != torch.bool else torch.rand(3, 5) > 0.5
    value = (x, [x[0], torch.tensor(2.5)], 7, None, "s", x.t())
    shared = arena()
    try:
        tree = shared.pack(value, "out")
        back = shared.unpack(tree)
        assert isinstance(back, tuple) and isinstance(back[1], list) and back[2:5] == (7, None, "s")
        for a, b in ((x, back[0]), (x[0], back[1][0]), (x.t().contiguous(), back[5])):  # strided: by value
            assert a.dtype == b.dtype and a.shape == b.shape
            assert torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))
    finally:
        shared.close()


def test_unpacked_values_are_copies_that_later_writes_do_not_change():
    a = arena()
    tree = a.pack(torch.ones(16), "out")
    snapshot = a.unpack(tree)
    a.pack(torch.zeros(16), "out")  # the runner overwrites its arena after the parent copied
    assert torch.equal(snapshot, torch.ones(16))
    a.close()


def test_views_see_the_shared_memory_itself():
    a = arena(4096, 0)
    tree = a.pack([torch.arange(8, dtype=torch.float32)], "slot0")
    view = a.unpack(tree, copy=False)[0]
    a.write_region("slot0", torch.full((8,), 3.0).numpy().tobytes())
    assert torch.equal(view, torch.full((8,), 3.0))
    a.close()


def test_regions_lie_stage_slots_out_and_trees_move_between_them():
    """The layout: stage, K slots, out; `place` says where a staged tree lands in a slot (as `copy_from`
    copies it), a region copy keeps what the out region held when it was taken."""
    layout = ArenaLayout.of(1000, 3000, slots=3, stage_bytes=1000)
    assert [layout.region(r) for r in ("stage", "slot0", "slot2", "out")] == [
        (0, 1024), (1024, 2048), (3072, 4096), (4096, 7168)]
    with pytest.raises(ValueError):
        layout.region("slot3")
    ref, cand = Arena.create(layout), Arena.create(ArenaLayout.of(1000, 3000, slots=3))
    try:
        x, y = torch.randn(10), torch.arange(6, dtype=torch.int64)
        staged = ref.pack([x, y], "stage")
        placed = cand.place(staged, "slot1")[0]
        moved, used = cand.copy_from(ref, staged, "slot1")
        assert moved == placed and used == 2 * 256
        got = cand.unpack(moved)
        assert torch.equal(got[0], x) and torch.equal(got[1], y)
        out = cand.pack(x * 2, "out")
        snap = RegionCopy(cand, device="cpu")
        snap.take(cand)
        cand.pack(torch.zeros(10), "out")  # written after the snapshot: not seen through it
        assert torch.equal(snap.unpack(out), x * 2)
        with pytest.raises(UnsupportedValue):
            snap.unpack(staged)  # a tree outside the copied region
    finally:
        ref.close()
        cand.close()


def test_changed_inputs_compares_bytes_across_arenas():
    """The trial's input check: an input the candidate changed in place is named, and only counts when the
    reference leaves it unchanged; a missing input counts as changed; NaN payloads compare bit for bit."""
    given_x, given_y = torch.randn(4, 4), torch.tensor([float("nan"), 1.0])
    ref, cand = arena(4096, 4096), arena(4096, 4096)
    try:
        given = ref.pack([given_x, given_y], "slot0")
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
    a = arena(4096, 4096)
    seals = fcntl.fcntl(a.fd, fcntl.F_GET_SEALS)
    assert seals & fcntl.F_SEAL_SHRINK and seals & fcntl.F_SEAL_GROW
    with pytest.raises(PermissionError):
        os.ftruncate(a.fd, 0)  # a runner that shrank it would crash the parent with SIGBUS
    with pytest.raises(ValueError):
        Arena.attach(os.dup(a.fd), ArenaLayout.of(0, 64))  # a layout that is not the file's size
    a.close()


def test_outputs_larger_than_the_region_are_refused():
    a = arena(0, 1024)
    with pytest.raises(ArenaFull):
        a.pack(torch.zeros(1024), "out")
    a.close()


@pytest.mark.parametrize("tree", [
    {"t": "tensor", "offset": 10**9, "nbytes": 4, "dtype": "float32", "shape": [1]},
    {"t": "tensor", "offset": 0, "nbytes": 8, "dtype": "float32", "shape": [1]},
    {"t": "tensor", "offset": 0, "nbytes": 4, "dtype": "os.system", "shape": [1]},
    {"t": "tensor", "offset": 0, "nbytes": 4, "dtype": "float32", "shape": [-1, -4]},
    "not a dict",
])
def test_descriptors_that_do_not_fit_the_arena_are_refused(tree):
    a = arena(0, 1024)
    with pytest.raises(UnsupportedValue):
        a.unpack({"t": "seq", "type": "tuple", "items": [tree]})
    a.close()


def test_values_json_cannot_carry_are_opaque_and_compare_by_repr():
    a = arena(0, 1024)
    back = a.unpack(a.pack(object, "out"))
    assert isinstance(back, OpaqueValue) and back == OpaqueValue("type", repr(object))
    a.close()


def test_describe_value_sizes_what_pack_writes():
    value = [torch.zeros(100), (torch.zeros(3, dtype=torch.float64), 2)]
    a = arena(0, 8192)
    assert tree_nbytes(describe_value(value)) == tree_nbytes(a.pack(value, "out"))
    a.close()


def test_an_output_computed_into_the_out_region_is_committed_by_a_real_copy():
    """A model that writes its output straight into the region its runner commits outputs to (found through the
    harness's objects) would make the commit a copy onto itself, which PyTorch skips: the commit moves such an
    output out first, so it costs a real copy, and a partly overlapping one is committed intact."""
    a = arena(out=8192)
    start, _ = a.region("out")
    region = a.bytes_tensor()[start:start + 4096].view(torch.float32)
    region[:512].copy_(torch.arange(512, dtype=torch.float32))
    copies = []
    original_clone = torch.Tensor.clone

    def counting_clone(self, *args, **kwargs):
        copies.append(self.data_ptr())
        return original_clone(self, *args, **kwargs)

    torch.Tensor.clone = counting_clone
    try:
        aliased = region[:512]  # exactly where the commit writes
        first = a.unpack(a.pack(aliased, "out"))
        shifted = region[256:768]  # overlapping the destination, shifted by 1 KB
        shifted.copy_(torch.arange(512, dtype=torch.float32) + 1000)
        expected = original_clone(shifted)
        tree2 = a.pack(shifted, "out")
    finally:
        torch.Tensor.clone = original_clone
    assert len(copies) == 2
    assert torch.equal(first, torch.arange(512, dtype=torch.float32))
    assert torch.equal(a.unpack(tree2), expected)
    private = torch.ones(512)
    a.pack(private, "out")  # an output of its own memory: no extra copy
    assert len(copies) == 2


@pytest.mark.parametrize("sync", [True, False], ids=["sync", "queued"])
def test_packing_keeps_no_tensor_alive_once_it_returns(sync):
    # A runner packs each call's inputs and outputs: with the cycle collector between its runs (or off, as
    # inside a bracket), any tensor a packing kept was a call's worth of memory lost. On an H100, 2 GiB
    # tensors kept this way ran a reference's runner out of its 35.6 GiB.
    import gc

    from torch.multiprocessing.reductions import StorageWeakRef

    shared = arena(slot=1 << 14, out=1 << 14, stage=1 << 14)
    gc.disable()
    try:
        x, y = torch.randn(1000), torch.randn(10)
        alive = [StorageWeakRef(t.untyped_storage()) for t in (x, y)]
        shared.pack([[x, (y, 3)]], "stage", sync=sync)
        shared.pack([x], "out", sync=sync)
        del x, y
        assert [ref.expired() for ref in alive] == [True, True]
    finally:
        gc.enable()
        shared.close()
