"""``specdec serve``: an OpenAI-compatible server over an in-flight batching engine."""

from __future__ import annotations

import argparse
import sys


def add_parser(sub) -> None:
    parser = sub.add_parser("serve", help="serve a model over an OpenAI-compatible HTTP API (needs specdec[serve])")
    parser.add_argument("--model", default="smollm2-135m", help="a bundled name, model folder or .gguf")
    parser.add_argument("--drafter", default="redrafter", help="redrafter | medusa | lookup | none | a checkpoint folder")
    parser.add_argument("--backend", default=None, help="numpy | torch | mlx | any installed backend")
    parser.add_argument("--dtype", default=None, help="default: the fastest measured on this machine (specdec tune)")
    parser.add_argument("--device", default=None)
    parser.add_argument("--exact", action=argparse.BooleanOptionalAction, default=None,
                        help="exact mode: every request's tokens bit-identical to decoding it alone, at any dtype "
                             "(default: on where this machine's check holds)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--slots", type=int, default=8, help="requests decoded at once")
    parser.add_argument("--capacity", type=int, default=2048,
                        help="positions per request, prompt and completion (the context length served)")
    parser.add_argument("--max-queue", type=int, default=64, help="requests that may wait for a slot (then HTTP 429)")
    parser.add_argument("--max-prefill-tokens", type=int, default=512, help="prompt tokens admitted per step")
    parser.add_argument("--served-model-name", default=None, help="the model name clients use (default: --model)")
    parser.add_argument("--no-drain", action="store_true",
                        help="at shutdown cancel the requests in flight instead of letting them finish")
    parser.add_argument("--shutdown-timeout", type=float, default=30.0,
                        help="seconds the requests in flight get to finish at shutdown")
    parser.add_argument("--beam-width", type=int, default=None)
    parser.add_argument("--beam-length", type=int, default=None)
    parser.add_argument("--lookup", action=argparse.BooleanOptionalAction, default=None,
                        help="add a prompt-lookup beam to the drafter's beams (default: on beside ReDrafter)")
    parser.add_argument("--lookup-length", type=int, default=None, metavar="N",
                        help="tokens the prompt-lookup beam drafts, whatever the beam length (default 10; with "
                             "--drafter lookup, the length of prompt lookup alone)")
    parser.add_argument("--log-level", default="info", choices=("critical", "error", "warning", "info", "debug"))
    parser.set_defaults(func=cmd_serve)


def cmd_serve(args) -> int:
    from specdec.engine import Engine
    from specdec.errors import require

    require("uvicorn", extra="serve", feature="specdec serve")
    require("starlette", extra="serve", feature="specdec serve")
    from specdec.serving.server import Server

    from specdec.cli import lookup_option
    from specdec.exactness import describe as describe_exactness

    options = lookup_option(args)
    for name in ("beam_width", "beam_length"):
        if getattr(args, name) is not None:
            options[name] = getattr(args, name)
    engine = Engine(args.model, drafter=args.drafter, backend=args.backend, slots=args.slots, capacity=args.capacity,
                    max_queue=args.max_queue, max_prefill_tokens=args.max_prefill_tokens, dtype=args.dtype,
                    exact=args.exact, device=args.device, **options)
    name = args.served_model_name or str(args.model)
    print(f"specdec: serving {name!r} on http://{args.host}:{args.port}/v1 ({args.slots} slots of "
          f"{engine.context_length} tokens, drafter {args.drafter}; {describe_exactness(engine.target)})",
          file=sys.stderr)
    Server(engine, model_name=name, host=args.host, port=args.port, drain=not args.no_drain,
           shutdown_timeout=args.shutdown_timeout, log_level=args.log_level).run()
    return 0
