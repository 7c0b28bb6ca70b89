"""Options that several commands share, turned into keyword arguments of ``generate``."""

from __future__ import annotations

from specdec.errors import InvalidInputError
from specdec.generation.options import ALIASES, checkpoint_of, parse_options

DRAFTER_HELP = (
    "an installed drafter (redrafter, medusa, eagle, eagle3, lookup, draft_model, none, and "
    "plugins' own: `specdec plugins` lists them) or a checkpoint folder, with options after a "
    "colon: "
    "redrafter:w=4,l=5 (beam width and length), eagle:total_tokens=8, lookup:k=10 (its "
    "length), draft_model:draft=MODEL, or any of the drafter's own keywords by name (a "
    "wrong one lists them)"
)
# generate's options that a command's flags set, where it has them, and the flags
FLAGS = {
    "beam_width": "--beam-width",
    "beam_length": "--beam-length",
    "verifier": "--verifier",
    "speculation": "--speculation",
    "lookup": "--lookup or --lookup-length",
    "draft_length": "--lookup-length",
}


def drafter_options(args) -> tuple[str, dict]:
    """(drafter, ``generate``'s options) from ``--drafter NAME[:key=value,...]``
    (``specdec.generation.options.parse_options``) and the flags that set drafter options
    (--beam-width, --lookup, ...); an option given both ways is refused."""
    drafter, options = parse_options(args.drafter, aliases={**ALIASES, "drafter": "drafter_path"})
    if "drafter_path" in options:  # NAME:drafter=FOLDER, as bench's methods write a checkpoint
        drafter = checkpoint_of(drafter, options.pop("drafter_path"))
    flags = lookup_option(args, drafter)
    flags.update(
        {
            name: getattr(args, name)
            for name in ("beam_width", "beam_length", "verifier", "speculation")
            if getattr(args, name, None) is not None
        }
    )
    for name, value in flags.items():
        if name in options:
            raise InvalidInputError(
                f"{name} is given twice, in --drafter {args.drafter} and by "
                f"{FLAGS[name]}; drop one of them"
            )
        options[name] = value
    return drafter, options


def lookup_option(args, drafter: str) -> dict:
    """``generate``'s ``lookup`` option from --[no-]lookup and --lookup-length
    (for --drafter lookup, prompt lookup alone, --lookup-length is its own ``draft_length``)."""
    if args.lookup_length is None:
        return {} if args.lookup is None else {"lookup": args.lookup}
    if args.lookup is False:
        raise InvalidInputError(
            "--lookup-length sets the length of the prompt-lookup beam that "
            "--no-lookup turns off; drop one of them"
        )
    if drafter == "lookup" and args.lookup is None:
        return {"draft_length": args.lookup_length}
    return {"lookup": args.lookup_length}
