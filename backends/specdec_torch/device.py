"""Which device a torch target runs on by default, and how a device is described where a
measured speed is cached (``specdec.tuning``)."""

from __future__ import annotations

import torch

from specdec.tuning.dtype import cpu_description

__all__ = ["default_device", "describe_device"]


def default_device() -> torch.device:
    """cuda when available, else mps when available, else cpu."""
    if torch.cuda.is_available():
        return torch.device("cuda")
    mps = getattr(torch.backends, "mps", None)
    if mps is not None and mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


def describe_device(device: str | None = None) -> str:
    """What a measured speed depends on: the device (GPU name, or CPU model, flags and thread
    count) and the torch version."""
    resolved = torch.device(device) if device is not None else default_device()
    if resolved.type == "cuda":
        where = f"cuda {torch.cuda.get_device_name(resolved)}"
    elif resolved.type == "mps":
        where = f"mps {cpu_description()}"
    else:
        where = f"cpu {cpu_description()}, {torch.get_num_threads()} threads"
    return f"{where}, torch {torch.__version__}"
