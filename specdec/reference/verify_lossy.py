"""Lossy verifiers: they change the output distribution (float64 reference).

Offered because published systems use them, flagged ``lossless = False``, never a default
(docs/design.md section 3). The exact rules and the helpers they share are in ``verify``.
"""

from __future__ import annotations

import math

import numpy as np

from specdec.reference.verify import (
    RowVerifier,
    acceptance_probability,
    beam_nodes,
    children_of,
    entropy,
    node_probs,
    subtract_draft,
)


class RedrafterPublishedVerifier(RowVerifier):
    """ReDrafter's published sampling rule (arXiv 2403.09919; Apple's ``_choose_from_candidates``).

    For every beam i and depth k, the drafted token x = beams[b, i, k+1] passes when
    ``uniforms[b, k, 1+i] < target_probs[x] / draft_probs[b, i, k, x]``, with the target
    probabilities at the beam's node of depth k and one independent coin per (beam, depth).
    A beam's accepted length n_i is its number of leading passes; the beam with the longest
    (lowest index on ties) is chosen. The bonus is drawn with ``uniforms[b, n, 0]`` from
    normalize(relu(target_probs - draft_probs)) at the chosen beam's first rejection, or from
    target_probs when the whole beam passed. Unlike the published code, no top-50 is applied.

    Not exact: beams from beam search were not drawn from draft_probs, shared prefixes get a
    fresh coin in every beam and the best of W inflates acceptance, and the residual ignores
    the siblings already tried.
    """

    lossless = False
    needs_draft_probs = True
    uses_beam_uniforms = True

    def verify_row(self, tree, draft, target, sampling, b, chooser):
        nodes = beam_nodes(tree, draft, b)  # (W, L)
        beams = np.asarray(draft.beams[b])  # (W, L)
        draft_probs = np.asarray(draft.draft_probs[b], dtype=np.float64)  # (W, L-1, V)
        width, length = beams.shape
        best_length, best_beam = -1, 0
        for i in range(width):
            # Leading passes of beam i; later coins of the beam cannot matter.
            accepted = 0
            while accepted < length - 1:
                probs = node_probs(target, sampling, b, int(nodes[i, accepted]))
                token = int(beams[i, accepted + 1])
                probability = acceptance_probability(probs, draft_probs[i, accepted], token)
                if not chooser.accept(probability, accepted, i):
                    break
                accepted += 1
            if accepted > best_length:
                best_length, best_beam = accepted, i
        path = [int(nodes[best_beam, k]) for k in range(best_length + 1)]
        probs = node_probs(target, sampling, b, path[-1])
        if best_length < length - 1:
            probs = subtract_draft(probs, draft_probs[best_beam, best_length])
        return path, chooser.categorical(probs, best_length)


class TypicalVerifier(RowVerifier):
    """Medusa's typical acceptance (arXiv 2401.10774, "typical acceptance").

    Walk from the root: at node u, with target_probs at u and threshold
    min(epsilon, delta * exp(-entropy(target_probs))), descend to the first child (node
    order) whose token has target probability above the threshold; when none has, the bonus
    is drawn from target_probs at u with ``uniforms[b, d, 0]`` (argmax when greedy).

    Not exact: a drafted token above the threshold is accepted with probability 1 instead of
    its target probability. At temperature 0 it accepts exactly the argmax children, i.e. it
    is greedy decoding.
    """

    lossless = False

    def __init__(self, epsilon: float = 0.09, delta: float = 0.3):
        self.epsilon = float(epsilon)
        self.delta = float(delta)

    def verify_row(self, tree, draft, target, sampling, b, chooser):
        path = [0]
        while True:
            node = path[-1]
            probs = node_probs(target, sampling, b, node)
            threshold = min(self.epsilon, self.delta * math.exp(-entropy(probs)))
            accepted = None
            for child in children_of(tree, b, node):
                if probs[int(tree.tokens[b, child])] > threshold:
                    accepted = child
                    break
            if accepted is None:
                return path, chooser.categorical(probs, int(tree.depth[b, node]))
            path.append(accepted)
