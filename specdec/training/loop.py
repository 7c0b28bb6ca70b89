"""The training loop shared by every drafter: distillation loss, schedule, evaluation, checkpoints.

A drafter plugs in as a *task* (duck-typed):

    task.module                    torch.nn.Module holding exactly the drafter's trainable weights
    task.depth                     D, drafted steps trained per position (ReDrafter L-1, Medusa K)
    task.loss(window, generator)   distillation loss on a ``specdec.training.evaluate.Window``
                                   (``generator``: seeded per step, for sampled softmax)
    task.accept(data, indices)     (B,) drafted tokens greedy verification accepts at those
                                   positions
    task.save(folder, dtype=...)   write ``config.json`` + ``model.safetensors``
                                   (a loadable checkpoint)

The loop samples random positions of the teacher data (with replacement, from a seeded NumPy
generator), runs AdamW with linear warmup and cosine decay over the budget (steps, or minutes
of training time), evaluates held-out tokens per step at fixed marks, and after each evaluation
writes the checkpoint plus ``trainer_state.safetensors`` (``specdec.training.state``: no pickle) so
``resume=True`` continues where it stopped.
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import attrs
import numpy as np
import torch
import torch.nn.functional as F
from tqdm.auto import tqdm

from specdec.errors import TrainingInterrupted, TrainingOutputError
from specdec.models.checkpoints import write_json_atomic
from specdec.training.evaluate import Window, gather_window, walk_tokens_per_step
from specdec.training.lines import say
from specdec.training.outdir import LAST_DIR, LOG_FILE, STATE_FILE, has_state
from specdec.training.signals import deferred_signals
from specdec.training.state import load_state
from specdec.training.state import save_state as write_state
from specdec.training.records import TeacherData

__all__ = [
    "STATE_FILE",
    "TrainSettings",
    "learning_rate",
    "sampled_soft_cross_entropy",
    "soft_cross_entropy",
    "train",
]

HEARTBEAT_SECONDS = 120.0  # without progress bars, a line at least this often between evaluations


@attrs.frozen(kw_only=True)
class TrainSettings:
    """Budget and optimiser settings.

    steps / minutes: stop after this many optimiser steps / minutes of training time (evaluation
    not counted); with both, whichever comes first; at least one is needed. batch_size: positions
    per step. lr: peak AdamW learning rate, reached after ``warmup`` (a fraction of the budget),
    then cosine decay to ``lr * final_lr``. bf16: autocast the drafter to bfloat16 (slower than
    float32 on CPUs without AMX). eval_minutes / eval_steps: when to evaluate held-out tokens per
    step (minutes of training, or every n steps), on the first ``eval_sequences`` held-out
    sequences; the final evaluation uses them all.
    """

    steps: int | None = None
    minutes: float | None = None
    batch_size: int = 64
    lr: float = 1e-3
    weight_decay: float = 0.0
    warmup: float = 0.05
    final_lr: float = 0.1
    grad_clip: float = 1.0
    bf16: bool = False
    seed: int = 0
    eval_minutes: tuple = (1, 2, 5, 10, 15, 20, 30, 45, 60, 90, 120)
    eval_steps: int | None = None
    eval_sequences: int | None = 32

    def __attrs_post_init__(self):
        if self.steps is None and self.minutes is None:
            raise ValueError("TrainSettings needs a budget: steps=N or minutes=M (or both)")

    def progress(self, step: int, seconds: float) -> float:
        """Fraction of the budget used, in [0, 1]."""
        fractions = [step / self.steps] if self.steps else []
        fractions += [seconds / (60.0 * self.minutes)] if self.minutes else []
        return min(1.0, max(fractions))


def resumed_segment(settings: TrainSettings, state: dict, last_lr: float):
    """(progress now, ``last_lr``) when a resumed run's schedule would raise the learning rate
    above the one it stopped at (its budget, ``--minutes`` or ``--steps``, grew): the rest of the
    budget then decays from ``last_lr`` instead of climbing back up the longer schedule; None
    otherwise."""
    now = settings.progress(state["step"], state["train_seconds"])
    if state["step"] and now < 1.0 and learning_rate(settings, now) > last_lr * (1 + 1e-6):
        return now, float(last_lr)
    return None


def learning_rate(settings: TrainSettings, progress: float, segment=None) -> float:
    """Linear warmup over the first ``warmup`` of the budget, then cosine decay to
    ``lr * final_lr``; with a ``segment`` (``resumed_segment``), cosine decay from its learning
    rate at its progress to the same end."""
    final = settings.lr * settings.final_lr
    if segment is not None:
        start, rate = segment
        part = (progress - start) / max(1e-9, 1.0 - start)
        return final + (rate - final) * 0.5 * (1.0 + math.cos(math.pi * min(1.0, max(0.0, part))))
    if settings.warmup > 0 and progress < settings.warmup:
        return settings.lr * max(progress / settings.warmup, 1e-3)
    decay = (progress - settings.warmup) / max(1e-9, 1.0 - settings.warmup)
    cosine = 0.5 * (1.0 + math.cos(math.pi * min(1.0, decay)))
    return settings.lr * (settings.final_lr + (1.0 - settings.final_lr) * cosine)


def soft_cross_entropy(
    logits: torch.Tensor, label_ids: torch.Tensor, label_probs: torch.Tensor, valid: torch.Tensor
) -> torch.Tensor:
    """Cross-entropy between the target's top-k distribution (renormalised) and the drafter's.

    logits (B, D, V); label_ids, label_probs (B, D, k); valid (B, D). Equal to
    KL(target_topk || drafter) up to a constant. -> scalar: summed over the D steps, mean over B.
    """
    logits = logits.float()
    log_normaliser = torch.logsumexp(logits, dim=-1)  # (B, D)
    picked = torch.gather(logits, -1, label_ids)  # (B, D, k)
    target_probs = label_probs.float()
    target_probs = target_probs / target_probs.sum(-1, keepdim=True).clamp(min=1e-12)
    per_step = log_normaliser - (target_probs * picked).sum(-1)  # (B, D): -sum_j p_j log q_j
    return (per_step * valid).sum() / logits.shape[0]


def sampled_soft_cross_entropy(
    features: torch.Tensor,
    vocab_weight: torch.Tensor,
    label_ids: torch.Tensor,
    label_probs: torch.Tensor,
    valid: torch.Tensor,
    *,
    negatives: int,
    generator: torch.Generator,
) -> torch.Tensor:
    """``soft_cross_entropy`` with the softmax normaliser estimated on a sample of the vocabulary.

    features (B, D, F) and vocab_weight (V, F): logits = features @ vocab_weight.T. Exact logits
    for every label token of the batch; ``negatives`` other tokens drawn uniformly without
    replacement stand for all M remaining ones (their exponentials are weighted by M/negatives),
    so the normaliser is an unbiased estimate at a fraction of the V-wide projection's cost.
    """
    vocab = vocab_weight.shape[0]
    exact = torch.zeros(vocab, dtype=torch.bool)
    exact[label_ids.flatten()] = True
    exact_ids, rest = torch.nonzero(exact).flatten(), torch.nonzero(~exact).flatten()
    drawn = rest[torch.randperm(rest.numel(), generator=generator)[:negatives]]
    candidates = torch.cat([exact_ids, drawn])  # (C,)
    weight = torch.cat(
        [
            torch.zeros(exact_ids.numel()),
            torch.full((drawn.numel(),), math.log(rest.numel() / max(drawn.numel(), 1))),
        ]
    ).to(features.dtype)
    logits = F.linear(features, vocab_weight[candidates].to(features.dtype)) + weight  # (B, D, C)
    where = torch.full((vocab,), -1, dtype=torch.long)
    where[exact_ids] = torch.arange(exact_ids.numel())
    return soft_cross_entropy(logits, where[label_ids], label_probs, valid)


def evaluate(task, heldout: TeacherData, *, sequences: int | None) -> dict:
    """Held-out tokens per step (bonus counted) of the task's drafter, by
    ``walk_tokens_per_step``."""
    task.module.eval()
    try:
        with torch.no_grad():
            return walk_tokens_per_step(
                heldout, lambda idx: task.accept(heldout, idx), sequences=sequences
            )
    finally:
        task.module.train()


def _resume(path: Path, state: dict, module, optimizer, rng) -> None:
    """Continue from the state saved in ``path``: the module's and optimiser's state, the
    sampler's and the counters into ``state``. A state that does not fit (a crafted or damaged
    file: a missing entry, a counter of the wrong type, tensors of other shapes) is refused with
    TrainingOutputError naming the file, before anything is changed by it."""
    saved = load_state(path)
    refuse = (
        f"{path} is not a trainer state this run can continue from ({{}}); start the run again "
        "with --overwrite instead of --resume"
    )

    def number(value, *, integer: bool) -> bool:
        kinds = (int,) if integer else (int, float)
        return (
            isinstance(value, kinds)
            and not isinstance(value, bool)
            and math.isfinite(value)
            and value >= 0
        )

    problems = [
        key for key in ("module", "optimizer", "rng") if not isinstance(saved.get(key), dict)
    ]
    problems += [
        key
        for key, integer in (
            ("step", True),
            ("positions", True),
            ("marks_done", True),
            ("train_seconds", False),
            ("eval_seconds", False),
        )
        if key in saved and not number(saved[key], integer=integer)
    ]
    history = saved.get("history", [])
    if not isinstance(history, list) or not all(
        isinstance(row, dict)
        and number(row.get("step"), integer=True)
        and all(number(row.get(key), integer=False) for key in ("minutes", "tokens_per_step"))
        and all(
            number(row.get(key, 0), integer=False)
            for key in ("positions", "score", "mean_accepted")
        )
        and isinstance(row.get("loss"), (int, float))
        and not isinstance(row.get("loss"), bool)
        and "heldout_sequences" in row
        for row in history
    ):
        problems.append("history")
    best = saved.get("best")
    if best is not None and not (
        isinstance(best, dict)
        and number(best.get("step"), integer=True)
        and number(best.get("score"), integer=False)
    ):
        problems.append("best")
    if problems:
        raise TrainingOutputError(refuse.format(f"bad or missing {', '.join(problems)}"))
    try:
        module.load_state_dict(saved["module"])
        optimizer.load_state_dict(saved["optimizer"])
        rng.bit_generator.state = saved["rng"]
    except (KeyError, IndexError, TypeError, ValueError, RuntimeError) as exc:
        detail = " ".join(str(exc).split())[:300] or type(exc).__name__
        raise TrainingOutputError(refuse.format(detail)) from None
    state.update({k: saved[k] for k in state if k in saved})
    if state["best"] is None and state["history"]:  # saved before best checkpoints were tracked
        state["best"] = {
            "step": state["history"][-1]["step"],
            "score": state["history"][-1]["tokens_per_step"],
        }


def train(
    task,
    data: TeacherData,
    heldout: TeacherData,
    settings: TrainSettings,
    out: Path,
    *,
    resume: bool = False,
    progress: bool = True,
    save_dtype=np.float32,
    save_minutes: float = 5.0,
) -> dict:
    """Train ``task`` on ``data``, evaluate on ``heldout``, checkpoint into ``out``.

    Checkpoints: ``out`` holds the best one by held-out score (replaced only by one that is not
    worse, compared on the same held-out sequences), ``out/last`` the latest; both are written
    after each evaluation. ``trainer_state.safetensors`` (the latest weights, optimiser and sampler)
    is saved after each evaluation, every ``save_minutes`` of wall time, and at the first SIGINT or
    SIGTERM, after which training stops with ``TrainingInterrupted`` (``resume=True`` continues).

    Returns the final state summary: step, train_seconds, positions, history (one row per
    evaluation: step, minutes, positions, loss, tokens_per_step, score, mean_accepted).
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    module = task.module.train()
    optimizer = torch.optim.AdamW(
        [p for p in module.parameters() if p.requires_grad],
        lr=settings.lr,
        weight_decay=settings.weight_decay,
    )
    rng = np.random.default_rng(settings.seed)
    state = {
        "step": 0,
        "train_seconds": 0.0,
        "eval_seconds": 0.0,
        "positions": 0,
        "history": [],
        "marks_done": 0,
        "best": None,
    }
    segment = None  # a resumed run whose budget grew: (progress then, the learning rate then)
    if resume and has_state(out):
        _resume(out / STATE_FILE, state, module, optimizer, rng)
        segment = resumed_segment(settings, state, optimizer.param_groups[0]["lr"])
    marks = sorted(
        m for m in settings.eval_minutes if settings.minutes is None or m < settings.minutes
    )
    # a longer budget on resume
    state["marks_done"] = sum(m <= state["train_seconds"] / 60.0 for m in marks)
    last_save = [time.monotonic()]

    def save_state(final: bool) -> None:
        task.save(out / LAST_DIR, dtype=save_dtype)
        # the first save: ``out`` loads at once (not yet scored)
        if not (out / "model.safetensors").is_file():
            task.save(out, dtype=save_dtype)
        write_state(
            out / STATE_FILE,
            {
                "module": module.state_dict(),
                "optimizer": optimizer.state_dict(),
                "rng": rng.bit_generator.state,
                "settings": attrs.asdict(settings),
                **state,
            },
        )
        write_json_atomic(
            out / LOG_FILE,
            {
                "history": state["history"],
                "final": final,
                "step": state["step"],
                "train_seconds": state["train_seconds"],
                "positions": state["positions"],
                "best": state["best"],
            },
        )
        last_save[0] = time.monotonic()

    def run_eval(loss: float, final: bool) -> None:
        began = time.perf_counter()
        result = evaluate(task, heldout, sequences=None if final else settings.eval_sequences)
        score = result["tokens_per_step"]
        # scored on the sequences every evaluation uses
        if final and settings.eval_sequences is not None:
            score = evaluate(task, heldout, sequences=settings.eval_sequences)["tokens_per_step"]
        state["eval_seconds"] += time.perf_counter() - began
        best = state["best"] is None or score >= state["best"]["score"]
        state["history"].append(
            {
                "step": state["step"],
                "minutes": round(state["train_seconds"] / 60.0, 3),
                "positions": state["positions"],
                "loss": round(loss, 4),
                "tokens_per_step": round(result["tokens_per_step"], 4),
                "score": round(score, 4),
                "best": best,
                "mean_accepted": round(result["mean_accepted"], 4),
                "eval_steps": result["steps"],
                "heldout_sequences": "all" if final else settings.eval_sequences,
                "histogram": result["histogram"],
            }
        )
        if best:
            task.save(out, dtype=save_dtype)
            state["best"] = {"step": state["step"], "score": score}
        save_state(final)
        if not progress:
            say(
                f"training: step {state['step']}, {state['train_seconds'] / 60:.1f} min, "
                f"{state['positions'] / max(state['train_seconds'], 1e-9):.0f} positions/s, "
                f"loss {loss:.3f}, held-out tokens/step {result['tokens_per_step']:.2f}"
                + (" (best, saved)" if best else "")
            )

    bar = tqdm(
        total=settings.steps,
        initial=state["step"],
        disable=not progress,
        unit="step",
        desc="training",
    )
    running = None
    last_line = time.monotonic()
    with deferred_signals() as caught:
        while settings.progress(state["step"], state["train_seconds"]) < 1.0:
            if caught:
                save_state(False)
                bar.close()
                raise TrainingInterrupted(
                    f"training stopped by {caught[0]} at step {state['step']}; its state is saved "
                    f"in {out} ({STATE_FILE}, the latest weights in {out / LAST_DIR}): continue "
                    "with --resume"
                )
            began = time.perf_counter()
            rate = learning_rate(
                settings, settings.progress(state["step"], state["train_seconds"]), segment
            )
            for group in optimizer.param_groups:
                group["lr"] = rate
            indices = torch.from_numpy(
                rng.integers(0, data.num_positions, size=settings.batch_size)
            )
            window: Window = gather_window(data, indices, task.depth)
            generator = torch.Generator().manual_seed(settings.seed * 1_000_003 + state["step"])
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=settings.bf16):
                loss = task.loss(window, generator)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if settings.grad_clip:
                torch.nn.utils.clip_grad_norm_(module.parameters(), settings.grad_clip)
            optimizer.step()
            value = float(loss.detach())
            running = value if running is None else 0.95 * running + 0.05 * value
            state["step"] += 1
            state["positions"] += settings.batch_size
            state["train_seconds"] += time.perf_counter() - began
            bar.update(1)
            bar.set_postfix(
                loss=f"{running:.3f}",
                pos_per_s=f"{state['positions'] / state['train_seconds']:.0f}",
                min=f"{state['train_seconds'] / 60:.1f}",
            )
            minutes = state["train_seconds"] / 60.0
            due_mark = state["marks_done"] < len(marks) and minutes >= marks[state["marks_done"]]
            due_step = settings.eval_steps and state["step"] % settings.eval_steps == 0
            if due_mark or due_step:
                while state["marks_done"] < len(marks) and minutes >= marks[state["marks_done"]]:
                    state["marks_done"] += 1
                run_eval(running, final=False)
                last_line = time.monotonic()
                bar.set_postfix(
                    loss=f"{running:.3f}",
                    tokens_per_step=f"{state['history'][-1]['tokens_per_step']:.2f}",
                )
            if time.monotonic() - last_save[0] >= 60.0 * save_minutes:
                save_state(False)
            if not progress and time.monotonic() - last_line >= HEARTBEAT_SECONDS:
                last_line = time.monotonic()
                done = settings.progress(state["step"], state["train_seconds"])
                say(
                    f"training: step {state['step']}, {minutes:.1f} min, {100 * done:.0f}% of "
                    f"the budget, {state['positions'] / state['train_seconds']:.0f} positions/s, "
                    f"loss {running:.3f}"
                )
        bar.close()
        if (
            not state["history"]
            or state["history"][-1]["step"] != state["step"]
            or state["history"][-1]["heldout_sequences"] != "all"
        ):
            run_eval(running if running is not None else float("nan"), final=True)
        else:
            # a resumed run with its budget already spent: write its files again (e.g. another save
            # dtype)
            if state["best"] and state["best"]["step"] == state["step"]:
                task.save(out, dtype=save_dtype)
            save_state(final=True)
    return {**state, "positions_per_second": state["positions"] / max(state["train_seconds"], 1e-9)}
