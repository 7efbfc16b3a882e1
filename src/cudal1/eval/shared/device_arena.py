"""Arenas in device memory: inputs staged and outputs compared on the GPU, by the helper.

With host arenas every call's output crosses to host memory and back (48-130 ms per call for outputs of
hundreds of MB on the H200 host, and seconds per comparison). A `DeviceArena` has the layout of a host arena
(`arena.TensorArena`) over a `cuda_vmm.SharedDeviceBuffer`: the device's trusted helper creates one per runner
and sends each runner the descriptor of its own; the helper maps both, so it stages each call's inputs from
the reference's staging region into the calling model's slot and compares outputs where they lie. The
candidate's runner never holds the reference's descriptor. The parent moves only descriptor trees.

The allocation's last page is not the arena's: it holds the gate and done words of the GPU clock
(`gate.words`), zeroed by the helper when it creates the arena.
"""

from __future__ import annotations

from typing import Any

from cudal1.eval.shared.arena import ArenaLayout, TensorArena
from cudal1.eval.shared.cuda_vmm import SharedDeviceBuffer
from cudal1.eval.shared.gate import GATE_PAGE, words


class DeviceArena(TensorArena):
    """The regions of one shared device allocation (module docstring)."""

    registered = True  # copies into and out of device memory are asynchronous: wait for them

    def __init__(self, buffer: SharedDeviceBuffer, layout: ArenaLayout):
        if layout.size + GATE_PAGE > buffer.size:
            raise ValueError("a device arena smaller than its layout")
        super().__init__(layout, size=buffer.size - GATE_PAGE)
        self.buffer = buffer

    @classmethod
    def create(cls, layout: ArenaLayout) -> DeviceArena:
        """A new allocation for `layout` and the gate page (the helper's side), rounded up to the device's
        granularity; the gate page zeroed."""
        arena = cls(SharedDeviceBuffer.create(layout.size + GATE_PAGE), layout)
        arena.buffer.tensor()[arena.size:].zero_()
        arena._sync_after_copies()
        return arena

    @classmethod
    def attach(cls, fd: int, layout: ArenaLayout, size: int) -> DeviceArena:
        """A runner's side: map a received descriptor (`size` as the helper created it)."""
        return cls(SharedDeviceBuffer.attach(fd, size), layout)

    @property
    def fd(self) -> int | None:
        return self.buffer.fd

    def share(self) -> dict[str, Any]:
        """What a runner needs to attach this arena, besides its descriptor: the allocation's size."""
        return {"size": self.buffer.size}

    def gate_usable(self) -> bool:
        """Whether this process can gate its calls on this arena's page (`gate.usable`)."""
        from cudal1.eval.shared.gate import usable

        return usable(f"cuda:{self.buffer.ordinal}", self.buffer.ptr, self.buffer.size)

    def gate_words(self) -> tuple[int, int]:
        """The device addresses of this arena's gate and done words (`gate.words`)."""
        return words(self.buffer.ptr, self.buffer.size)

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
