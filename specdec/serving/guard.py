"""What every HTTP request passes before the routes (an ASGI middleware), in this order:

0. Headers of at most ``max_header_bytes`` in all (431).
1. ``Host``: a loopback name (``localhost``, ``127.0.0.1``, ``[::1]``, any 127.x address), the
   host the server is bound to, a name of ``allowed_hosts``, or any IP address when bound to a
   wildcard address (0.0.0.0, ::); else 421. A web page whose name an attacker re-pointed at
   this machine (DNS rebinding) sends its own name, so it cannot read replies.
2. The API key, when one is set: ``Authorization: Bearer KEY`` on every route but ``/health``;
   else 401.
3. A request with a body (POST) must say ``Content-Type: application/json`` (415 otherwise: a
   web page cannot post JSON to another site without a CORS preflight, which this server does
   not answer), declare at most ``max_body_bytes`` (413 at once, before reading it) and send it
   within ``body_timeout`` seconds (408). The body is read here, bounded, and handed on whole.

Every refusal is an OpenAI-shaped error body.
"""

from __future__ import annotations

import hmac
import ipaddress
from typing import Iterable

import anyio

from specdec.serving.errors import APIError
from specdec.serving.limits import LOOPBACK_NAMES, Limits

WILDCARDS = frozenset({"", "0.0.0.0", "::", "*"})
OPEN_PATHS = frozenset({"/health"})
BODY_METHODS = frozenset({"POST", "PUT", "PATCH"})


def _host_name(value: str) -> str:
    """The name of a ``Host`` header value, without its port."""
    value = value.strip()
    if value.startswith("["):
        return value[1 : value.find("]")] if "]" in value else value
    if value.count(":") == 1:
        value = value.partition(":")[0]
    return value.lower().rstrip(".")


class HostCheck:
    """Whether a ``Host`` header names this server (see the module's docstring)."""

    def __init__(self, bind_host: str, allowed_hosts: Iterable[str] = ()):
        allowed = {h.strip().lower().rstrip(".") for h in allowed_hosts}
        self.any = "*" in allowed
        self.wildcard = bind_host.strip("[]") in WILDCARDS
        if not self.wildcard:
            allowed.add(bind_host.strip("[]").lower().rstrip("."))
        self.allowed = frozenset(allowed)

    def __call__(self, value: str | None) -> bool:
        # no Host: not a browser (HTTP/1.1 requires one; h11 refuses its absence)
        if value is None or self.any:
            return True
        name = _host_name(value)
        if name in self.allowed or name in LOOPBACK_NAMES:
            return True
        try:
            address = ipaddress.ip_address(name)
        except ValueError:
            return False
        return address.is_loopback or self.wildcard


class Guard:
    """The ASGI middleware of the module's docstring around ``app``."""

    def __init__(self, app, *, host_check: HostCheck, api_key: str | None, limits: Limits):
        self.app, self.host_check, self.limits = app, host_check, limits
        self.api_key = api_key.encode() if api_key else None

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers: dict[bytes, bytes] = {}
        size = 0
        for name, value in scope["headers"]:
            headers.setdefault(name, value)
            size += len(name) + len(value) + 4
        try:
            if size > self.limits.max_header_bytes:  # h11 bounds only headers still arriving
                raise APIError(
                    431,
                    f"the request's headers are over {self.limits.max_header_bytes} bytes",
                    code="headers_too_large",
                    headers={"Connection": "close"},
                )
            self._check_headers(scope, headers)
            if scope["method"] in BODY_METHODS:
                body = await self._read_body(headers, receive)
                if body is None:  # the client left
                    return
                receive = _replay(body, receive)
        except APIError as error:
            return await error.send(send)
        await self.app(scope, receive, send)

    def _check_headers(self, scope, headers: dict[bytes, bytes]) -> None:
        host = headers.get(b"host")
        if not self.host_check(None if host is None else host.decode("latin-1")):
            raise APIError(
                421,
                f"this server does not answer for the host {host.decode('latin-1')[:100]!r} (a "
                "loopback name or the host it is bound to; specdec serve --allowed-host adds "
                "names)",
                code="host_not_allowed",
                headers={"Connection": "close"},
            )
        if self.api_key is not None and scope["path"] not in OPEN_PATHS:
            scheme, _, key = headers.get(b"authorization", b"").partition(b" ")
            if scheme.lower() != b"bearer" or not hmac.compare_digest(key.strip(), self.api_key):
                raise APIError(
                    401,
                    "Incorrect or missing API key: send the header 'Authorization: Bearer <key>' "
                    "with the key the server was started with",
                    code="invalid_api_key",
                    headers={"WWW-Authenticate": "Bearer"},
                )
        if scope["method"] not in BODY_METHODS:
            return
        media, _, parameters = headers.get(b"content-type", b"").decode("latin-1").partition(";")
        charset = [
            p.split("=", 1)[1].strip().strip('"').lower()
            for p in parameters.split(";")
            if p.strip().lower().startswith("charset=")
        ]
        if media.strip().lower() != "application/json" or any(
            c not in ("utf-8", "utf8") for c in charset
        ):
            raise APIError(
                415,
                "the request body must be JSON in UTF-8, sent with the header "
                f"'Content-Type: application/json' (got {media.strip()[:60]!r})",
                code="unsupported_media_type",
            )
        declared = headers.get(b"content-length")
        if (
            declared is not None
            and declared.isdigit()
            and int(declared) > self.limits.max_body_bytes
        ):
            raise self._too_large()

    def _too_large(self) -> APIError:
        return APIError(
            413,
            f"the request body is larger than this server's limit of {self.limits.max_body_bytes} "
            "bytes (specdec serve --max-body-bytes)",
            code="request_too_large",
            headers={"Connection": "close"},
        )

    async def _read_body(self, headers, receive) -> bytes | None:
        """The whole body, or None when the client disconnected; 413 as soon as it is too long,
        408 when it takes longer than the body timeout."""
        chunks, size = [], 0
        try:
            with anyio.fail_after(self.limits.body_timeout):
                while True:
                    message = await receive()
                    if message["type"] == "http.disconnect":
                        return None
                    chunk = message.get("body", b"")
                    size += len(chunk)
                    if size > self.limits.max_body_bytes:
                        raise self._too_large()
                    chunks.append(chunk)
                    if not message.get("more_body", False):
                        return b"".join(chunks)
        except TimeoutError:
            raise APIError(
                408,
                f"the request body did not arrive within {self.limits.body_timeout:g} s",
                code="request_timeout",
                headers={"Connection": "close"},
            ) from None


def _replay(body: bytes, receive):
    """A ``receive`` that gives ``body`` first, then what the client sends (a disconnect)."""
    given = False

    async def replay():
        nonlocal given
        if not given:
            given = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()

    return replay
