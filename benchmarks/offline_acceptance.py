"""Tokens per step on a benchmark prompt set, computed offline, without timing anything.

The target decodes the prompt set's chats greedily once (teacher data, as ``specdec train`` makes
it; cached under --cache), then each drafter checkpoint's acceptance is replayed over those
continuations exactly as ``specdec train`` evaluates held-out data
(``specdec.training.loop.evaluate``: accept a, emit a + 1, jump a + 1; bonus token counted). With
--lookup it also replays, per position, the best of ReDrafter's accepted tokens
(the first checkpoint at the first --beams pair), the prompt-lookup chain
(``specdec.drafting.lookup.row_chain``, 10 tokens; where only the last token occurred before, a
chain of --unigram-lengths tokens, with the tree nodes the chains add per step) and, where the
chain finds nothing, a chain from an n-gram store of the target's own training continuations
(most frequent follower of the last 3, 2 tokens, seen at least twice): what a third beam drawn
from such a store would add. With --prune, the first checkpoint's W=2, L=4 beams
cut at the first drafted token whose conditional probability under the drafter is below a threshold:
tokens per step against tree nodes per step.

    python benchmarks/offline_acceptance.py --prompts mt-bench --per-category 2 \
        drafters/specdec_redrafter/weights/smollm2-135m runs/rd-gen --lookup
    python benchmarks/offline_acceptance.py --prompts humaneval --per-category 16 --beams 2x3 \
        drafters/specdec_redrafter/weights/smollm2-135m --lookup --store-prompts 0
"""

from __future__ import annotations

import argparse
import collections
import json
from pathlib import Path

import numpy as np
import torch

from specdec.bench import load_prompt_set
from specdec.drafting.lookup import row_chain
from specdec.plugins.registry import default_registry
from specdec.training.evaluate import gather_window
from specdec.training.loop import evaluate
from specdec.training.run import build_teacher_data
from specdec.training.teacher import load_teacher_target
from specdec_redrafter.checkpoint import load_redrafter_checkpoint
from specdec_redrafter.torch import RedrafterModule


def continuations(data) -> list[np.ndarray]:
    starts = data.starts().tolist() + [data.num_positions]
    tokens = data.next_tokens.numpy()
    return [tokens[a:b] for a, b in zip(starts[:-1], starts[1:])]


def ngram_store(sequences) -> dict:
    counts: dict = collections.defaultdict(collections.Counter)
    for seq in sequences:
        seq = seq.tolist()
        for i in range(len(seq) - 1):
            for n in (2, 3):
                if i + 1 >= n:
                    counts[tuple(seq[i + 1 - n : i + 1])][seq[i + 1]] += 1
    return counts


def store_chain(store: dict, history: list[int], length: int = 10, min_count: int = 2) -> list[int]:
    history, out = list(history), []
    for _ in range(length):
        found = None
        for n in (3, 2):
            counter = store.get(tuple(history[-n:]))
            if counter:
                token, count = counter.most_common(1)[0]
                if count >= min_count:
                    found = token
                    break
        if found is None:
            break
        out.append(found)
        history.append(found)
    return out


def accepted(chain, future) -> int:
    count = 0
    for drafted, actual in zip(chain, future):
        if drafted != actual:
            break
        count += 1
    return count


def replay(sequences, prompts, accept_at) -> tuple[float, float]:
    """Tokens per step, and chain nodes per step; ``accept_at`` returns (accepted, chain nodes)."""
    tokens = steps = nodes = 0
    for index, (seq, prompt) in enumerate(zip(sequences, prompts)):
        seq, j = seq.tolist(), 0
        while j < len(seq):
            count, chain_nodes = accept_at(index, j, prompt + seq[: j + 1], seq[j + 1 :])
            j, steps, nodes = j + count + 1, steps + 1, nodes + chain_nodes
        tokens += len(seq)
    return tokens / steps, nodes / steps


def pruned(checkpoint, target, data, thresholds=(0.0, 0.05, 0.1, 0.2, 0.3)) -> dict:
    """Tokens and tree nodes per step (root counted) of W=2, L=4 beams cut below each threshold."""
    config, weights = load_redrafter_checkpoint(checkpoint)
    module = RedrafterModule(
        config, weights, embed_tokens=target.embed_tokens.float(), lm_head=target.lm_head.float()
    )
    window = gather_window(
        data, torch.arange(data.num_positions), 3, labels=False
    )  # L - 1 = 3 drafted tokens
    with torch.no_grad():
        beams, _, log_probs = module.beam_search(
            window.hidden.float(), window.tokens[:, 0], width=2, length=4, keep_log_probs=True
        )
    drafted = beams[:, :, 1:]
    probs = torch.gather(log_probs, 3, drafted[..., None])[..., 0].exp()  # (P, W, 3) conditional
    match = (drafted == window.tokens[:, None, 1:4]) & window.valid[:, None, :3]
    starts = data.starts().tolist() + [data.num_positions]
    out = {}
    for threshold in thresholds:
        keep = torch.cumprod((probs >= threshold).int(), dim=2).bool()
        accepted_at = torch.cumprod((match & keep).int(), dim=2).sum(2).max(1).values.numpy()
        nodes = np.array(
            [
                1
                + len(
                    {tuple(beam[: j + 1]) for beam, kept in zip(b, k) for j in range(3) if kept[j]}
                )
                for b, k in zip(drafted.tolist(), keep.tolist())
            ]
        )
        steps = node_sum = 0
        for first, end in zip(starts[:-1], starts[1:]):
            j = first
            while j < end:
                steps, node_sum, j = steps + 1, node_sum + nodes[j], j + accepted_at[j] + 1
        out[f"p >= {threshold}"] = {
            "tokens_per_step": round(data.num_positions / steps, 3),
            "nodes_per_step": round(node_sum / steps, 2),
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("checkpoints", nargs="+")
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--prompts", default="mt-bench")
    parser.add_argument("--per-category", type=int, default=2)
    parser.add_argument("--beams", default="2x4,4x5", help="W x L pairs to evaluate")
    parser.add_argument(
        "--lookup", action="store_true", help="also replay the lookup beam and an n-gram store"
    )
    parser.add_argument(
        "--prune", action="store_true", help="also replay beams cut at low drafter probability"
    )
    parser.add_argument(
        "--store-prompts",
        type=int,
        default=3200,
        help="training prompts whose continuations fill the store (0: no store)",
    )
    parser.add_argument(
        "--unigram-lengths",
        default="0,2,3,4",
        help="lookup chain lengths where only the last token occurred before, to replay",
    )
    parser.add_argument("--cache", default=str(Path.home() / ".cache/specdec/offline"))
    args = parser.parse_args()
    torch.set_num_threads(2)
    prompts = load_prompt_set(args.prompts, per_category=args.per_category)
    target = load_teacher_target(args.model)
    source = (  # noqa: E731
        lambda split, start, count: [list(p.messages) for p in prompts[start : start + count]]
    )
    data = build_teacher_data(
        target,
        prompts=0,
        heldout_prompts=len(prompts),
        prompt_source=source,
        cache=Path(args.cache) / args.prompts,
        progress=False,
    )[0]["heldout"]
    report = {
        "prompts": f"{args.prompts} ({len(prompts)})",
        "positions": data.num_positions,
        "drafters": {},
    }
    first = None
    for checkpoint in args.checkpoints:
        for pair in args.beams.split(","):
            width, length = (int(v) for v in pair.split("x"))
            task = (
                default_registry()
                .drafter_spec("redrafter")
                .evaluation_task(checkpoint, target, {"beam_width": width, "beam_length": length})
            )
            report["drafters"][f"{checkpoint} W={width} L={length}"] = round(
                evaluate(task, data, sequences=None)["tokens_per_step"], 3
            )
            if first is None:
                with torch.no_grad():
                    first = np.asarray(task.accept(data, torch.arange(data.num_positions))).reshape(
                        -1
                    )
    if args.prune:
        report["pruned beams (first checkpoint)"] = pruned(args.checkpoints[0], target, data)
    if args.lookup and first is not None:
        sequences, starts = continuations(data), data.starts().tolist()
        encoded = [target.encode(p.prompt) for p in prompts]
        store = None
        if args.store_prompts:
            train = build_teacher_data(
                target, prompts=args.store_prompts, heldout_prompts=64, progress=False
            )[0]["train"]
            store = ngram_store(continuations(train))

        def best(index, j, history, future, *, drafter=True, unigram=None, from_store=False):
            found = [int(first[starts[index] + j])] if drafter else []
            chain = []
            if unigram is not None:
                chain = row_chain(
                    np.array(history), 10, max_ngram=3, min_ngram=2, unigram_length=unigram
                ).tolist()
                found.append(accepted(chain, future))
            if from_store and not chain:
                found.append(accepted(store_chain(store, history), future))
            return max(found), len(chain)

        replayed = {"redrafter": replay(sequences, encoded, best)}
        for unigram in (int(v) for v in args.unigram_lengths.split(",")):
            replayed[f"redrafter + lookup, unigram {unigram}"] = replay(
                sequences, encoded, lambda *a, u=unigram: best(*a, unigram=u)
            )
            replayed[f"lookup alone, unigram {unigram}"] = replay(
                sequences, encoded, lambda *a, u=unigram: best(*a, drafter=False, unigram=u)
            )
        if store is not None:
            replayed["redrafter + lookup + store where lookup finds nothing"] = replay(
                sequences, encoded, lambda *a: best(*a, unigram=0, from_store=True)
            )
            report["store_ngrams"] = len(store)
        beams = args.beams.split(",")[0]
        report[f"replayed (first checkpoint, {beams}): tokens/step, chain nodes/step"] = {
            k: [round(v, 3) for v in pair] for k, pair in replayed.items()
        }
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
