"""One description of the machine a measurement ran on (part of every result and of the store's cache key)."""

from __future__ import annotations

import functools
import platform
from typing import Any


@functools.lru_cache(maxsize=8)
def describe_machine(device: str) -> dict[str, Any]:
    """GPU name and software versions for `device` ('cpu', 'cuda', 'cuda:N'); callers must not mutate it."""
    import torch

    env: dict[str, Any] = {"device_type": device.split(":")[0], "torch_version": torch.__version__,
                           "cuda_version": torch.version.cuda, "python": platform.python_version()}
    if device.startswith("cuda"):
        props = torch.cuda.get_device_properties(torch.device(device))
        env.update(gpu_name=props.name, capability=f"{props.major}.{props.minor}")
    else:
        env["gpu_name"] = "cpu"
    return env
