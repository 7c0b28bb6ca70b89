"""uvicorn's h11 connection, bounded: a new connection must send its first byte within the
first-byte timeout and a request's headers must arrive within the header timeout (a connection
that sends nothing is closed; one that sent part of a request gets a 408), headers are bounded in
size (h11's limit), and a request that is not HTTP gets an OpenAI-shaped 400 instead of uvicorn's
plain text.

Connections are admitted when they open: at most ``max_connections`` in all and
``max_connections_per_client`` from one client address. A connection over either limit first
closes the connection (of that client, for the per-client limit) that has been idle the longest —
one that has sent nothing yet, or is between requests — so that idle connections never keep
out a client with a request; when every such connection is busy, the new one is refused: its
request is answered 503 and the connection closed."""

from __future__ import annotations

import asyncio

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from specdec.serving.errors import APIError

TOO_MANY = (
    "this server has as many connections as it serves (specdec serve --max-connections); "
    "retry later"
)
TOO_MANY_FROM_CLIENT = (
    "this client has as many connections open as the server allows one client (specdec serve "
    "--max-connections-per-client); retry later, or reuse a connection"
)


def protocol_class(limits):
    """The protocol class uvicorn builds per connection, for ``limits`` (a ``guard.Limits``)."""

    class BoundedH11(H11Protocol):
        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self._header_timer: asyncio.TimerHandle | None = None
            self._heard = False  # a byte came
            self._idle_since = self.loop.time()
            self._refused: str | None = None
            self._arm_header_timer()
            self._silence_timer = self.loop.call_later(
                min(limits.first_byte_timeout, limits.header_timeout), self._silent_too_long
            )
            self._admit()

        def connection_lost(self, exc) -> None:
            self._disarm_header_timer()
            self._silence_timer.cancel()
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            if not self._heard:
                self._heard = True
                self._silence_timer.cancel()
            self.app = self.config.loaded_app if self._refused is None else _busy(self._refused)
            super().data_received(data)
            if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
                self._arm_header_timer()  # headers of a request still to come
            else:
                self._disarm_header_timer()

        def on_response_complete(self) -> None:
            # uvicorn's keep-alive timer now closes an idle connection
            super().on_response_complete()
            self._idle_since = self.loop.time()
            self._disarm_header_timer()

        # -- admission --

        def _admit(self) -> None:
            """Admit this connection within the limits, closing the connection idle the longest
            when one is over; else refuse it."""
            others = [
                c
                for c in self.connections
                if c is not self and not c.transport.is_closing() and not _refused(c)
            ]
            address = self.client[0] if self.client else None
            same = [c for c in others if c.client and c.client[0] == address]
            if address is not None and len(same) >= limits.max_connections_per_client:
                if not _close_longest_idle(same):
                    self._refused = TOO_MANY_FROM_CLIENT
                    return
                others = [c for c in others if not c.transport.is_closing()]
            if len(others) >= limits.max_connections and not _close_longest_idle(others):
                self._refused = TOO_MANY

        def _idle(self) -> bool:
            """No request in progress: nothing sent yet, or between two requests."""
            return (
                self.conn.their_state is h11.IDLE
                and not self.conn.trailing_data[0]
                and (self.cycle is None or self.cycle.response_complete)
            )

        # -- timers --

        def _silent_too_long(self) -> None:
            if not self._heard and not self.transport.is_closing():
                self.transport.close()

        def _arm_header_timer(self) -> None:
            if self._header_timer is None:
                self._header_timer = self.loop.call_later(
                    limits.header_timeout, self._headers_timed_out
                )

        def _disarm_header_timer(self) -> None:
            timer, self._header_timer = getattr(self, "_header_timer", None), None
            if timer is not None:
                timer.cancel()

        def _headers_timed_out(self) -> None:
            self._header_timer = None
            if self.transport.is_closing() or self.conn.their_state is not h11.IDLE:
                return
            if self.conn.trailing_data[0]:  # part of a request came, and then nothing
                error = APIError(
                    408,
                    f"the request's headers did not arrive within {limits.header_timeout:g} s",
                    code="request_timeout",
                    headers={"Connection": "close"},
                )
                self.transport.write(error.http("Request Timeout"))
            self.transport.close()

        def send_400_response(self, msg: str) -> None:
            error = APIError(
                400,
                f"invalid HTTP request (malformed, or headers over {limits.max_header_bytes} "
                "bytes)",
                code="invalid_http",
                headers={"Connection": "close"},
            )
            self.transport.write(error.http("Bad Request"))
            self.transport.close()

    return BoundedH11


def _refused(connection) -> bool:
    return getattr(connection, "_refused", None) is not None


def _close_longest_idle(connections) -> bool:
    """Close the connection of ``connections`` idle the longest; False when none is idle."""
    idle = [c for c in connections if getattr(c, "_idle", None) and c._idle()]
    if not idle:
        return False
    min(idle, key=lambda c: c._idle_since).transport.close()
    return True


def _busy(message: str):
    """The application that answers a refused connection's request: 503 and close."""

    async def busy(scope, receive, send) -> None:
        await APIError(
            503,
            message,
            type="server_error",
            code="too_many_connections",
            headers={"Connection": "close", "Retry-After": "1"},
        ).send(send)

    return busy
