"""``specdec export`` and ``specdec import``: drafters in the layouts serving engines load
(``specdec.plugins.export``, docs/scale-out.md)."""

from __future__ import annotations

import sys

from specdec.errors import InvalidInputError
from specdec.models.files import parse_json
from specdec.plugins.export import describe, export, import_drafter


def add_parser(sub) -> None:
    export = sub.add_parser(
        "export",
        help="write a drafter in the layout TensorRT-LLM, vLLM, SGLang or llama.cpp loads "
        "(see docs/scale-out.md)",
    )
    export.add_argument(
        "drafter",
        help="a checkpoint folder (or a single-file one, e.g. a GGUF head), or redrafter / medusa "
        "(the one shipped for --model)",
    )
    export.add_argument(
        "--format",
        "--layout",
        dest="format",
        required=True,
        help="redrafter: apple (= tensorrt-llm); medusa: fasterdecoding "
        "(= tensorrt-llm) or vllm; eagle3: specforge (= sglang, tensorrt-llm), "
        "speculators (= vllm) or gguf (= llama.cpp)",
    )
    export.add_argument("--out", required=True, help="an empty folder to write")
    export.add_argument(
        "--model",
        default=None,
        help="the target (folder, bundled name or GGUF file): needed for a tied head, whose "
        "projection is stored, and for gguf, which carries the target's vocabulary; names the "
        "target in speculators' verifier.name_or_path",
    )
    export.add_argument(
        "--drop-shortlist",
        action="store_true",
        help="ReDrafter: export a shortlisted head over the full vocabulary (refused otherwise)",
    )
    export.add_argument(
        "--medusa-choices",
        default=None,
        help="Medusa: 'chain' or a JSON list of paths to record instead of the drafter's tree",
    )
    export.add_argument(
        "--dtype",
        default=None,
        choices=("float32", "float16", "bfloat16"),
        help="the stored weights' type (bfloat16 is taken by the gguf layout only); default: the "
        "checkpoint's own where the layout stores it, else float32",
    )
    export.add_argument("--overwrite", action="store_true", help="replace what --out holds")
    export.set_defaults(func=cmd_export)
    imp = sub.add_parser(
        "import",
        help="write a published drafter (Apple ReDrafter, FasterDecoding or vLLM Medusa, "
        "EAGLE-3 in the SpecForge, speculators or llama.cpp GGUF layout) as a specdec checkpoint",
    )
    imp.add_argument("folder", help="the published drafter's folder (or its GGUF file)")
    imp.add_argument("--out", required=True, help="an empty folder to write")
    imp.add_argument(
        "--dtype",
        default=None,
        choices=("float32", "float16"),
        help="the stored weights' type; default: the folder's own if one of these, else float32",
    )
    imp.add_argument("--overwrite", action="store_true", help="replace what --out holds")
    imp.set_defaults(func=cmd_import)


def medusa_choices(text: str | None):
    """``--medusa-choices``: None, "chain", or a JSON list of paths, each a non-empty list of
    ranks (integers >= 0), as tuples."""
    if text in (None, "chain"):
        return text
    usage = "give 'chain' or a JSON list of paths of ranks, e.g. [[0], [0, 0], [1]]"
    paths = parse_json(
        text, what=f"--medusa-choices {text!r:.40}", fix=usage, error=InvalidInputError
    )
    if not isinstance(paths, list) or not all(
        isinstance(path, list)
        and path
        and all(isinstance(rank, int) and not isinstance(rank, bool) and rank >= 0 for rank in path)
        for path in paths
    ):
        raise InvalidInputError(
            f"--medusa-choices must be 'chain' or a JSON list of paths of ranks (integers >= 0), "
            f"got {text!r:.60}: {usage}"
        )
    return [tuple(path) for path in paths]


def cmd_export(args) -> int:
    choices = medusa_choices(args.medusa_choices)
    result = export(
        args.drafter,
        args.format,
        args.out,
        model=args.model,
        drop_shortlist=args.drop_shortlist,
        choices=choices,
        dtype=args.dtype,
        overwrite=args.overwrite,
    )
    lines = describe(result)
    print(lines[0], file=sys.stderr)
    for line in lines[1:]:
        print(line, file=sys.stderr if line.startswith("note:") else sys.stdout)
    return 0


def cmd_import(args) -> int:
    result = import_drafter(args.folder, args.out, overwrite=args.overwrite, dtype=args.dtype)
    print(
        f"read the {result.format} layout; wrote the {result.drafter} drafter to {result.path} "
        "in specdec's own layout (use it as drafter=)",
        file=sys.stderr,
    )
    for line in describe(result)[1:]:
        print(line, file=sys.stderr)
    return 0
