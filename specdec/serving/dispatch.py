"""The scheduler thread's side of an ``Engine``: the requests in its ``Decoder`` by id, each
step run and its tokens delivered to their handles (stop strings and metrics included), requests
that fail settled alone, and a step that fails for no request in particular turned into a reset
that frees every slot and goes on serving."""

from __future__ import annotations

import time

from specdec.decode.loop import Decoder
from specdec.decode.plan import DecodePlan
from specdec.serving.handle import Handle
from specdec.serving.metrics import EngineMetrics
from specdec.types import StepResult

__all__ = ["Dispatch"]


class Dispatch:
    """Runs on the scheduler thread only; the engine reads ``decoder.counts()``, ``idle`` and
    ``step_started`` from other threads (single reads)."""

    def __init__(self, plan: DecodePlan, metrics: EngineMetrics, max_prefill_tokens):
        self.plan, self.metrics, self.max_prefill_tokens = plan, metrics, max_prefill_tokens
        self.decoder = Decoder(plan)
        self.handles: dict[int, Handle] = {}  # decoder request id -> handle, while in the decoder
        self.step_started: float | None = None  # perf_counter() when the step in progress began
        self.failed_steps = 0  # steps in a row that raised for no request in particular

    @property
    def idle(self) -> bool:
        return self.decoder.idle

    def cancel_all(self, now: float) -> None:
        for handle in list(self.handles.values()):
            self.cancel(handle, now)

    def enter(self, handle: Handle, now: float) -> None:
        if handle.done:
            return
        try:
            handle.id = self.decoder.submit(handle.request)
        except Exception as error:  # noqa: BLE001
            # refused by the decoder: this request fails, no other
            self.settle(handle, "error", error, now)
            return
        self.handles[handle.id] = handle

    def cancel(self, handle: Handle, now: float) -> None:
        if handle.done:
            return
        if handle.id is not None:
            self.decoder.cancel(handle.id)
        self.settle(handle, "cancelled", None, now)

    def settle(self, handle: Handle, reason: str, error: BaseException | None, now: float) -> None:
        """End ``handle`` (already out of the decoder) and count it."""
        handle.finish(reason, error, now)
        self.forget(handle, now)

    def forget(self, handle: Handle, now: float) -> None:
        if handle.id is not None:
            self.handles.pop(handle.id, None)
        metrics = self.metrics
        with metrics.lock:
            metrics.finished[handle.finish_reason] += 1
            metrics.histograms["request_latency_seconds"].observe(now - handle.submitted_at)

    def step(self) -> None:
        failures: list = []
        start = self.step_started = time.perf_counter()
        try:
            results = self.decoder.step(
                max_prefill_tokens=self.max_prefill_tokens,
                failures=failures,
                on_admit=lambda result: self.account(result, time.perf_counter()),
            )
        except Exception as error:  # noqa: BLE001
            # not pinned to requests: those in flight fail, the engine goes on; a second in a row
            # fails the waiting ones too (an error in the scheduling itself would otherwise
            # requeue them forever)
            self.failed_steps += 1
            self.reset(error, requeue=self.failed_steps < 2)
            return
        finally:
            self.step_started = None
        self.failed_steps = 0
        now = time.perf_counter()
        self.metrics.observe("step_seconds", now - start)
        for result in results:
            if not result.is_prefill:  # admissions were delivered before the decode step ran
                self.account(result, now)
        for request_id, error in failures:
            handle = self.handles.get(request_id)
            if handle is not None and not handle.done:
                self.settle(handle, "error", error, now)

    def account(self, result: StepResult, now: float) -> None:
        metrics = self.metrics
        prefill = result.is_prefill
        if prefill and result.requests:
            metrics.add("prefilled_prompts", len(result.requests))
        elif not prefill and result.requests:
            metrics.account_step(result, self.decoder.prefill_budget)
        for row, (request_id, tokens) in enumerate(zip(result.requests, result.new_tokens)):
            handle = self.handles.get(request_id)
            if handle is None or handle.done:
                continue
            if prefill:
                handle.admitted_at = now
                metrics.add("prompt_tokens", handle.prompt_tokens)
                metrics.observe("queue_time_seconds", now - handle.submitted_at)
            else:
                metrics.add("decode_tokens", len(tokens))
                metrics.observe("tokens_per_step", len(tokens))
            chunk = handle.take(list(tokens), now, metrics)
            if not prefill:
                why = result.plain_reasons[row] if result.plain_reasons else None
                handle.count_step(
                    int(result.num_drafted[row]),
                    int(result.num_accepted[row]),
                    len(chunk.tokens),
                    why,
                )
            # ended by a stop string: the decoder does not know yet
            if chunk.finish_reason is not None:
                self.decoder.cancel(request_id, chunk.finish_reason)
            handle.push(chunk, chunk.finish_reason, None, now)
            if chunk.finish_reason is not None:
                self.forget(handle, now)

    def reset(self, error: BaseException, requeue: bool = True) -> None:
        """A step raised for no request in particular: fail the requests being decoded, free
        every slot (with a fresh decoder if closing the old one fails too), queue again those
        still waiting (``requeue``; else fail them too), and go on."""
        now = time.perf_counter()
        self.metrics.add("engine_resets")
        handles = sorted(self.handles.values(), key=lambda h: h.id)
        try:
            self.decoder.close("error")
        except Exception:  # noqa: BLE001 - start afresh: release what the target still holds
            self.decoder.abandon()
            for slot in range(int(self.plan.target.num_slots)):
                try:
                    self.plan.target.release(slot)
                except Exception:  # noqa: BLE001 - a free slot refuses release
                    pass
            self.decoder = Decoder(self.plan)
        self.handles.clear()
        for handle in handles:
            if handle.done:
                continue
            if requeue and handle.admitted_at is None:  # waiting: no part in the failed step
                handle.id = None
                self.enter(handle, now)
            else:
                self.settle(handle, "error", error, now)
