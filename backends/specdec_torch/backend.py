"""``TorchBackend``: loads targets and moves arrays between NumPy and the target's device."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from specdec.tuning.machine import cpu_flags
from specdec_torch.device import check_device, default_device, describe_device
from specdec_torch.forms import choose_layer_forms
from specdec_torch.loading import load_torch_target
from specdec_torch.threads import fit_threads

__all__ = ["TorchBackend"]

_HOST_DTYPES = {torch.bfloat16: torch.float32, torch.float16: torch.float32}


class TorchBackend:
    """The ``torch`` backend (``specdec.protocols.Backend``)."""

    name = "torch"
    compute_thread = (
        True  # OpenMP keeps a worker team per calling thread: one thread for all (specdec.compute)
    )

    def __init__(self):
        if default_device().type == "cpu":
            fit_threads()  # before any work: threads for the cores other processes leave free

    def load_target(
        self,
        source: Any,
        *,
        dtype: str | None = None,
        device: str | None = None,
        slots: int = 1,
        capacity: int | None = None,
    ):
        """A ``TorchTarget`` from a local Hugging Face-format folder, a ``transformers``
        Llama-family model object or a TorchTarget (see
        ``specdec_torch.loading.load_torch_target``)."""
        target = load_torch_target(
            source, dtype=dtype, device=device, slots=slots, capacity=capacity
        )
        if not target.transposed_rows:  # a target passed in keeps its own
            target.transposed_rows = choose_layer_forms(self, target)
        return target

    def dtype_candidates(self, device: str | None = None) -> tuple[str, ...]:
        """The dtypes worth measuring on ``device`` (``specdec.tuning.dtype``): float32 and bfloat16
        on a CPU (bfloat16 halves the bytes read, but is fast only with bf16 instructions, so it is
        measured, never assumed), float16 too where the CPU has half-precision arithmetic;
        bfloat16 and float16 on CUDA; float16 and float32 on MPS."""
        resolved = check_device(device) if device is not None else default_device()
        if resolved.type == "cuda":
            return ("bfloat16", "float16") if torch.cuda.is_bf16_supported() else ("float16",)
        if resolved.type == "mps":
            return ("float16", "float32")
        candidates = ("float32", "bfloat16")
        if cpu_flags() & {"avx512_fp16", "amx_fp16"}:
            candidates += ("float16",)
        return candidates

    def describe_device(self, device: str | None = None) -> str:
        """What a measured speed depends on (``specdec_torch.device.describe_device``)."""
        return describe_device(device)

    def to_numpy(self, array: Any) -> np.ndarray:
        """A host NumPy copy; bfloat16 and float16 become float32 (exactly)."""
        if isinstance(array, torch.Tensor):
            tensor = array.detach()
            if tensor.dtype in _HOST_DTYPES:
                tensor = tensor.to(_HOST_DTYPES[tensor.dtype])
            return tensor.cpu().numpy()
        return np.asarray(array)

    def from_numpy(self, array: Any, target: Any) -> torch.Tensor:
        """``array`` as a tensor on ``target.device`` (float64 becomes float32 on mps, which lacks
        it)."""
        host = torch.from_numpy(np.require(np.asarray(array), requirements=["C", "W"]))
        device = getattr(target, "device", torch.device("cpu"))
        if device.type == "mps" and host.dtype == torch.float64:
            host = host.to(torch.float32)
        return host.to(device)
