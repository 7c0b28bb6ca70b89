"""Errors of the OpenAI-compatible server, answered as OpenAI-shaped bodies
``{"error": {"message", "type", "param", "code"}}``."""

from __future__ import annotations

import json

from starlette.responses import JSONResponse


class APIError(Exception):
    """An error answered with an OpenAI-shaped body."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict | None = None,
    ):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = (
            status,
            message,
            type,
            param,
            code,
        )
        self.headers = headers or {}

    def body(self) -> dict:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers)

    def raw(self) -> tuple[list[tuple[bytes, bytes]], bytes]:
        """(headers, body) of the response, for the layers below Starlette."""
        body = json.dumps(self.body()).encode()
        headers = [
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
        ]
        headers += [
            (k.lower().encode("latin-1"), str(v).encode("latin-1")) for k, v in self.headers.items()
        ]
        return headers, body

    async def send(self, send) -> None:
        """Answer through an ASGI ``send``."""
        headers, body = self.raw()
        await send({"type": "http.response.start", "status": self.status, "headers": headers})
        await send({"type": "http.response.body", "body": body, "more_body": False})

    def http(self, reason: str) -> bytes:
        """The whole HTTP/1.1 response, for a connection that has no request to answer yet."""
        headers, body = self.raw()
        lines = [f"HTTP/1.1 {self.status} {reason}".encode()] + [k + b": " + v for k, v in headers]
        return b"\r\n".join(lines) + b"\r\n\r\n" + body


def bad(message: str, param: str | None = None, code: str | None = None) -> APIError:
    """A 400 ``invalid_request_error``."""
    return APIError(400, message, param=param, code=code)
