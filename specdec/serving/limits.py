"""Bounds of the server's HTTP side and what binding beyond loopback means (no dependency
beyond the core, so that the command line can name them without the ``serve`` extra)."""

from __future__ import annotations

import ipaddress

import attrs

from specdec.errors import InvalidInputError

MAX_BODY_BYTES = 4 * 1024 * 1024
BODY_TIMEOUT = 30.0
HEADER_TIMEOUT = 10.0
FIRST_BYTE_TIMEOUT = 2.0
KEEP_ALIVE_TIMEOUT = 5.0
MAX_CONNECTIONS = 256
MAX_CONNECTIONS_PER_CLIENT = 64
MAX_HEADER_BYTES = 16 * 1024
LOOPBACK_NAMES = frozenset({"localhost", "localhost.localdomain", "ip6-localhost", "ip6-loopback"})


@attrs.frozen(kw_only=True)
class Limits:
    """Bounds of the HTTP side: body size (bytes) and read times (seconds), connections (in all
    and per client address)."""

    max_body_bytes: int = MAX_BODY_BYTES
    body_timeout: float = BODY_TIMEOUT
    header_timeout: float = HEADER_TIMEOUT
    first_byte_timeout: float = FIRST_BYTE_TIMEOUT
    keep_alive_timeout: float = KEEP_ALIVE_TIMEOUT
    max_connections: int = MAX_CONNECTIONS
    max_connections_per_client: int = MAX_CONNECTIONS_PER_CLIENT
    max_header_bytes: int = MAX_HEADER_BYTES


def is_loopback(host: str) -> bool:
    """``host`` (a name or address) is this machine only."""
    name = host.strip("[]").lower().rstrip(".")
    if name in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def exposure_warning(host: str, api_key: str | None) -> str | None:
    """The one-line warning for a server bound beyond loopback without an API key, or None."""
    if api_key or is_loopback(host):
        return None
    return (
        f"specdec: warning: serving on {host or '0.0.0.0'} without an API key: anyone who can "
        "reach this address can use the model (set --api-key or SPECDEC_API_KEY)"
    )


def check_api_key(key: str | None) -> str | None:
    """The API key a server requires: ``key`` without surrounding whitespace (clients' headers
    lose it), None for None or "". Refused (InvalidInputError) when only whitespace, or holding a
    character an HTTP header does not carry as it is."""
    if not key:
        return None
    trimmed = key.strip()
    if not trimmed:
        raise InvalidInputError(
            "the API key is only whitespace; give a key (or 'none' on the command line for none)"
        )
    odd = next((c for c in trimmed if not " " <= c <= "~"), None)
    if odd is not None:
        raise InvalidInputError(
            f"the API key holds the character {odd!r}, which an HTTP header does not carry as it "
            "is; use printable ASCII"
        )
    return trimmed
