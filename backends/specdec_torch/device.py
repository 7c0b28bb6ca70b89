"""Which device a torch target runs on by default, and how a device is described where a
measured speed is cached (``specdec.tuning``)."""

from __future__ import annotations

import torch

from specdec.errors import InvalidInputError
from specdec.slots import machine_memory
from specdec.tuning.machine import cpu_description

__all__ = ["DEVICE_TYPES", "check_device", "default_device", "describe_device", "device_memory"]

DEVICE_TYPES = ("cpu", "cuda", "mps")  # what the torch backend computes on


def check_device(device) -> torch.device:
    """``device`` (a name such as "cuda:1", or a torch.device) as a torch.device after checking
    it is one torch parses and of a type this backend runs on (not "meta", whose tensors hold no
    values)."""
    try:
        resolved = device if isinstance(device, torch.device) else torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        resolved = None
    if resolved is None or resolved.type not in DEVICE_TYPES:
        raise InvalidInputError(
            f"device={device!r} is not a device the torch backend runs on: give one of "
            f"{', '.join(DEVICE_TYPES)} (with an index, e.g. cuda:1), or None for the first "
            "available"
        )
    return resolved


def device_memory(device: torch.device) -> tuple[int | None, str]:
    """(bytes, words) of the memory a KV cache on ``device`` is allocated in: a CUDA device's
    own, else the machine's (None: the system does not say)."""
    if device.type == "cuda" and torch.cuda.is_available():
        index = device.index if device.index is not None else torch.cuda.current_device()
        if index < torch.cuda.device_count():
            return int(torch.cuda.get_device_properties(index).total_memory), f"{device}'s memory"
    return machine_memory(), "this machine's memory"


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
    resolved = check_device(device) if device is not None else default_device()
    if resolved.type == "cuda":
        where = f"cuda {torch.cuda.get_device_name(resolved)}"
    elif resolved.type == "mps":
        where = f"mps {cpu_description()}"
    else:
        threads = torch.get_num_threads()
        where = f"cpu {cpu_description()}, {threads} thread{'' if threads == 1 else 's'}"
    return f"{where}, torch {torch.__version__}"
