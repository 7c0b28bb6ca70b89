"""``specdec.Engine``: in-flight batching with speculation.

A scheduler thread runs a ``specdec.decode.loop.Decoder`` over a target loaded with N request slots.
``submit`` may be called at any time from any thread: the request waits in a bounded queue
(``QueueFullError`` when it is full), is admitted when a slot is free (its prompt prefilled in
chunks, at most ``max_prefill_tokens`` prompt tokens per step, packed into the forward of the
requests being decoded, so long prompts do not stall them), and its tokens reach its ``Handle``
as each step accepts them. A request that finishes, hits a stop string or is cancelled frees its
slot in that step.

Each request draws its randomness from its own generator and every verifier is the ``exact``
tree walk (greedy at temperature 0), so greedy and sampled requests share the engine and a
request's tokens do not depend on what else runs (``specdec.decode.requests``). A request whose step
raises fails alone (``Decoder.step(failures=...)``); an error that cannot be pinned to requests
fails those in flight, and the engine frees every slot and goes on serving.

The target is leased for the engine's lifetime (``specdec.decode.lease``): ``generate`` on it
meanwhile raises ``TargetBusyError``. ``close(drain=True)`` finishes what was submitted,
``close(drain=False)`` cancels it.
"""

from __future__ import annotations

import atexit
import itertools
import threading
import time
import weakref
from collections import deque
from typing import Any, Sequence

import numpy as np

from specdec import compute
from specdec.capabilities import verifier_caps
from specdec.decode import lease
from specdec.errors import InvalidInputError
from specdec.decode.plan import DecodePlan
from specdec.decode.requests import Request
from specdec.generation.arguments import context_length
from specdec.generation.components import DRAFTING_OPTIONS, decode_plan, resolve_drafter
from specdec.generation.loading import load, load_backend
from specdec.plugins.registry import default_registry
from specdec.serving.admission import RequestForm, check_stops
from specdec.serving.dispatch import Dispatch
from specdec.serving.metrics import EngineMetrics
from specdec.serving.handle import (
    Completion,
    EngineClosedError,
    Handle,
    QueueFullError,
    RequestFailedError,
)
from specdec.slots import TREE_ROOM

__all__ = ["Engine", "EngineClosedError", "QueueFullError", "RequestFailedError"]

_LIVE: "weakref.WeakSet[Engine]" = weakref.WeakSet()  # engines whose scheduler may still run
EXIT_WAIT = 10.0  # seconds an engine left open gets to stop its step when the interpreter exits


def _close_at_exit() -> None:
    """Cancel what engines left open are running before the interpreter exits: a scheduler
    thread stopped in the middle of a framework's forward aborts the process. Registered again
    by every engine once its target is loaded, so that it runs before the exit handlers of the
    framework that target imported (atexit runs the last registered first)."""
    for engine in list(_LIVE):
        try:
            # a step that never ends does not hold the exit
            engine.close(drain=False, timeout=EXIT_WAIT)
        except Exception:  # noqa: BLE001 - exiting anyway; the other engines still get closed
            pass


class Engine:
    """In-flight batching over one target with ``slots`` request slots (module docstring).

    model: a model folder, a bundled name or a loaded target (``specdec.load(..., slots=N)``);
    drafter, backend, dtype, device, exact and ``**options`` as in ``specdec.generate``
    (the verifier is ``exact`` unless ``verifier=`` names another). capacity: positions a request
    may use, prompt and new tokens (None: the model's context, at most
    ``specdec.slots.DEFAULT_CAPACITY`` less the tree room); a target loaded here gets ``tree_room``
    (default ``specdec.slots.TREE_ROOM``) more per slot for the draft tree of a request's last
    steps.
    max_queue: requests that may wait for a slot before ``submit`` raises QueueFullError.
    max_prefill_tokens: prompt tokens per step, in chunks beside the running requests' trees
    (a longer prompt is split over several steps; "auto", the default: the most that keep a step
    within twice the running requests' step, from the measured costs, ``specdec.decode.budget``;
    None: no bound).
    speculation (an option, as in ``generate``): "auto" (the default: each step, every request
    drafts what the costs and its acceptance say pays), "always", "never", or a
    ``specdec.decode.budget.Speculation``.
    max_new_tokens: the default of ``submit``.
    """

    def __init__(
        self,
        model: Any,
        drafter: Any = "redrafter",
        backend: str | None = None,
        *,
        slots: int = 4,
        capacity: int | None = None,
        max_queue: int = 64,
        max_prefill_tokens: int | str | None = "auto",
        max_new_tokens: int = 128,
        dtype: str | None = None,
        device: str | None = None,
        exact: bool | None = None,
        tree_room: int | None = None,
        registry=None,
        **options: Any,
    ):
        if isinstance(capacity, bool) or (
            capacity is not None and (not isinstance(capacity, int) or capacity < 2)
        ):
            raise InvalidInputError(
                f"capacity must be an integer >= 2 (positions per request), got {capacity!r}"
            )
        backend, named, options, drafting = engine_drafter(
            drafter, backend, options, registry, model
        )

        def build():
            if hasattr(model, "num_slots"):
                target = model
                room = (
                    tree_room
                    if tree_room is not None
                    else min(TREE_ROOM, int(target.capacity) // 4)
                )
            else:
                room = TREE_ROOM if tree_room is None else tree_room
                target = load(
                    model,
                    backend,
                    dtype=dtype,
                    device=device,
                    slots=slots,
                    capacity=None if capacity is None else capacity + room,
                    exact=exact,
                    registry=registry,
                )
            plan = decode_plan(
                target, named, backend, exact=exact, registry=registry, **drafting, **options
            )
            return plan, room

        self._launch(
            build,
            capacity=capacity,
            max_queue=max_queue,
            max_prefill_tokens=max_prefill_tokens,
            max_new_tokens=max_new_tokens,
        )

    @classmethod
    def from_plan(
        cls,
        plan: DecodePlan,
        *,
        capacity: int | None = None,
        tree_room: int | None = None,
        max_queue: int = 64,
        max_prefill_tokens: int | str | None = "auto",
        max_new_tokens: int = 128,
    ) -> "Engine":
        """An engine over a plan (``specdec.decode_plan``); its verifier must
        serve every sampling setting the requests use (``exact`` does)."""
        engine = cls.__new__(cls)
        room = (
            tree_room if tree_room is not None else min(TREE_ROOM, int(plan.target.capacity) // 4)
        )
        engine._launch(
            lambda: (plan, room),
            capacity=capacity,
            max_queue=max_queue,
            max_prefill_tokens=max_prefill_tokens,
            max_new_tokens=max_new_tokens,
        )
        return engine

    def _launch(self, build, **settings) -> None:
        """Start the scheduler thread, which loads the target (``build``: (plan, tree room)) and
        then serves: every array of the target and drafter is made and used on that thread (MLX
        ties unevaluated arrays to the thread that made them), or on the process's compute thread
        where the backend asks for one (``specdec.compute``: torch). Returns once it serves; raises
        what building raised."""
        for name, low in (("max_queue", 0), ("max_new_tokens", 1)):
            value = settings[name]
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise InvalidInputError(f"{name} must be an integer >= {low}, got {value!r}")
        budget = settings["max_prefill_tokens"]
        if budget not in (None, "auto") and (
            isinstance(budget, bool) or not isinstance(budget, int) or budget < 1
        ):
            raise InvalidInputError(
                f"max_prefill_tokens must be a positive integer, 'auto' or None, got {budget!r}"
            )
        ready, failed = threading.Event(), []

        def main():
            try:
                plan, room = build()
                compute.run_for(plan.backend, self._configure, plan, tree_room=room, **settings)
            except BaseException as error:  # noqa: BLE001 - raised again by the constructor
                failed.append(error)
                return
            finally:
                ready.set()
            self._run()

        self._thread = threading.Thread(target=main, name="specdec-engine", daemon=True)
        _LIVE.add(self)
        self._thread.start()
        ready.wait()
        if failed:
            self._thread.join()
            raise failed[0]
        atexit.unregister(_close_at_exit)
        atexit.register(_close_at_exit)

    def _configure(
        self,
        plan: DecodePlan,
        *,
        capacity,
        tree_room,
        max_queue,
        max_prefill_tokens,
        max_new_tokens,
    ):
        if isinstance(tree_room, bool) or not isinstance(tree_room, int) or tree_room < 0:
            raise InvalidInputError(f"tree_room must be an integer >= 0, got {tree_room!r}")
        target = plan.target
        limit = int(target.capacity) - tree_room
        model_context = context_length(target)
        if model_context is not None:
            limit = min(limit, model_context)
        if capacity is not None:
            limit = min(limit, capacity)
        if limit < 2:
            raise InvalidInputError(
                f"the target's slots hold {target.capacity} positions, which leaves no room for "
                f"requests beside a draft tree of {tree_room}: load it with a larger capacity"
            )
        plan.check_tree_room(
            tree_room + 1, f", or give the engine a larger tree_room (now {tree_room})"
        )
        self.plan = plan
        self.target = target
        self.context_length = limit
        self.tokenizer = getattr(target, "tokenizer", None)
        self.chat_template = getattr(target, "chat_template", None)
        self.num_slots = int(target.num_slots)
        self.max_queue = max_queue
        self.max_prefill_tokens = max_prefill_tokens
        self.max_new_tokens = max_new_tokens
        self.form = RequestForm(
            vocab_size=int(target.vocab_size),
            context_length=limit,
            max_new_tokens=max_new_tokens,
            eos_token_ids=tuple(plan.eos_token_ids or getattr(target, "eos_token_ids", ())),
            tokenizer=self.tokenizer,
            chat_template=self.chat_template,
            samples=verifier_caps(plan.verifier, plan.source("verifier")).samples,
        )
        self.metrics = EngineMetrics()
        self._cond = threading.Condition()
        self._inbox: deque = deque()
        self._closing = False
        self._drain = True
        self._stopped = False
        self._ids = itertools.count()
        lease.acquire(target)
        try:
            self._dispatch = Dispatch(plan, self.metrics, max_prefill_tokens)
        except BaseException:
            lease.release(target)
            raise

    # -- the public side (any thread) --

    def encode(self, prompt: Any) -> list[int]:
        """Token ids of one prompt: text, token ids, or a chat (rendered with the model's
        template)."""
        return self.form.encode(prompt)

    def submit(
        self,
        prompt: Any,
        *,
        max_new_tokens: int | None = None,
        temperature: float = 0.0,
        top_k: int | None = None,
        top_p: float | None = None,
        seed: int | Sequence[int] | None = None,
        stop: str | Sequence[str] | None = None,
        stop_token_ids: Sequence[int] = (),
        ignore_eos: bool = False,
    ) -> Handle:
        """Queue one request and return its Handle; raises QueueFullError when ``max_queue``
        requests already wait, EngineClosedError once closing, InvalidInputError for a prompt that
        does not fit ``context_length`` with ``max_new_tokens`` (None: the engine's
        ``max_new_tokens``, or fewer where the context ends sooner).

        prompt: text, token ids, a chat, or a ``specdec.Request`` (then only ``stop`` may be given
        too). seed: an int (the stream ``[seed, 0]``, as ``generate(..., seed=seed)`` for one
        prompt) or None. stop: strings that end the request; its text stops before them.
        stop_token_ids: tokens that end it (emitted; the model's EOS too unless ``ignore_eos``).
        """
        if self._closing:
            raise EngineClosedError("the engine is shutting down and takes no new requests")
        stop, stop_token_ids = check_stops(stop, stop_token_ids)
        request = self.form.request(
            prompt,
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            seed=seed,
            stop_token_ids=stop_token_ids,
            ignore_eos=ignore_eos,
        )
        handle = Handle(self.post, request, stop=stop, tokenizer=self.tokenizer)
        with self._cond:
            if self._closing:
                raise EngineClosedError("the engine is shutting down and takes no new requests")
            waiting, _ = self._counts()
            if waiting >= self.max_queue:
                self.metrics.add("requests_rejected")
                raise QueueFullError(
                    f"{waiting} requests are waiting for a slot, the most this engine queues "
                    f"(max_queue={self.max_queue}); retry later"
                )
            self._inbox.append(("submit", handle))
            self._cond.notify_all()
        self.metrics.add("requests_submitted")
        return handle

    def check_request(self, request: Request) -> None:
        """Raise InvalidInputError unless ``request`` fits: ids in the vocabulary, prompt and
        max_new_tokens within ``context_length``."""
        self.form.check(request)

    def generate(self, prompt: Any, **settings: Any) -> Completion:
        """``submit(prompt, **settings).result()``."""
        return self.submit(prompt, **settings).result()

    @property
    def speculation(self):
        """The engine's speculation policy (``specdec.decode.budget.Speculation``): what "auto"
        has measured and chosen so far (its ``realized`` rates per row count, say); read it
        between bursts, not to change it."""
        return self._dispatch.decoder.speculation

    def stats(self) -> dict:
        """{"slots", "running", "waiting", "free_slots", "closing", "alive", "step_seconds"} now;
        step_seconds: how long the step in progress has run (0.0 between steps), which a step
        stuck in a drafter or the backend makes grow (the server's /health then says so)."""
        with self._cond:
            waiting, running = self._counts()
            started = self._dispatch.step_started
            return {
                "slots": self.num_slots,
                "running": running,
                "waiting": waiting,
                "free_slots": self.num_slots - running,
                "closing": self._closing,
                "alive": self._thread.is_alive(),
                "step_seconds": 0.0 if started is None else time.perf_counter() - started,
            }

    def _counts(self) -> tuple[int, int]:
        """(waiting, running) now; called holding ``self._cond``. The decoder's queue and slots
        are read from outside its thread: their lengths are single reads."""
        waiting, running = self._dispatch.decoder.counts()
        inbox = sum(1 for kind, _ in self._inbox if kind == "submit")
        return inbox + waiting, running

    @property
    def closed(self) -> bool:
        return self._stopped

    def stop_accepting(self, drain: bool = True) -> None:
        """Refuse new requests (EngineClosedError) and let those submitted finish; with
        ``drain=False`` cancel them at the next step instead. Returns at once (``close`` then
        waits for the scheduler)."""
        with self._cond:
            self._closing = True
            self._drain = self._drain and drain
            self._cond.notify_all()

    def close(self, drain: bool = True, timeout: float | None = None) -> bool:
        """Stop taking requests; ``drain``: finish those submitted, else cancel them. Then stop the
        scheduler, free every slot and release the target's lease. Idempotent. timeout: seconds
        to wait for the drain or the cancellation (None: as long as it takes); after a drain that
        timed out, what is left is cancelled and the scheduler gets as long again. Returns False
        when it still runs then (a step that does not end: the engine stays closed to requests and
        keeps its slots and the target's lease), True once closed."""
        self.stop_accepting(drain)
        if threading.current_thread() is not self._thread:
            self._thread.join(timeout)
            if self._thread.is_alive() and drain:
                with self._cond:
                    self._drain = False
                    self._cond.notify_all()
                self._thread.join(timeout)
            if self._thread.is_alive():
                return False
        with self._cond:
            if self._stopped:
                return True
            self._stopped = True
        try:
            compute.run_for(self.plan.backend, self._dispatch.decoder.close)
        finally:
            lease.release(self.target)
        return True

    def __enter__(self) -> "Engine":
        return self

    def __exit__(self, *exc) -> None:
        self.close(drain=exc[0] is None)

    def post(self, command) -> None:
        """Queue ``command`` for the scheduler thread (a handle's cancel, a close)."""
        with self._cond:
            self._inbox.append(command)
            self._cond.notify_all()

    # -- the scheduler thread --

    def _sync(self) -> None:
        """Finish the work the backend left pending on the target, so that another thread can
        use it once the scheduler stops (MLX ties pending work to the thread that queued it)."""
        backend = self.plan.backend
        backend.to_numpy(backend.from_numpy(np.zeros(1, dtype=np.int64), self.target))

    def _run(self) -> None:
        try:
            self._serve()
        finally:
            try:
                compute.run_for(self.plan.backend, self._sync)
            except Exception:  # noqa: BLE001 - nothing pending, or a backend that cannot say
                pass

    def _serve(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._inbox or not self._dispatch.idle or self._closing)
                commands = list(self._inbox)
                self._inbox.clear()
                cancel_all = self._closing and not self._drain
            if compute.run_for(self.plan.backend, self._turn, commands, cancel_all):
                continue
            with self._cond:
                if self._closing and not self._inbox and self._dispatch.idle:
                    return

    def _turn(self, commands: list, cancel_all: bool) -> bool:
        """Apply the commands taken from the inbox, then run a step if any request is in the
        decoder (on the compute thread where the backend wants one); returns whether it ran."""
        now = time.perf_counter()
        dispatch = self._dispatch
        for kind, handle in commands:
            if kind == "submit":
                dispatch.enter(handle, now)
            else:
                dispatch.cancel(handle, now)
        if cancel_all:
            dispatch.cancel_all(now)
        if dispatch.idle:
            return False
        dispatch.step()
        return True


def engine_drafter(drafter, backend, options: dict, registry=None, model=None):
    """(backend name, resolved drafter, its options, the drafting options) as an Engine takes
    them, checked before any model loads (``specdec serve`` checks a command line with it);
    ``model``: a loaded target, whose backend serves when ``backend`` is None."""
    backend = load_backend(backend, _registry(registry), model).name
    options = {"verifier": "exact", **options}  # it serves greedy and sampled requests alike
    drafting = {k: options.pop(k) for k in DRAFTING_OPTIONS if k in options}
    return (
        backend,
        resolve_drafter(drafter, backend, options, _registry(registry)),
        options,
        drafting,
    )


def _registry(registry):
    return registry or default_registry()
