"""EAGLE-2's dynamic tree on torch, batched over a step's rows (EAGLE's and EAGLE-3's): the twin
of ``specdec_eagle.reference.dynamic_tree``. ``TreeSearch`` runs the drafter's net level by level
over its ``TreeContext`` (the step's draft caches side by side, ``SlotDrafter.context``); the
host side (kept nodes, extensions, beams) is ``specdec_eagle.search``'s."""

from __future__ import annotations

import attrs
import torch
import torch.nn.functional as F

from specdec_eagle.search import extended_beams
from specdec_torch.ops import top_k_lowest_index

__all__ = ["TreeContext", "TreeSearch"]


@attrs.frozen
class TreeContext:
    """A step's draft caches side by side (``SlotDrafter.context``)."""

    keys: torch.Tensor
    values: torch.Tensor
    mask: torch.Tensor
    lengths: torch.Tensor


class TreeSearch:
    """One step's dynamic trees for B rows (see ``specdec_eagle.reference.dynamic_tree``).

    Tree entries (nodes run through the layer) are kept in order: the root entry, each level's k
    frontier nodes, then extension nodes; ``anc`` (B, t, t) says which entries each one attends
    to (its ancestors and itself), ``outs`` (B, t, H) their outputs, ``top1`` (B, t) their best
    child (a drafted-vocabulary index).
    """

    def __init__(self, drafter, context: TreeContext):
        self.drafter, self.net = drafter, drafter.net
        self.ctx_keys, self.ctx_values = context.keys, context.values
        self.ctx_mask, self.lengths = context.mask, context.lengths
        self.keys = self.values = self.anc = self.outs = self.top1 = None

    def _run(
        self,
        tokens: torch.Tensor,
        features: torch.Tensor,
        levels: torch.Tensor,
        parents: torch.Tensor | None,
    ):
        """Run m new entries per row: tokens (B, m), features (B, m, H), levels (B, m) (position
        offsets from the root entry), parents (B, m) entry indices (None: the root entry).
        Appends them to the tree's entries; returns their log-probs (B, m, S)."""
        batch, m = tokens.shape
        device = tokens.device
        x = self.net.fuse(tokens, features)
        positions = self.lengths[:, None] + levels
        if self.keys is None:  # the root entry: the cache and itself
            tree_mask = torch.ones(batch, m, 0, dtype=torch.bool, device=device)
            past_keys, past_values = self.ctx_keys, self.ctx_values
        else:
            # (B, m, t)
            tree_mask = torch.gather(
                self.anc, 1, parents[:, :, None].expand(-1, -1, self.anc.shape[2])
            )
            past_keys = torch.cat([self.ctx_keys, self.keys], dim=2)
            past_values = torch.cat([self.ctx_values, self.values], dim=2)
        eye = torch.eye(m, dtype=torch.bool, device=device).expand(batch, m, m)
        mask = torch.cat([self.ctx_mask[:, None].expand(batch, m, -1), tree_mask, eye], dim=2)
        out, k, v = self.net.layer(x, positions, past_keys, past_values, mask)
        log_probs = self.drafter.log_probs(out)
        top1 = top_k_lowest_index(log_probs, 1)[1][..., 0]
        if self.keys is None:
            self.keys, self.values, self.anc, self.outs, self.top1 = k, v, eye.clone(), out, top1
        else:
            grown = F.pad(self.anc, (0, m))  # (B, t, t + m)
            new_rows = torch.cat([tree_mask, eye], dim=2)  # (B, m, t + m)
            self.anc = torch.cat([grown, new_rows], dim=1)
            self.keys, self.values = (
                torch.cat([self.keys, k], dim=2),
                torch.cat([self.values, v], dim=2),
            )
            self.outs, self.top1 = (
                torch.cat([self.outs, out], dim=1),
                torch.cat([self.top1, top1], dim=1),
            )
        return log_probs

    def run(self, roots: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        drafter, batch = self.drafter, roots.shape[0]
        k, depth = drafter.top_k, drafter.depth
        device = roots.device
        zeros = torch.zeros(batch, 1, dtype=torch.int64, device=device)
        log_probs = self._run(roots[:, None], hidden[:, None], zeros, None)[:, 0]  # (B, S)
        # Candidates: node 0 the root, then level 1's k, then k*k per further level.
        scores, local = top_k_lowest_index(log_probs, k)  # (B, k)
        cand_tokens = [roots[:, None], drafter.to_vocab(local)]
        cand_parents = [zeros - 1, zeros.expand(batch, k)]
        cand_scores = [torch.zeros_like(scores[:, :1]), scores]
        # entry of run nodes
        cand_entry = [
            zeros,
            torch.full((batch, k), -1, dtype=torch.int64, device=device),
        ]
        frontier = torch.arange(1, k + 1, device=device).expand(batch, k)  # candidate ids
        frontier_scores, frontier_parent = scores, zeros.expand(batch, k)  # parent entry indices
        count = 1 + k
        for level in range(2, depth + 1):
            first_entry = self.anc.shape[1]
            parent_outs = torch.gather(
                self.outs, 1, frontier_parent[:, :, None].expand(-1, -1, self.outs.shape[2])
            )
            tokens = torch.gather(torch.cat(cand_tokens, 1), 1, frontier)
            # (B, k, S)
            log_probs = self._run(
                tokens, parent_outs, torch.full_like(frontier, level - 1), frontier_parent
            )
            entries = torch.arange(first_entry, first_entry + k, device=device).expand(batch, k)
            entry_of = torch.cat(cand_entry, 1).scatter(1, frontier, entries)
            cand_entry = [entry_of]
            child_scores, child_local = top_k_lowest_index(log_probs, k)  # (B, k, k)
            child_scores = (frontier_scores[:, :, None] + child_scores).reshape(batch, k * k)
            cand_tokens.append(drafter.to_vocab(child_local).reshape(batch, k * k))
            cand_parents.append(frontier[:, :, None].expand(batch, k, k).reshape(batch, k * k))
            cand_scores.append(child_scores)
            cand_entry.append(torch.full((batch, k * k), -1, dtype=torch.int64, device=device))
            frontier_scores, best = top_k_lowest_index(child_scores, k)  # (B, k)
            frontier_parent = entries.gather(1, best // k)
            frontier = count + best
            count += k * k
        tokens, parents = torch.cat(cand_tokens, 1), torch.cat(cand_parents, 1)
        all_scores, entry_of = torch.cat(cand_scores, 1), torch.cat(cand_entry, 1)
        return self._beams(tokens, parents, all_scores, entry_of)

    def _beams(self, tokens, parents, scores, entry_of) -> torch.Tensor:
        """Beams (B, W, L) of the kept candidates, short leaves extended along their top-1
        children (``specdec_eagle.search.extended_beams``, on the host)."""
        drafter, device = self.drafter, tokens.device
        host = lambda t: t.cpu().numpy()  # noqa: E731

        def run(run_tokens, run_parent, run_level) -> int:
            first = self.anc.shape[1]
            run_tokens, run_parent, run_level = (
                torch.from_numpy(a).to(device) for a in (run_tokens, run_parent, run_level)
            )
            features = torch.gather(
                self.outs, 1, run_parent[:, :, None].expand(-1, -1, self.outs.shape[2])
            )
            self._run(run_tokens, features, run_level, run_parent)
            return first

        beams = extended_beams(
            host(tokens),
            host(parents),
            host(scores),
            host(entry_of),
            depth=drafter.depth,
            width=drafter.total_tokens,
            run=run,
            top1=lambda: host(drafter.to_vocab(self.top1)),
        )
        return torch.as_tensor(beams, device=device)
