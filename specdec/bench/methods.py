"""What a benchmark runs: specdec with a drafter, or a peer's own generation
(transformers, mlx-lm)."""

from __future__ import annotations

from typing import Any

import attrs

from specdec.errors import InvalidInputError
from specdec.generation import options

# Peer kinds and the backend whose model objects they run on.
PEERS = {
    "hf": "torch",
    "hf-pld": "torch",
    "hf-assisted": "torch",
    "mlx-lm": "mlx",
    "mlx-lm-draft": "mlx",
}
PLAIN = {"plain": "none"}  # every other specdec method is an installed drafter's name
# A method's keys: generate's short names, the bench's own, and option names spelled out.
ALIASES = {**options.ALIASES, "n": "prompt_lookup_num_tokens", "drafter": "drafter_path"}
OPTION_NAMES = {
    **ALIASES,
    **{
        key: key
        for key in (
            "choices",
            "verifier",
            "top_t",
            "sample",
            "lookup",
            "dtype",
            "exact",
            "speculation",
        )
    },
}
# Refused as a method's keys: what the bench sets itself (a method's dtype and exact: below).
OWN = tuple(name for name in options.OWN_ARGUMENTS if name not in ("dtype", "exact"))


@attrs.frozen(kw_only=True)
class Method:
    """kind: "plain", an installed drafter's name (specdec) or a peer kind from ``PEERS``."""

    label: str
    kind: str
    options: dict = attrs.field(factory=dict)

    @property
    def is_peer(self) -> bool:
        return self.kind in PEERS

    @property
    def peer_backend(self) -> str | None:
        return PEERS.get(self.kind)

    @property
    def drafter(self) -> str:
        return self.options.get("drafter_path") or PLAIN.get(self.kind, self.kind)

    @property
    def exact(self) -> bool | None:
        """The target's exact mode this method runs with (None: the default, on where it holds)."""
        return self.options.get("exact")

    @property
    def generate_options(self) -> dict[str, Any]:
        return {
            k: v for k, v in self.options.items() if k not in ("drafter_path", "dtype", "exact")
        }


def parse_method(spec: str) -> Method:
    """``kind[:key=value,...]``, e.g. ``redrafter:w=4,l=5``, ``medusa:choices=cpu16``,
    ``hf-pld:n=10``, ``redrafter:drafter=path/to/checkpoint``, ``redrafter:lookup=true``
    (a prompt-lookup beam beside ReDrafter's; on by default as in ``generate``,
    ``redrafter:lookup=false`` for ReDrafter alone, ``redrafter:lookup=10`` for a lookup chain of 10
    drafted tokens), ``lookup:k=10`` (our prompt lookup alone, drafting k tokens), ``hf:dtype=own``
    (a peer in its own default dtype rather than the one our target runs in), ``plain:exact=false``
    (our methods on a second target with exact mode off, ``specdec.tuning.exactness``, to measure
    what it costs), ``redrafter:speculation=always`` (every step drafts; the default, auto, chooses
    per step, ``specdec.decode.budget``). Keys: w, l, choices, verifier, top_t, sample, lookup, k,
    n, draft, dtype (peers only), exact, speculation (ours only); a specdec method also takes its
    drafter factory's own keyword options by name, e.g. ``eagle:total_tokens=8,depth=4``
    (``generate`` checks them against the factory and names the ones it takes)."""
    kind, settings = options.parse_options(spec, aliases=ALIASES, own=OWN, what="method")
    from specdec.plugins.registry import default_registry

    specdec_methods = [
        *PLAIN,
        *(n for n in default_registry().names("drafter") if n != PLAIN["plain"]),
    ]
    if kind not in specdec_methods and kind not in PEERS:
        raise InvalidInputError(
            f"unknown method {kind!r}; methods: {', '.join([*specdec_methods, *PEERS])}"
        )
    unknown = [key for key in settings if key not in OPTION_NAMES.values()] if kind in PEERS else []
    if unknown:
        raise InvalidInputError(
            f"method {spec!r}: bad option {unknown[0]!r}; a peer's keys: {', '.join(OPTION_NAMES)}"
        )
    if "exact" in settings and (kind in PEERS or not isinstance(settings["exact"], bool)):
        raise InvalidInputError(
            f"method {spec!r}: exact is true or false, and only for our methods"
        )
    if "dtype" in settings and kind not in PEERS:
        raise InvalidInputError(
            f"method {spec!r}: dtype is a peer's option; our methods run in the grid's dtype"
        )
    if kind in ("hf-assisted", "mlx-lm-draft") and "draft_model" not in settings:
        raise InvalidInputError(f"method {kind!r} needs a draft model: {kind}:draft=MODEL")
    return Method(label=spec, kind=kind, options=settings)
