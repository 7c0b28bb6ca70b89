"""What a benchmark runs: specdec with a drafter, or a peer's own generation (transformers, mlx-lm)."""

from __future__ import annotations

from typing import Any

import attrs

from specdec.errors import InvalidInputError

# Peer kinds and the backend whose model objects they run on.
PEERS = {"hf": "torch", "hf-pld": "torch", "hf-assisted": "torch", "mlx-lm": "mlx", "mlx-lm-draft": "mlx"}
PLAIN = {"plain": "none"}  # every other specdec method is an installed drafter's name
OPTION_NAMES = {"w": "beam_width", "l": "beam_length", "choices": "choices", "verifier": "verifier",
                "n": "prompt_lookup_num_tokens", "draft": "draft_model", "drafter": "drafter_path",
                "top_t": "top_t", "sample": "sample", "lookup": "lookup", "k": "draft_length", "dtype": "dtype",
                "exact": "exact", "speculation": "speculation"}


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
        return {k: v for k, v in self.options.items() if k not in ("drafter_path", "dtype", "exact")}


def _value(text: str):
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return {"true": True, "false": False}.get(text.lower(), text)


def parse_method(spec: str) -> Method:
    """``kind[:key=value,...]``, e.g. ``redrafter:w=4,l=5``, ``medusa:choices=cpu16``, ``hf-pld:n=10``,
    ``redrafter:drafter=path/to/checkpoint``, ``redrafter:lookup=true`` (a prompt-lookup beam beside
    ReDrafter's; on by default as in ``generate``, ``redrafter:lookup=false`` for ReDrafter alone,
    ``redrafter:lookup=10`` for a lookup chain of 10 drafted tokens),
    ``lookup:k=10`` (our prompt lookup alone, drafting k tokens), ``hf:dtype=own`` (a peer in its own
    default dtype rather than the one our target runs in), ``plain:exact=false`` (our methods on a
    second target with exact mode off, ``specdec.tuning.exactness``, to measure what it costs),
    ``redrafter:speculation=always`` (every step drafts; the default, auto, chooses per step,
    ``specdec.decode.budget``). Keys: w, l, choices, verifier, top_t, sample, lookup, k, n, draft, dtype
    (peers only), exact, speculation (ours only); a specdec method also takes its drafter
    factory's own keyword options by name, e.g. ``eagle:total_tokens=8,depth=4`` (``generate``
    checks them against the factory and names the ones it takes)."""
    kind, _, rest = spec.partition(":")
    from specdec.plugins.registry import default_registry

    specdec_methods = [*PLAIN, *(n for n in default_registry().names("drafter") if n != PLAIN["plain"])]
    if kind not in specdec_methods and kind not in PEERS:
        raise InvalidInputError(f"unknown method {kind!r}; methods: {', '.join([*specdec_methods, *PEERS])}")
    options = {}
    for item in filter(None, rest.split(",")):
        key, eq, value = item.partition("=")
        own = kind not in PEERS and key.isidentifier()
        if not eq or key not in OPTION_NAMES and not own:
            raise InvalidInputError(f"method {spec!r}: bad option {item!r}; keys: {', '.join(OPTION_NAMES)}"
                                    + ("" if kind in PEERS else ", or the drafter's own options by name"))
        options[OPTION_NAMES.get(key, key)] = _value(value)
    if "exact" in options and (kind in PEERS or not isinstance(options["exact"], bool)):
        raise InvalidInputError(f"method {spec!r}: exact is true or false, and only for our methods")
    if "dtype" in options and kind not in PEERS:
        raise InvalidInputError(f"method {spec!r}: dtype is a peer's option; our methods run in the grid's dtype")
    if kind == "hf-assisted" and "draft_model" not in options or kind == "mlx-lm-draft" and "draft_model" not in options:
        raise InvalidInputError(f"method {kind!r} needs a draft model: {kind}:draft=MODEL")
    return Method(label=spec, kind=kind, options=options)
