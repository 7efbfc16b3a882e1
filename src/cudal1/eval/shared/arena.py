"""Arenas: shared memory for tensors, laid out in regions, and the descriptor trees that say what lies where.

An arena is one byte range that the parent and one runner share (the device helper too, on a GPU): a sealed
memfd in host memory (`Arena`: sealed against resizing, since a runner that could shrink it would crash the
parent with SIGBUS) or a shared device allocation (`device_arena.DeviceArena`). Its layout (`ArenaLayout`):

- `stage`: the reference's runner makes each call's inputs here (the reference's arena only);
- `slot0` .. `slotK-1`: the inputs of one call lie in a slot the parent picks at random; the model is called
  on views of them, so a call's inputs appear only when the trusted side copies them in, at a new address
  now and then (caching keyed on pointers has nothing to hold on to), and stay where they can be checked;
- `out`: the runner commits a call's outputs here.

Values are packed front to back as raw bytes with a small descriptor tree (`pack`); the parent reads them
back as copies (`unpack(..., copy=True)`), so nothing a runner writes afterwards changes what was compared.
Covered: any dtype (raw bytes, fp8 and complex included), nested tuple/list outputs, non-tensor values that
JSON can carry. Not covered: sparse, quantized and nested tensors (reported as unsupported outputs).
"""

from __future__ import annotations

import fcntl
import mmap
import os
from dataclasses import dataclass
from typing import Any

from cudal1.eval.shared.cudart import clear_last_error

#: Byte alignment of tensors in an arena (any dtype can be viewed at such an offset).
ALIGN = 256


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


@dataclass(frozen=True)
class ArenaLayout:
    """Sizes of an arena's regions (module docstring), each aligned."""

    slot_bytes: int
    out_bytes: int
    slots: int = 1
    stage_bytes: int = 0

    def __post_init__(self) -> None:
        if min(self.slot_bytes, self.out_bytes, self.stage_bytes) < 0 or self.slots < 1:
            raise ValueError("an arena layout needs sizes >= 0 and at least one slot")

    @classmethod
    def of(cls, slot_bytes: int, out_bytes: int, slots: int = 1, stage_bytes: int = 0) -> ArenaLayout:
        return cls(_align(slot_bytes), _align(out_bytes), slots, _align(stage_bytes))

    @property
    def size(self) -> int:
        return self.stage_bytes + self.slots * self.slot_bytes + self.out_bytes

    def region(self, name: str) -> tuple[int, int]:
        """(start, end) of region `name`: stage, slotN or out."""
        if name == "stage":
            return 0, self.stage_bytes
        if name == "out":
            start = self.stage_bytes + self.slots * self.slot_bytes
            return start, start + self.out_bytes
        if name.startswith("slot") and name[4:].isdigit() and int(name[4:]) < self.slots:
            start = self.stage_bytes + int(name[4:]) * self.slot_bytes
            return start, start + self.slot_bytes
        raise ValueError(f"no region {name!r} in this arena")

    def to_dict(self) -> dict[str, int]:
        return {"slot_bytes": self.slot_bytes, "out_bytes": self.out_bytes, "slots": self.slots,
                "stage_bytes": self.stage_bytes}

    @classmethod
    def from_dict(cls, d: dict[str, int]) -> ArenaLayout:
        return cls(int(d["slot_bytes"]), int(d["out_bytes"]), int(d.get("slots", 1)), int(d.get("stage_bytes", 0)))

def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


class TensorArena:
    """The regions of one byte range that two processes share (module docstring), each packed front to back;
    the range is a torch uint8 tensor (`bytes_tensor()`): host memory (`Arena`) or device memory
    (`device_arena.DeviceArena`). Packing, unpacking and copying work alike on either."""

    registered = False  # host memory pinned for the GPU: copies to and from it may be asynchronous

    def __init__(self, layout: ArenaLayout, size: int | None = None):
        self.layout = layout
        self.size = layout.size if size is None else size

    def bytes_tensor(self) -> Any:
        """The whole range as a torch uint8 tensor (no copy)."""
        raise NotImplementedError

    def bytes_of(self, d: dict[str, Any]) -> Any:
        """The bytes of a tensor descriptor as a view of this range; `UnsupportedValue` for one outside it."""
        offset, nbytes = int(d.get("offset", -1)), int(d.get("nbytes", -1))
        if offset < 0 or nbytes < 0 or offset + nbytes > self.size:
            raise UnsupportedValue("a tensor descriptor that does not fit its arena")
        return self.bytes_tensor()[offset: offset + nbytes]

    def register_with_cuda(self) -> bool:
        return self.registered

    def _sync_after_copies(self) -> None:
        """Wait for the copies into or out of this range (device memory, or pinned host memory)."""
        if self.registered:
            import torch

            torch.cuda.synchronize()

    def close(self) -> None:
        pass

    def region(self, name: str) -> tuple[int, int]:
        return self.layout.region(name)

    def pack(self, value: Any, region: str, *, strict_types: bool = True, sync: bool = True) -> dict[str, Any]:
        """Write every tensor of `value` (nested tuples/lists allowed) into `region`; the descriptor tree.
        Without `sync`, copies on a device are left queued on the current stream (a gated call's commit).

        Raises `ArenaFull` when the tensors do not fit and `UnsupportedValue` for what cannot travel."""
        import torch

        start, end = self.region(region)
        cursor = [start]
        copies: list[tuple[Any, Any]] = []
        base = self.bytes_tensor()
        lo, hi = base.data_ptr() + start, base.data_ptr() + end

        # `copies` is an argument, not a variable `put` closes over: `put` calls itself, so its closure is a
        # reference cycle, freed only when Python's cycle collector runs; holding the source tensors it kept
        # each call's inputs and outputs alive for about 15 calls (34 GiB of a 2 GiB task filled a runner's
        # share of an H100).
        def put(x: Any, copies: list[tuple[Any, Any]]) -> dict[str, Any]:
            if isinstance(x, torch.Tensor):
                if x.layout != torch.strided or x.is_quantized or getattr(x, "is_nested", False):
                    raise UnsupportedValue(f"a {x.layout} tensor cannot be compared")
                x = x.detach()
                if x.device == base.device and _overlaps(x, lo, hi):
                    # An output computed straight into the region it is committed to would make the commit a
                    # no-op (a copy onto itself is skipped), harness time the calibration charges to every
                    # call: such an output is moved out first, so its commit costs at least a real copy.
                    x = x.clone()
                nbytes = x.numel() * x.element_size()
                offset = cursor[0]
                if offset + nbytes > end:
                    raise ArenaFull(nbytes)
                cursor[0] = offset + _align(nbytes)
                if nbytes:
                    # One copy into the arena whatever the layout (`contiguous()` first would add a second one
                    # for strided outputs, harness time outside the candidate's span that the reference's
                    # output may not cost).
                    dst = self.bytes_tensor()[offset: offset + nbytes].view(x.dtype).view(x.shape)
                    copies.append((dst, x))
                return {"t": "tensor", "offset": offset, "nbytes": nbytes, "dtype": str(x.dtype).removeprefix("torch."),
                        "shape": list(x.shape), "device": x.device.type, "cls": type(x).__name__}
            if isinstance(x, (tuple, list)):
                kind = type(x)
                name = "tuple" if kind is tuple else "list" if kind is list else (
                    "return_types" if kind.__module__ == "torch.return_types" else kind.__name__)
                return {"t": "seq", "type": name, "items": [put(i, copies) for i in x]}
            if x is None or isinstance(x, (bool, int, float, str)):
                return {"t": "value", "v": x}
            return {"t": "opaque", "type": type(x).__name__, "repr": repr(x)[:200]}

        tree = put(value, copies)
        for dst, src in copies:
            dst.copy_(src, non_blocking=self.registered)
        if copies and sync:
            self._sync_after_copies()
        return tree

    def unpack(self, tree: dict[str, Any], *, device: Any = "cpu", copy: bool = True) -> Any:
        """The value of a descriptor tree, tensors read from this arena onto `device`: copies (the parent's
        snapshots), or with `copy=False` views of the shared memory itself where it lies on `device` (a CPU
        runner's inputs that the parent writes just before the call; the helper comparing outputs in device
        arenas). Raises `UnsupportedValue` for a descriptor outside the arena."""
        import torch

        host = self.bytes_tensor()
        views = not copy and host.device.type == torch.device(device).type

        def get(d: Any) -> Any:
            if not isinstance(d, dict):
                raise UnsupportedValue("malformed descriptor")
            kind = d.get("t")
            if kind == "tensor":
                dtype = parse_dtype(str(d.get("dtype")))
                shape = [int(s) for s in d.get("shape", [])]
                data = self.bytes_of(d)
                numel = 1
                for s in shape:
                    numel *= s
                itemsize = torch.empty(0, dtype=dtype).element_size()
                if numel * itemsize != data.numel() or any(s < 0 for s in shape):
                    raise UnsupportedValue("a tensor descriptor that does not fit its arena")
                if views:
                    return data.view(dtype).reshape(shape) if data.numel() else \
                        torch.empty(shape, dtype=dtype, device=host.device)
                out = torch.empty(shape, dtype=dtype, device=device)
                if data.numel():
                    out.reshape(-1).view(torch.uint8).copy_(data, non_blocking=self.registered)
                return out
            if kind == "seq":
                items = [get(i) for i in d.get("items", [])]
                return items if d.get("type") == "list" else tuple(items)
            if kind == "value":
                return d.get("v")
            return OpaqueValue(str(d.get("type")), str(d.get("repr", "")))

        value = get(tree)
        if not views:
            self._sync_after_copies()
        return value

    def place(self, tree: dict[str, Any], region: str, offset: int = 0) -> tuple[dict[str, Any], int]:
        """Where the tensors of `tree` go when copied into `region` of this arena from `offset` on, front to
        back: (the tree as it will lie here, the next free offset in the region). Nothing is copied."""
        start, end = self.region(region)
        cursor = [start + offset]

        def move(d: Any) -> Any:
            if not isinstance(d, dict):
                raise UnsupportedValue("malformed descriptor")
            if d.get("t") == "tensor":
                dst, nbytes = cursor[0], int(d.get("nbytes", -1))
                if nbytes < 0:
                    raise UnsupportedValue("malformed descriptor")
                if dst + nbytes > end:
                    raise ArenaFull(nbytes)
                cursor[0] = dst + _align(nbytes)
                return {**d, "offset": dst}
            if d.get("t") == "seq":
                return {**d, "items": [move(i) for i in d.get("items", [])]}
            return dict(d)

        placed = move(tree)
        return placed, cursor[0] - start

    def copy_from(self, source: TensorArena, tree: dict[str, Any], region: str, offset: int = 0, *,
                  sync: bool = True) -> tuple[dict[str, Any], int]:
        """Copy the tensors of `tree` (laid out in `source`) into `region` of this arena from `offset` on, byte
        for byte, as `place` lays them out; (the tree as it lies here, the next free offset in the region).
        Without `sync`, copies on a device are left queued on the current stream."""
        placed, used = self.place(tree, region, offset)
        for src, dst in zip(tree_tensors(tree), tree_tensors(placed), strict=True):
            data = source.bytes_of(src)
            if data.numel():
                self.bytes_tensor()[dst["offset"]: dst["offset"] + data.numel()].copy_(data, non_blocking=True)
        if sync:
            self._sync_after_copies()
        return placed, used


class Arena(TensorArena):
    """A sealed memfd mapped by the parent and one runner (module docstring)."""

    def __init__(self, fd: int, layout: ArenaLayout, owner: bool):
        super().__init__(layout)
        self.fd, self.owner = fd, owner
        self.map = mmap.mmap(fd, self.size) if self.size else None
        self._host: Any = None  # torch uint8 view of the whole map, made on first use
        self._pinned_ptr: int | None = None

    @classmethod
    def create(cls, layout: ArenaLayout) -> Arena:
        """A new memfd of the layout's size, sealed against growing and shrinking."""
        fd = os.memfd_create("cudal1-arena", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        os.ftruncate(fd, layout.size)
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
        return cls(fd, layout, owner=True)

    @classmethod
    def attach(cls, fd: int, layout: ArenaLayout) -> Arena:
        """The runner's side: map a received memfd; its size is read from the file, never trusted."""
        if os.fstat(fd).st_size != layout.size:
            raise ValueError("an arena whose size is not its layout's")
        return cls(fd, layout, owner=False)

    def bytes_tensor(self) -> Any:
        """A torch uint8 tensor over the whole mapping (the runner's staging buffer)."""
        import torch

        if self._host is None:
            self._host = torch.frombuffer(self.map, dtype=torch.uint8) if self.size else torch.empty(0, dtype=torch.uint8)
        return self._host

    def register_with_cuda(self) -> bool:
        """Pin the mapping for the GPU (fast, asynchronous copies); False when CUDA refuses."""
        import torch

        if self.registered or not self.size or not torch.cuda.is_available():
            return self.registered

        ptr = self.bytes_tensor().data_ptr()
        try:
            self.registered = int(torch.cuda.cudart().cudaHostRegister(ptr, self.size, 0)) == 0
        except Exception:  # noqa: BLE001 - pageable copies still work, only slower
            self.registered = False
        if self.registered:
            self._pinned_ptr = ptr
        else:
            clear_last_error()
        return self.registered

    def _unregister(self) -> None:
        """Unpin before unmapping: a range left registered makes a later mapping at the same address fail
        to register (and the failure surfaces in an unrelated kernel launch)."""
        if self._pinned_ptr is None:
            return
        import torch


        if int(torch.cuda.cudart().cudaHostUnregister(self._pinned_ptr)) != 0:
            clear_last_error()
        self._pinned_ptr, self.registered = None, False

    def copy_from(self, source: TensorArena, tree: dict[str, Any], region: str, offset: int = 0, *,
                  sync: bool = True) -> tuple[dict[str, Any], int]:
        """As `TensorArena.copy_from`; between host arenas by memmove (no thread pool inside a bracket)."""
        if self.map is None or source.bytes_tensor().device.type != "cpu":
            return super().copy_from(source, tree, region, offset, sync=sync)
        placed, used = self.place(tree, region, offset)
        for src, dst in zip(tree_tensors(tree), tree_tensors(placed), strict=True):
            data = source.bytes_of(src)
            n = data.numel()
            if n:
                self.map[dst["offset"]: dst["offset"] + n] = memoryview(data.numpy())
        return placed, used

    def read_region(self, region: str) -> bytes:
        """A private copy of a whole region's bytes."""
        start, end = self.region(region)
        return bytes(self.map[start:end]) if self.map is not None else b""

    def write_region(self, region: str, data: bytes) -> None:
        """Overwrite a region from the front with `data` (the parent filling a runner's input slot)."""
        start, end = self.region(region)
        if start + len(data) > end:
            raise ArenaFull(len(data))
        if data:
            self.map[start: start + len(data)] = data

    def close(self) -> None:
        self._unregister()
        self._host = None
        if self.map is not None:
            try:
                self.map.close()
            except BufferError:  # a view is still alive: the mapping goes with the process
                pass
        try:
            os.close(self.fd)
        except OSError:
            pass


class ArenaFull(Exception):
    """The values do not fit the region (an output larger than the reference's)."""

    kind = "arena_full"

    def __init__(self, nbytes: int):
        super().__init__(f"returned more output data than the reference ({nbytes} bytes more than fit)")
        self.nbytes = nbytes


class UnsupportedValue(Exception):
    """A value that cannot cross the process boundary (or a malformed descriptor)."""

    kind = "unsupported_output"


class OpaqueValue:
    """A non-tensor, non-JSON output, known only by its type and repr (equal when both are)."""

    def __init__(self, type_name: str, text: str):
        self.type_name, self.text = type_name, text

    def __eq__(self, other: object) -> bool:
        return isinstance(other, OpaqueValue) and (self.type_name, self.text) == (other.type_name, other.text)

    def __hash__(self) -> int:
        return hash((self.type_name, self.text))

    def __repr__(self) -> str:
        return f"<{self.type_name} {self.text}>"


def _overlaps(x: Any, lo: int, hi: int) -> bool:
    """Whether tensor `x`'s storage touches the address range [lo, hi)."""
    storage = x.untyped_storage()
    first = storage.data_ptr()
    return storage.nbytes() > 0 and first < hi and lo < first + storage.nbytes()


def parse_dtype(name: str) -> Any:
    import torch

    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise UnsupportedValue(f"unknown dtype {name!r}")
    return dtype


def tree_leaves(arena: TensorArena, tree: Any) -> list[Any]:
    """The leaves of a descriptor tree laid out in `arena`: tensors as (dtype, shape, uint8 view of their
    bytes), other values as they are. Raises `UnsupportedValue` for a descriptor outside the arena."""
    if not isinstance(tree, dict):
        raise UnsupportedValue("malformed descriptor")
    if tree.get("t") == "tensor":
        return [(str(tree.get("dtype")), tuple(tree.get("shape", [])), arena.bytes_of(tree))]
    if tree.get("t") == "seq":
        return [leaf for item in tree.get("items", []) for leaf in tree_leaves(arena, item)]
    return [tree.get("v", tree.get("repr"))]


def _same_leaf(a: Any, b: Any) -> bool:
    import torch

    if isinstance(a, tuple) and isinstance(b, tuple) and len(a) == len(b) == 3 and isinstance(a[2], torch.Tensor):
        return a[:2] == b[:2] and isinstance(b[2], torch.Tensor) and torch.equal(a[2], b[2])
    return a == b


def changed_inputs(given: tuple[TensorArena, Any], ref_after: tuple[TensorArena, Any],
                   cand_after: tuple[TensorArena, Any]) -> tuple[list[int], bool]:
    """(indices of the inputs the candidate's call left different from `given`, byte for byte; whether the
    reference's call left all of them unchanged). Each argument is an (arena, descriptor tree) pair."""
    inputs, ref_leaves, cand_leaves = (tree_leaves(a, t) for a, t in (given, ref_after, cand_after))
    changed = [i for i, (a, b) in enumerate(zip(inputs, cand_leaves, strict=False)) if not _same_leaf(a, b)]
    changed += list(range(len(cand_leaves), len(inputs)))
    ref_same = len(ref_leaves) == len(inputs) and all(_same_leaf(a, b) for a, b in zip(inputs, ref_leaves, strict=True))
    return changed, ref_same


def tree_tensors(tree: Any) -> list[dict[str, Any]]:
    """The tensor descriptors of a tree, in order."""
    if not isinstance(tree, dict):
        raise UnsupportedValue("malformed descriptor")
    if tree.get("t") == "tensor":
        return [tree]
    if tree.get("t") == "seq":
        return [d for item in tree.get("items", []) for d in tree_tensors(item)]
    return []


class RegionCopy(TensorArena):
    """A copy of one region of an arena (a model's `out` region, taken when its call ended), read with that
    arena's descriptor trees: what was compared is what the region held then."""

    def __init__(self, source: TensorArena, region: str = "out", device: Any = None):
        import torch

        super().__init__(source.layout, size=source.size)
        self.base, end = source.region(region)
        self.registered = source.registered
        self.host = isinstance(source, Arena) and device in (None, "cpu")
        if self.host:  # a host arena's bytes copied by memmove: no thread pool inside a timed bracket
            self._bytes = bytearray(end - self.base)
            self.buffer = torch.frombuffer(self._bytes, dtype=torch.uint8) if self._bytes else \
                torch.empty(0, dtype=torch.uint8)
        else:
            self.buffer = torch.empty(end - self.base, dtype=torch.uint8,
                                      device=device if device is not None else source.bytes_tensor().device)

    def bytes_tensor(self) -> Any:
        return self.buffer

    def bytes_of(self, d: dict[str, Any]) -> Any:
        offset, nbytes = int(d.get("offset", -1)), int(d.get("nbytes", -1))
        if offset < self.base or nbytes < 0 or offset + nbytes > self.base + self.buffer.numel():
            raise UnsupportedValue("an output descriptor outside the output region")
        return self.buffer[offset - self.base: offset - self.base + nbytes]

    def take(self, source: TensorArena, nbytes: int | None = None) -> None:
        """Copy the first `nbytes` (all: None) of the region from `source` (on a device: queued on the
        current stream)."""
        n = self.buffer.numel() if nbytes is None else max(0, min(int(nbytes), self.buffer.numel()))
        if not n:
            return
        if self.host and isinstance(source, Arena) and source.map is not None:
            self._bytes[:n] = source.map[self.base: self.base + n]
        else:
            self.buffer[:n].copy_(source.bytes_tensor()[self.base: self.base + n], non_blocking=True)


def tree_nbytes(tree: dict[str, Any]) -> int:
    """Bytes the tensors of a descriptor tree take, aligned as an arena packs them."""
    if tree.get("t") == "tensor":
        return _align(int(tree.get("nbytes", 0)))
    if tree.get("t") == "seq":
        return sum(tree_nbytes(i) for i in tree.get("items", []))
    return 0


def tree_classes(tree: dict[str, Any]) -> list[str]:
    """Class names of the tensors (and sequence types) in a descriptor tree, outermost first."""
    if tree.get("t") == "tensor":
        return [str(tree.get("cls"))]
    if tree.get("t") == "seq":
        return [str(tree.get("type"))] + [c for i in tree.get("items", []) for c in tree_classes(i)]
    return []


def describe_value(value: Any) -> dict[str, Any]:
    """The descriptor tree of `value` without its data (shapes, dtypes, sizes): what `Arena.pack` would write."""
    import torch

    if isinstance(value, torch.Tensor):
        return {"t": "tensor", "offset": -1, "nbytes": value.numel() * value.element_size(),
                "dtype": str(value.dtype).removeprefix("torch."), "shape": list(value.shape),
                "device": value.device.type, "cls": type(value).__name__}
    if isinstance(value, (tuple, list)):
        kind = type(value)
        name = "tuple" if kind is tuple else "list" if kind is list else kind.__name__
        return {"t": "seq", "type": name, "items": [describe_value(v) for v in value]}
    if value is None or isinstance(value, (bool, int, float, str)):
        return {"t": "value", "v": value}
    return {"t": "opaque", "type": type(value).__name__, "repr": repr(value)[:200]}
