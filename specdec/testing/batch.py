"""A fixed batch on top of a slotted target, for tests that drive a target directly.

``Batch(target, backend).prefill(prompts)`` frees every slot, admits prompt b into slot b and
returns NumPy logits (B, 1, V) and hidden (B, 1, H) at each prompt's last token;
``forward_tree(tree)`` runs row b on slot b; ``commit`` passes through. Everything else is the
target's.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from specdec.types import DraftTree, TargetOutput, Verdict


class Batch:
    def __init__(self, target, backend=None):
        self.target = target
        self.to_numpy = np.asarray if backend is None else backend.to_numpy
        self.size = 0

    def __getattr__(self, name):
        return getattr(self.target, name)

    def prefill(self, prompts: Sequence[Sequence[int]]) -> TargetOutput:
        for slot in range(self.size):
            self.target.release(slot)
        self.size = 0
        logits, hidden = [], []
        for slot, prompt in enumerate(prompts):
            output = self.target.admit(slot, prompt)
            self.size = slot + 1
            logits.append(self.to_numpy(output.logits))
            hidden.append(self.to_numpy(output.hidden)[-1])
        return TargetOutput(logits=np.stack(logits)[:, None], hidden=np.stack(hidden)[:, None])

    def forward_tree(self, tree: DraftTree) -> TargetOutput:
        return self.target.forward_tree(tree, np.arange(self.size))

    def commit(self, tree: DraftTree, verdict: Verdict) -> None:
        self.target.commit(tree, verdict)

    @property
    def cache_lengths(self) -> np.ndarray:
        return self.target.cache_lengths[: self.size]
