"""Run the OpenAI-compatible application with uvicorn, and shut it down cleanly.

At SIGINT / SIGTERM (or ``should_exit``) the server stops accepting connections and the engine
stops taking requests (new ones get 503). With ``drain`` the requests in flight finish, for
at most ``shutdown_timeout`` seconds, after which those left are cancelled; without it they
are cancelled at once (a stream gets an error event and ``[DONE]``, a waiting client a 503).
Then the engine closes: every slot is freed and the target's lease released.
"""

from __future__ import annotations

import asyncio
import threading

from specdec.engine import Engine
from specdec.errors import require


class Server:
    """A uvicorn server around ``create_app(engine)``; ``run()`` blocks, ``start()`` runs it in a
    thread (tests, benchmarks) and ``stop()`` shuts it down."""

    def __init__(self, engine: Engine, *, model_name: str, host: str = "127.0.0.1", port: int = 8000,
                 drain: bool = True, shutdown_timeout: float = 30.0, log_level: str = "info",
                 aliases: tuple[str, ...] = ()):
        uvicorn = require("uvicorn", extra="serve", feature="specdec serve")
        require("starlette", extra="serve", feature="specdec serve")
        from specdec.serving.app import create_app

        self.engine = engine
        self.drain = drain
        self.app = create_app(engine, model_name=model_name, aliases=aliases)
        config = uvicorn.Config(self.app, host=host, port=port, log_level=log_level, lifespan="off",
                                timeout_graceful_shutdown=shutdown_timeout, access_log=log_level == "debug")
        outer = self

        class _Uvicorn(uvicorn.Server):
            async def shutdown(self, sockets=None):
                outer._begin_shutdown()
                await super().shutdown(sockets)
                # what the graceful period left running was cancelled; now free every slot
                await asyncio.to_thread(outer.engine.close, False)

        self._server = _Uvicorn(config)
        self._thread: threading.Thread | None = None

    def _begin_shutdown(self) -> None:
        if self.drain:
            self.engine.stop_accepting()
        else:
            threading.Thread(target=self.engine.close, args=(False,), daemon=True).start()

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
            self.engine.close(drain=False)

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
