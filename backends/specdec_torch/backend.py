"""``TorchBackend``: loads targets and moves arrays between NumPy and the target's device."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

__all__ = ["TorchBackend"]

_HOST_DTYPES = {torch.bfloat16: torch.float32, torch.float16: torch.float32}


class TorchBackend:
    """The ``torch`` backend (``specdec.protocols.Backend``)."""

    name = "torch"

    def load_target(self, source: Any, *, dtype: str | None = None, device: str | None = None):
        """A ``TorchTarget`` from a local Hugging Face-format folder, a ``transformers`` Llama-family
        model object or a TorchTarget (see ``specdec_torch.loading.load_torch_target``)."""
        from specdec_torch.loading import load_torch_target

        return load_torch_target(source, dtype=dtype, device=device)

    def to_numpy(self, array: Any) -> np.ndarray:
        """A host NumPy copy; bfloat16 and float16 become float32 (exactly)."""
        if isinstance(array, torch.Tensor):
            tensor = array.detach()
            if tensor.dtype in _HOST_DTYPES:
                tensor = tensor.to(_HOST_DTYPES[tensor.dtype])
            return tensor.cpu().numpy()
        return np.asarray(array)

    def from_numpy(self, array: Any, target: Any) -> torch.Tensor:
        """``array`` as a tensor on ``target.device`` (float64 becomes float32 on mps, which lacks it)."""
        host = torch.from_numpy(np.require(np.asarray(array), requirements=["C", "W"]))
        device = getattr(target, "device", torch.device("cpu"))
        if device.type == "mps" and host.dtype == torch.float64:
            host = host.to(torch.float32)
        return host.to(device)
