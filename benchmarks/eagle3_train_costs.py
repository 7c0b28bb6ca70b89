"""What a training step of ``specdec train eagle3`` costs against the training-time-test unroll.

Times ``Eagle3Task.unrolled_loss`` forward and backward plus the AdamW step, at a target's shapes
(its config only: the embedding is random, no weights are read) on random teacher data (random
fused-layer features and labels), for each ``--unrolls`` value and with the full draft-vocabulary
softmax or ``--negatives`` sampled ids. Reports training positions per second (median over
``--steps`` timed steps after one warm-up step). Writes JSON.

    OMP_NUM_THREADS=1 python benchmarks/eagle3_train_costs.py --model smollm2-135m --threads 1 \\
        --out benchmarks/results/training/eagle3_costs_smollm2-135m.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np
import torch

from specdec.models.bundled import resolve_model
from specdec.models.llama import LlamaConfig
from specdec.training.records import TeacherData
from specdec_eagle3.checkpoint import config_for_target
from specdec_eagle3.task import Eagle3Task


def random_data(config, *, positions: int, length: int, top_k: int, seed: int) -> TeacherData:
    """Sequences of ``length`` positions with random layers (bfloat16) and top-k labels."""
    rng = torch.Generator().manual_seed(seed)
    sequences = positions // length
    total = sequences * length
    per = torch.arange(length)
    labels = torch.randint(0, config.vocab_size, (total, top_k), generator=rng)
    probs = torch.softmax(torch.randn(total, top_k, generator=rng), dim=-1).sort(-1, True).values
    return TeacherData(
        hidden=torch.zeros(total, 1),
        next_tokens=labels[:, 0].clone(),
        label_ids=labels,
        label_probs=probs.half(),
        remaining=(length - 1 - per).repeat(sequences),
        sequence=torch.arange(sequences).repeat_interleave(length),
        layers=torch.randn(total, 3, config.hidden_size, generator=rng).bfloat16(),
        layer_ids=tuple(config.hidden_layers),
    )


def positions_per_second(
    task: Eagle3Task, data: TeacherData, *, batch_size: int, steps: int, seed: int
) -> float:
    """Median training positions per second of ``steps`` optimiser steps (one warm-up first)."""
    optimizer = torch.optim.AdamW(task.module.parameters(), lr=1e-4)
    rng = np.random.default_rng(seed)
    times = []
    for step in range(steps + 1):
        starts = torch.from_numpy(rng.integers(0, data.num_positions, batch_size // task.window))
        began = time.perf_counter()
        loss = task.unrolled_loss(data, starts, torch.Generator().manual_seed(step))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        if step:
            times.append(time.perf_counter() - began)
    return batch_size / statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--draft-vocab", type=int, default=8192)
    parser.add_argument("--unrolls", type=int, nargs="+", default=[1, 2, 3, 4, 7])
    parser.add_argument("--negatives", type=int, default=4096)
    parser.add_argument("--batch-size", type=int, default=512)
    parser.add_argument("--window", type=int, default=64)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    llama = LlamaConfig.from_folder(Path(resolve_model(args.model)))
    config = config_for_target(llama, {}, draft_vocab_size=args.draft_vocab)
    data = random_data(config, positions=20_000, length=200, top_k=32, seed=0)
    embed = torch.randn(llama.vocab_size, llama.hidden_size) * 0.05
    rng = np.random.default_rng(0)
    ids = np.sort(rng.choice(llama.vocab_size, args.draft_vocab, replace=False))
    rows = []
    for unroll in args.unrolls:
        for negatives in (None, args.negatives):
            torch.manual_seed(0)
            task = Eagle3Task(
                config,
                embed_tokens=embed,
                ids=ids,
                window=args.window,
                unroll=unroll,
                negatives=negatives,
            )
            rate = positions_per_second(
                task, data, batch_size=args.batch_size, steps=args.steps, seed=0
            )
            rows.append(
                {"unroll": unroll, "negatives": negatives, "positions_per_second": round(rate, 1)}
            )
            print(json.dumps(rows[-1]), flush=True)
    report = {
        "model": args.model,
        "draft_vocab": args.draft_vocab,
        "batch_size": args.batch_size,
        "window": args.window,
        "threads": torch.get_num_threads(),
        "rows": rows,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
