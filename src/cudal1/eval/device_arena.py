"""Arenas in device memory: a runner commits its outputs where the helper compares them, on the GPU.

With host arenas every timed call's output crosses to host memory and back (48-130 ms per call for outputs of
hundreds of MB on the H200 host, and seconds per comparison). A `DeviceArena` has the layout of a host arena
(`channel.TensorArena`) over a `cuda_vmm.SharedDeviceBuffer`: the device's trusted helper creates one per
runner and sends each runner the descriptor of its own; the helper maps both, so it copies trial inputs from
the reference's arena into the candidate's and compares outputs where they lie. The candidate's runner never
holds the reference's descriptor. The parent moves only descriptor trees.
"""

from __future__ import annotations

from typing import Any

from cudal1.eval.channel import TensorArena
from cudal1.eval.cuda_vmm import SharedDeviceBuffer


class DeviceArena(TensorArena):
    """`in` and `out` halves of one shared device allocation (module docstring)."""

    registered = True  # copies into and out of device memory are asynchronous: wait for them

    def __init__(self, buffer: SharedDeviceBuffer, in_bytes: int):
        in_bytes = min(max(int(in_bytes), 0), buffer.size)
        super().__init__(in_bytes, buffer.size - in_bytes)
        self.buffer = buffer

    @classmethod
    def create(cls, in_bytes: int, out_bytes: int) -> DeviceArena:
        """A new allocation for `in_bytes` of inputs and `out_bytes` of outputs (the helper's side); the
        `out` half takes the rounding up to the device's granularity."""
        return cls(SharedDeviceBuffer.create(int(in_bytes) + int(out_bytes)), in_bytes)

    @classmethod
    def attach(cls, fd: int, in_bytes: int, size: int) -> DeviceArena:
        """A runner's side: map a received descriptor (`size` as the helper created it)."""
        return cls(SharedDeviceBuffer.attach(fd, size), in_bytes)

    @property
    def fd(self) -> int | None:
        return self.buffer.fd

    def share(self) -> dict[str, Any]:
        """What a runner needs to attach this arena, besides its descriptor."""
        return {"in_bytes": self.in_bytes, "size": self.size, "device": True}

    def bytes_tensor(self) -> Any:
        return self.buffer.tensor()

    def _sync_after_copies(self) -> None:
        import torch

        torch.cuda.synchronize(self.buffer.ordinal)

    def take_descriptor(self) -> int | None:
        """The descriptor to send to the runner (the caller closes it once sent)."""
        return self.buffer.take_descriptor()

    def close(self) -> None:
        self.buffer.close()
