"""How the trusted parent and its runners talk: messages over a socket, tensors through shared memory.

- `Channel`: one AF_UNIX SOCK_SEQPACKET socket per runner (message boundaries kept, file descriptors can
  travel with a message). Messages are JSON objects; the parent waits for a reply with a deadline and a
  periodic `tick` (the memory watchdog), so a runner that never answers costs its deadline and no more.
- `Arena`: a memfd mapped by the parent and one runner, sealed against resizing (a runner that could shrink
  it would crash the parent with SIGBUS). Runners write their inputs and outputs into it as raw bytes with
  a small descriptor tree; the parent reads them back as *copies* (`unpack(..., copy=True)`), so nothing the
  runner writes afterwards changes what the parent compares. Each runner has arenas of its own: the
  candidate's runner never maps the reference's.
- On a GPU, where the driver allows, arenas are device memory instead (`device_arena.DeviceArena`, the same
  layout): the helper creates them and alone maps both models', so outputs are committed and compared without
  crossing to the host; the parent then only moves descriptors.

Covered: any dtype (raw bytes, fp8 and complex included), nested tuple/list outputs, non-tensor values that
JSON can carry. Not covered: sparse, quantized and nested tensors (reported as unsupported outputs).
"""

from __future__ import annotations

import array
import fcntl
import json
import mmap
import os
import select
import socket
import time
from collections.abc import Callable, Sequence
from typing import Any

from cudal1.eval.cudart import clear_last_error

#: Largest message (bytes of JSON). Compiler logs and kernel lists are trimmed well below this.
MAX_MESSAGE_BYTES = 4 * 2**20
#: Byte alignment of tensors in an arena (any dtype can be viewed at such an offset).
ALIGN = 256
#: How often a waiting parent runs its `tick` (watchdog) while no reply has come.
TICK_S = 0.05


class ChannelClosed(Exception):
    """The other side is gone (the runner exited or was killed)."""


class ChannelTimeout(Exception):
    """No reply within the deadline."""


class ProtocolError(Exception):
    """A message that is not what the protocol allows (too large, not JSON, not an object)."""


def socket_pair() -> tuple[socket.socket, socket.socket]:
    """(parent end, child end); the child end is inheritable, to be passed to the runner."""
    parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    for s in (parent, child):
        s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, MAX_MESSAGE_BYTES)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, MAX_MESSAGE_BYTES)
    child.set_inheritable(True)
    return parent, child


class Channel:
    """Framed JSON messages (and optional file descriptors) over a SOCK_SEQPACKET socket."""

    def __init__(self, sock: socket.socket):
        self.sock = sock

    def send(self, message: dict[str, Any], fds: Sequence[int] = ()) -> None:
        data = json.dumps(message, separators=(",", ":"), default=str).encode()
        if len(data) > MAX_MESSAGE_BYTES:
            raise ProtocolError(f"message of {len(data)} bytes exceeds {MAX_MESSAGE_BYTES}")
        try:
            if fds:
                self.sock.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])
            else:
                self.sock.sendall(data)
        except (BrokenPipeError, ConnectionResetError, OSError) as exc:
            raise ChannelClosed(str(exc)) from None

    def recv(self, timeout_s: float | None = None, tick: Callable[[], None] | None = None,
             max_fds: int = 0) -> tuple[dict[str, Any], list[int]]:
        """The next message (and the file descriptors sent with it). Waits at most `timeout_s` (None:
        forever), calling `tick()` every `TICK_S` meanwhile; raises ChannelTimeout, ChannelClosed or
        ProtocolError."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            wait = TICK_S if tick is not None else None
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise ChannelTimeout(f"no reply within {timeout_s:.1f} s")
                wait = min(wait, left) if wait is not None else left
            ready, _, _ = select.select([self.sock], [], [], wait)
            if ready:
                break
            if tick is not None:
                tick()
        fd_bytes = socket.CMSG_SPACE(max_fds * array.array("i").itemsize) if max_fds else 0
        try:
            data, ancdata, flags, _ = self.sock.recvmsg(MAX_MESSAGE_BYTES + 1, fd_bytes)
        except (ConnectionResetError, OSError) as exc:
            raise ChannelClosed(str(exc)) from None
        fds = _received_fds(ancdata)
        if not data:
            for fd in fds:
                os.close(fd)
            raise ChannelClosed("the other side closed the channel")
        if len(data) > MAX_MESSAGE_BYTES or flags & socket.MSG_TRUNC:
            raise ProtocolError("message too large")
        try:
            message = json.loads(data)
        except ValueError:
            raise ProtocolError("message is not JSON") from None
        if not isinstance(message, dict):
            raise ProtocolError("message is not a JSON object")
        return message, fds

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


def _received_fds(ancdata: list[tuple[int, int, bytes]]) -> list[int]:
    fds: list[int] = []
    for level, kind, data in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            arr = array.array("i")
            arr.frombytes(data[: len(data) - (len(data) % arr.itemsize)])
            fds.extend(arr)
    return fds


# --------------------------------------------------------------------------- shared memory


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


class TensorArena:
    """`in` and `out` halves of one byte range that two processes share, each packed front to back; the
    range is a torch uint8 tensor (`bytes_tensor()`): host memory (`Arena`) or device memory
    (`device_arena.DeviceArena`). Packing, unpacking and copying work alike on either."""

    registered = False  # host memory pinned for the GPU: copies to and from it may be asynchronous

    def __init__(self, in_bytes: int, out_bytes: int):
        self.in_bytes, self.out_bytes = in_bytes, out_bytes
        self.size = in_bytes + out_bytes

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

    def spec(self) -> dict[str, int]:
        return {"in_bytes": self.in_bytes, "out_bytes": self.out_bytes}

    def _sync_after_copies(self) -> None:
        """Wait for the copies into or out of this range (device memory, or pinned host memory)."""
        if self.registered:
            import torch

            torch.cuda.synchronize()

    def close(self) -> None:
        pass

    def region(self, name: str) -> tuple[int, int]:
        return (0, self.in_bytes) if name == "in" else (self.in_bytes, self.size)

    def pack(self, value: Any, region: str, *, strict_types: bool = True) -> dict[str, Any]:
        """Write every tensor of `value` (nested tuples/lists allowed) into `region`; the descriptor tree.

        Raises `ArenaFull` when the tensors do not fit and `UnsupportedValue` for what cannot travel."""
        import torch

        start, end = self.region(region)
        cursor = [start]
        copies: list[tuple[Any, Any]] = []

        def put(x: Any) -> dict[str, Any]:
            if isinstance(x, torch.Tensor):
                if x.layout != torch.strided or x.is_quantized or getattr(x, "is_nested", False):
                    raise UnsupportedValue(f"a {x.layout} tensor cannot be compared")
                x = x.detach()
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
                return {"t": "seq", "type": name, "items": [put(i) for i in x]}
            if x is None or isinstance(x, (bool, int, float, str)):
                return {"t": "value", "v": x}
            return {"t": "opaque", "type": type(x).__name__, "repr": repr(x)[:200]}

        tree = put(value)
        for dst, src in copies:
            dst.copy_(src, non_blocking=self.registered)
        if copies:
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

    def copy_from(self, source: TensorArena, tree: dict[str, Any], region: str, offset: int = 0) -> tuple[dict[str, Any], int]:
        """Copy the tensors of `tree` (laid out in `source`) into `region` of this arena from `offset` on, byte
        for byte; (the tree as it lies here, the next free offset in the region)."""
        start, end = self.region(region)
        cursor = [start + offset]

        def move(d: Any) -> Any:
            if not isinstance(d, dict):
                raise UnsupportedValue("malformed descriptor")
            if d.get("t") == "tensor":
                data = source.bytes_of(d)
                dst, nbytes = cursor[0], data.numel()
                if dst + nbytes > end:
                    raise ArenaFull(nbytes)
                if nbytes:
                    self.bytes_tensor()[dst: dst + nbytes].copy_(data)
                cursor[0] = dst + _align(nbytes)
                return {**d, "offset": dst}
            if d.get("t") == "seq":
                return {**d, "items": [move(i) for i in d.get("items", [])]}
            return dict(d)

        moved = move(tree)
        self._sync_after_copies()
        return moved, cursor[0] - start


class Arena(TensorArena):
    """A sealed memfd mapped by the parent and one runner (sealed against resizing: a runner that could shrink
    it would crash the parent with SIGBUS)."""

    def __init__(self, fd: int, in_bytes: int, out_bytes: int, owner: bool):
        super().__init__(in_bytes, out_bytes)
        self.fd, self.owner = fd, owner
        self.map = mmap.mmap(fd, self.size) if self.size else None
        self._host: Any = None  # torch uint8 view of the whole map, made on first use
        self._pinned_ptr: int | None = None

    @classmethod
    def create(cls, in_bytes: int, out_bytes: int) -> Arena:
        """A new memfd of `in_bytes + out_bytes` (aligned), sealed against growing and shrinking."""
        in_bytes, out_bytes = _align(max(in_bytes, 0)), _align(max(out_bytes, 0))
        fd = os.memfd_create("cudal1-arena", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        os.ftruncate(fd, in_bytes + out_bytes)
        fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL)
        return cls(fd, in_bytes, out_bytes, owner=True)

    @classmethod
    def attach(cls, fd: int, in_bytes: int) -> Arena:
        """The runner's side: map a received memfd (its size is read from the file, never trusted)."""
        size = os.fstat(fd).st_size
        in_bytes = min(max(int(in_bytes), 0), size)
        return cls(fd, in_bytes, size - in_bytes, owner=False)

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

    def read_region(self, region: str) -> bytes:
        """A private copy of a whole region's bytes."""
        start, end = self.region(region)
        return bytes(self.map[start:end]) if self.map is not None else b""

    def write_region(self, region: str, data: bytes) -> None:
        """Overwrite a region from the front with `data` (the parent filling a runner's `in` half)."""
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
