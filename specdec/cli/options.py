"""Options that several commands share, turned into keyword arguments of ``generate``."""

from __future__ import annotations

from specdec.errors import InvalidInputError


def lookup_option(args) -> dict:
    """``generate``'s ``lookup`` option from --[no-]lookup and --lookup-length (for --drafter lookup,
    prompt lookup alone, --lookup-length is its own ``draft_length``)."""
    if args.lookup_length is None:
        return {} if args.lookup is None else {"lookup": args.lookup}
    if args.lookup is False:
        raise InvalidInputError("--lookup-length sets the length of the prompt-lookup beam that --no-lookup turns off; "
                                "drop one of them")
    if getattr(args, "drafter", None) == "lookup" and args.lookup is None:
        return {"draft_length": args.lookup_length}
    return {"lookup": args.lookup_length}
