"""uvicorn's h11 connection, bounded: a request's headers must arrive within the header timeout
(a connection that sends nothing, or half its headers, is closed: with a 408 when part of a
request came), at most ``max_connections`` connections are served at once (a request on one
more is answered 503 and its connection closed), headers are bounded in size (h11's limit), and
a request that is not HTTP gets an OpenAI-shaped 400 instead of uvicorn's plain text."""

from __future__ import annotations

import asyncio

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from specdec.serving.errors import APIError


def protocol_class(limits):
    """The protocol class uvicorn builds per connection, for ``limits`` (a ``guard.Limits``)."""

    class BoundedH11(H11Protocol):
        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self._header_timer: asyncio.TimerHandle | None = None
            self._arm_header_timer()

        def connection_lost(self, exc) -> None:
            self._disarm_header_timer()
            super().connection_lost(exc)

        def data_received(self, data: bytes) -> None:
            over = (
                len(self.connections) > limits.max_connections
                or len(self.tasks) >= limits.max_connections
            )
            self.app = _busy if over else self.config.loaded_app
            super().data_received(data)
            if self.conn.their_state is h11.IDLE and not self.transport.is_closing():
                self._arm_header_timer()  # headers of a request still to come
            else:
                self._disarm_header_timer()

        def on_response_complete(self) -> None:
            # uvicorn's keep-alive timer now closes an idle connection
            super().on_response_complete()
            self._disarm_header_timer()

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


async def _busy(scope, receive, send) -> None:
    await APIError(
        503,
        "this server has as many connections as it serves (specdec serve --max-connections); "
        "retry later",
        type="server_error",
        code="too_many_connections",
        headers={"Connection": "close", "Retry-After": "1"},
    ).send(send)
