"""Run the OpenAI-compatible application with uvicorn, and shut it down cleanly.

At SIGINT / SIGTERM (or ``should_exit``) the server stops accepting connections and the engine
stops taking requests (new ones get 503). With ``drain`` the requests in flight finish, for
at most ``shutdown_timeout`` seconds, after which those left are cancelled as without it: a
stream gets an error event and ``[DONE]``, a waiting client an OpenAI-shaped 503 (uvicorn
cancels what is still running ``CANCEL_GRACE`` seconds later). Without ``drain`` they are
cancelled at once. Then the engine closes: every slot is freed and the target's lease released,
and ``run()`` returns (the process exits 0: the signal is not raised again). A step that never
ends (a drafter or backend stuck) does not hold the shutdown: ``run()`` returns CANCEL_GRACE
seconds after the cancellation with ``stuck`` set, and ``specdec serve`` exits 1 at once. Nor does a
request's preparation that never ends (rendering or tokenizing its prompt on a worker thread): its
request is cancelled with the others, without waiting for the thread, ``run()`` returns with
``stuck_preparations`` counting such threads, and ``specdec serve`` exits 1 at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import threading
from typing import Callable

from specdec.serving.app import STALL_TIMEOUT, create_app
from specdec.serving.engine import Engine
from specdec.errors import require
from specdec.serving.guard import HostCheck
from specdec.serving.limits import Limits, check_api_key

CANCEL_GRACE = (
    5.0  # seconds the cancelled requests get to send their error, once the drain timed out
)
logger = logging.getLogger("specdec.serving")


class Server:
    """A uvicorn server around ``create_app(engine)``; ``run()`` blocks, ``start()`` runs it in a
    thread (tests, benchmarks) and ``stop()`` shuts it down. ``api_key``: required from clients
    (``Authorization: Bearer``) on every route but /health, trimmed of surrounding whitespace
    (``specdec.serving.limits.check_api_key``); ``allowed_hosts``: names the ``Host``
    header may give beside the loopback names and ``host`` (``"*"``: any); ``limits``:
    ``specdec.serving.guard.Limits``; ``announce``: called with a line saying what the shutdown
    does with the requests in flight when it begins (``specdec serve`` prints it)."""

    def __init__(
        self,
        engine: Engine,
        *,
        model_name: str,
        host: str = "127.0.0.1",
        port: int = 8000,
        drain: bool = True,
        shutdown_timeout: float = 30.0,
        log_level: str = "warning",
        aliases: tuple[str, ...] = (),
        api_key: str | None = None,
        allowed_hosts: tuple[str, ...] = (),
        limits: Limits | None = None,
        stall_timeout: float | None = None,
        announce: Callable[[str], None] | None = None,
    ):
        uvicorn = require("uvicorn", extra="serve", feature="specdec serve")
        require("starlette", extra="serve", feature="specdec serve")
        from specdec.serving.protocol import protocol_class  # optional: uvicorn (serve extra)

        self.engine = engine
        self.drain = drain
        self.shutdown_timeout = shutdown_timeout
        self.announce = announce
        self.limits = limits or Limits()
        # set when the drain timed out and what was left got cancelled
        self.drain_expired = threading.Event()
        self.app = create_app(
            engine,
            model_name=model_name,
            aliases=aliases,
            api_key=check_api_key(api_key),
            host_check=HostCheck(host, allowed_hosts),
            limits=self.limits,
            stall_timeout=STALL_TIMEOUT if stall_timeout is None else stall_timeout,
        )
        self.stuck = (
            False  # set when the engine's step did not end within CANCEL_GRACE of the shutdown
        )
        self.stuck_preparations = 0  # preparations still running on their threads at the end
        config = uvicorn.Config(
            self.app,
            host=host,
            port=port,
            log_level=log_level,
            lifespan="off",
            http=protocol_class(self.limits),
            timeout_keep_alive=self.limits.keep_alive_timeout,
            h11_max_incomplete_event_size=self.limits.max_header_bytes,
            timeout_graceful_shutdown=shutdown_timeout + CANCEL_GRACE,
            access_log=log_level == "debug",
        )
        outer = self

        class _Uvicorn(uvicorn.Server):
            async def shutdown(self, sockets=None):
                expiry = outer._begin_shutdown()
                try:
                    await super().shutdown(sockets)
                finally:
                    if expiry is not None:
                        expiry.cancel()
                # what the graceful period left running was cancelled; now free every slot (a step
                # that never ends gets CANCEL_GRACE seconds, then run() returns without it)
                outer.stuck = not await asyncio.to_thread(outer.engine.close, False, CANCEL_GRACE)

            @contextlib.contextmanager
            def capture_signals(self):
                """uvicorn's, without raising the signal again once shut down: a clean exit."""
                if threading.current_thread() is not threading.main_thread():
                    yield
                    return
                signals = (signal.SIGINT, signal.SIGTERM)
                original = {sig: signal.signal(sig, self.handle_exit) for sig in signals}
                try:
                    yield
                finally:
                    for sig, handler in original.items():
                        signal.signal(sig, handler)

        self._server = _Uvicorn(config)
        self._thread: threading.Thread | None = None

    def _begin_shutdown(self) -> asyncio.Task | None:
        """Stop taking requests; cancel those in flight now (no drain) or once the drain times
        out."""
        if self.announce is not None:
            self.announce(self.shutdown_line())
        if not self.drain:
            threading.Thread(target=self.engine.close, args=(False,), daemon=True).start()
            return None
        self.engine.stop_accepting()

        async def expire():
            await asyncio.sleep(self.shutdown_timeout)
            logger.warning(
                "the requests in flight did not finish within the shutdown timeout (%g s): "
                "cancelling them",
                self.shutdown_timeout,
            )
            # the cancellation is asked for before it is announced: a step that ends after the
            # announcement already cancels (the close thread only waits for the scheduler)
            self.engine.stop_accepting(drain=False)
            self.drain_expired.set()
            threading.Thread(target=self.engine.close, args=(False,), daemon=True).start()

        return asyncio.get_running_loop().create_task(expire())

    def shutdown_line(self) -> str:
        """What a shutdown beginning now does with the requests in flight, in one line."""
        stats = self.engine.stats()
        count = stats["running"] + stats["waiting"]
        if count == 0:
            return "shutting down: no request in flight"
        if not self.drain:
            return f"shutting down: cancelling the {count} request(s) in flight"
        return (
            f"shutting down: new requests get 503; the {count} request(s) in flight may finish "
            f"within {self.shutdown_timeout:g} s, then what is left is cancelled"
        )

    @property
    def port(self) -> int:
        """The port listened on (useful with port 0)."""
        for server in self._server.servers:
            for sock in server.sockets:
                return sock.getsockname()[1]
        return self._server.config.port

    def run(self) -> None:
        """Serve until a signal or ``stop()``; then close the engine."""
        try:
            self._server.run()
        finally:
            if self.stuck or not self.engine.close(drain=False, timeout=CANCEL_GRACE):
                self.stuck = True
                logger.error(
                    "the engine's step in progress did not end within %g s of the shutdown; "
                    "stopping without it (its slots are not freed)",
                    CANCEL_GRACE,
                )
            self.stuck_preparations = self.app.state.preparations.stats()[0]
            if self.stuck_preparations:
                logger.error(
                    "%d request preparation(s) (rendering or tokenizing a prompt) did not end "
                    "within the shutdown; stopping without them",
                    self.stuck_preparations,
                )

    def start(self, timeout: float = 30.0) -> "Server":
        """Serve in a background thread; returns once listening."""
        self._thread = threading.Thread(target=self.run, name="specdec-server", daemon=True)
        self._thread.start()
        waited = threading.Event()
        while not self._server.started:
            if not self._thread.is_alive():
                raise RuntimeError("the server stopped while starting (is the port in use?)")
            if waited.wait(0.02) or timeout <= 0:
                break
            timeout -= 0.02
        if not self._server.started:
            raise TimeoutError("the server did not start listening in time")
        return self

    def stop(self, timeout: float | None = 60.0) -> None:
        """Shut down as at a signal and wait for it."""
        self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout)

    @property
    def started(self) -> bool:
        return self._server.started
