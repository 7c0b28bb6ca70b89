"""``specdec serve``: an OpenAI-compatible server over an in-flight batching engine."""

from __future__ import annotations

import argparse
import os
import sys

from specdec.cli.common import add_speculation_arg, numpy_fallback_note, positive
from specdec.cli.options import DRAFTER_HELP, drafter_options
from specdec.errors import InvalidInputError, require
from specdec.serving import limits as bounds
from specdec.serving.engine import Engine, engine_drafter
from specdec.serving.limits import Limits, check_api_key, exposure_warning
from specdec.slots import TREE_ROOM
from specdec.tuning.exactness import describe as describe_exactness

API_KEY_VARIABLE = "SPECDEC_API_KEY"


def add_parser(sub) -> None:
    parser = sub.add_parser(
        "serve", help="serve a model over an OpenAI-compatible HTTP API (needs specdec[serve])"
    )
    parser.add_argument(
        "--model",
        default="smollm2-135m",
        help="a bundled name, model folder or .gguf (default smollm2-135m)",
    )
    parser.add_argument(
        "--drafter", default="redrafter", metavar="NAME[:key=value,...]", help=DRAFTER_HELP
    )
    parser.add_argument(
        "--backend", default=None, help="numpy | torch | mlx | any installed backend"
    )
    parser.add_argument(
        "--dtype", default=None, help="default: the fastest measured on this machine (specdec tune)"
    )
    parser.add_argument("--device", default=None)
    parser.add_argument(
        "--exact",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="exact mode: every request's tokens bit-identical to decoding it alone, at any dtype "
        "(default: on where this machine's check holds)",
    )
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (127.0.0.1)")
    parser.add_argument(
        "--port", type=_port, default=8000, help="TCP port, 1-65535 (0: any free one; 8000)"
    )
    parser.add_argument(
        "--slots", type=int, default=8, help="requests decoded at once (default %(default)s)"
    )
    parser.add_argument(
        "--capacity",
        type=int,
        default=2048,
        help="positions per request, prompt and completion (the context length served; "
        "default 2048)",
    )
    parser.add_argument(
        "--tree-room",
        type=int,
        default=None,
        metavar="N",
        help=f"positions each slot keeps beyond --capacity for a step's draft "
        f"tree (default {TREE_ROOM}); a drafter whose trees hold more than "
        "N + 1 nodes is refused at start",
    )
    parser.add_argument(
        "--max-queue",
        type=int,
        default=64,
        help="requests that may wait for a slot (then HTTP 429)",
    )
    parser.add_argument(
        "--max-prefill-tokens",
        type=_prefill_tokens,
        default="auto",
        metavar="auto|N",
        help="prompt tokens a step carries beside the running requests (default auto: the most "
        "that keep their step within twice its time, from this machine's measured costs)",
    )
    add_speculation_arg(parser)
    parser.add_argument(
        "--served-model-name", default=None, help="the model name clients use (default: --model)"
    )
    parser.add_argument(
        "--no-drain",
        action="store_true",
        help="at shutdown cancel the requests in flight instead of letting them finish",
    )
    parser.add_argument(
        "--shutdown-timeout",
        type=float,
        default=30.0,
        help="seconds the requests in flight get to finish at shutdown",
    )
    parser.add_argument(
        "--stall-timeout",
        type=float,
        default=60.0,
        help="seconds one scheduler step, or one request's preparation (rendering and tokenizing "
        "its prompt), may run before /health answers 503 'stalled'",
    )
    parser.add_argument("--beam-width", type=int, default=None)
    parser.add_argument("--beam-length", type=int, default=None)
    parser.add_argument(
        "--lookup",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="add a prompt-lookup beam to the drafter's beams (default: on beside ReDrafter)",
    )
    parser.add_argument(
        "--lookup-length",
        type=int,
        default=None,
        metavar="N",
        help="tokens the prompt-lookup beam drafts, whatever the beam length (default 10; with "
        "--drafter lookup, the length of prompt lookup alone)",
    )
    parser.add_argument(
        "--api-key",
        default=None,
        metavar="KEY",
        help="require 'Authorization: Bearer KEY' on every route but /health (default: "
        "$SPECDEC_API_KEY, which other users cannot read in the process list; 'none': no key; "
        "surrounding spaces are trimmed)",
    )
    parser.add_argument(
        "--allowed-host",
        action="append",
        default=[],
        metavar="NAME",
        help="a name the Host header may give beside the loopback names and --host (repeatable; "
        "'*': any)",
    )
    parser.add_argument(
        "--max-body-bytes",
        type=int,
        default=bounds.MAX_BODY_BYTES,
        metavar="N",
        help="largest request body; more is answered 413 before it is read (default 4 MiB)",
    )
    parser.add_argument(
        "--header-timeout",
        type=float,
        default=bounds.HEADER_TIMEOUT,
        metavar="S",
        help="seconds a request's headers may take to arrive (default 10)",
    )
    parser.add_argument(
        "--body-timeout",
        type=float,
        default=bounds.BODY_TIMEOUT,
        metavar="S",
        help="seconds a request's body may take to arrive (default 30; then 408)",
    )
    parser.add_argument(
        "--first-byte-timeout",
        type=float,
        default=bounds.FIRST_BYTE_TIMEOUT,
        metavar="S",
        help="seconds a new connection may stay silent before it is closed (default 2)",
    )
    parser.add_argument(
        "--keep-alive-timeout",
        type=float,
        default=bounds.KEEP_ALIVE_TIMEOUT,
        metavar="S",
        help="seconds an idle connection is kept open (default 5)",
    )
    parser.add_argument(
        "--max-connections",
        type=int,
        default=bounds.MAX_CONNECTIONS,
        metavar="N",
        help="connections served at once; one more closes the connection idle the longest, or "
        "its request gets 503 when none is idle (default 256)",
    )
    parser.add_argument(
        "--max-connections-per-client",
        type=int,
        default=bounds.MAX_CONNECTIONS_PER_CLIENT,
        metavar="N",
        help="connections served at once from one client address, as --max-connections "
        "(default 64)",
    )
    parser.add_argument(
        "--log-level",
        default="warning",
        choices=("critical", "error", "warning", "info", "debug"),
        help="uvicorn's own lines: warning (the default) shows only its warnings and errors "
        "beside specdec's lines; info adds its start and stop lines; debug each request",
    )
    parser.set_defaults(func=cmd_serve)


def _prefill_tokens(value: str):
    """``--prefill-tokens``: ``auto`` or a whole number of 1 or more (``positive``)."""
    if value == "auto":
        return value
    try:
        return positive(value)
    except argparse.ArgumentTypeError as exc:
        raise argparse.ArgumentTypeError(f"expected 'auto' or a count: {exc}") from None


def _port(value: str) -> int:
    """``--port``: a TCP port number, 0 (any free port) to 65535."""
    try:
        number = int(value)
    except ValueError:
        number = -1
    if not 0 <= number <= 65535:
        raise argparse.ArgumentTypeError(
            f"expected a TCP port from 1 to 65535 (or 0 for any free one), got {value!r}"
        )
    return number


def api_key_of(flag: str | None) -> str | None:
    """The key of ``--api-key``, else of $SPECDEC_API_KEY: trimmed; None for none given, "" or
    "none" (any case); refused when only whitespace or not printable ASCII."""
    key = flag if flag is not None else os.environ.get(API_KEY_VARIABLE)
    if key is not None and key.strip().lower() == "none":
        return None
    return check_api_key(key)


def cmd_serve(args) -> int:
    require("uvicorn", extra="serve", feature="specdec serve")
    require("starlette", extra="serve", feature="specdec serve")
    from specdec.serving.server import Server  # optional: starlette (serve extra)

    for flag in (
        "max_body_bytes",
        "header_timeout",
        "body_timeout",
        "first_byte_timeout",
        "keep_alive_timeout",
        "max_connections",
        "max_connections_per_client",
        "stall_timeout",
    ):
        if not getattr(args, flag) > 0:
            raise InvalidInputError(
                f"--{flag.replace('_', '-')} must be > 0, got {getattr(args, flag)}"
            )
    limits = Limits(
        max_body_bytes=args.max_body_bytes,
        header_timeout=args.header_timeout,
        body_timeout=args.body_timeout,
        first_byte_timeout=args.first_byte_timeout,
        keep_alive_timeout=args.keep_alive_timeout,
        max_connections=args.max_connections,
        max_connections_per_client=args.max_connections_per_client,
    )
    api_key = api_key_of(args.api_key)
    fallback = numpy_fallback_note(args.backend)
    if fallback:
        print(fallback, file=sys.stderr, flush=True)
    drafter, options = drafter_options(args)
    # the drafter and its options checked before the start line: a refusal is the only line
    drafter = engine_drafter(drafter, args.backend, options)[1]
    print(f"specdec: loading {args.model} and the drafter {args.drafter} ...", file=sys.stderr)
    engine = Engine(
        args.model,
        drafter=drafter,
        backend=args.backend,
        slots=args.slots,
        capacity=args.capacity,
        max_queue=args.max_queue,
        max_prefill_tokens=args.max_prefill_tokens,
        dtype=args.dtype,
        exact=args.exact,
        device=args.device,
        tree_room=args.tree_room,
        **options,
    )
    name = args.served_model_name or str(args.model)
    print(
        f"specdec: serving {name!r} on http://{args.host}:{args.port}/v1 ({args.slots} "
        f"slot{'s' * (args.slots != 1)} of {engine.context_length} tokens, drafter "
        f"{args.drafter}, speculation {engine.plan.speculation or 'auto'}; "
        f"{describe_exactness(engine.target)}; "
        f"{'an API key required' if api_key else 'no API key'}; Ctrl-C stops it)",
        file=sys.stderr,
    )
    warning = exposure_warning(args.host, api_key)
    if warning is not None:
        print(warning, file=sys.stderr)
    server = Server(
        engine,
        model_name=name,
        host=args.host,
        port=args.port,
        drain=not args.no_drain,
        shutdown_timeout=args.shutdown_timeout,
        log_level=args.log_level,
        api_key=api_key,
        allowed_hosts=tuple(args.allowed_host),
        limits=limits,
        stall_timeout=args.stall_timeout,
        announce=lambda line: print(f"specdec: {line}", file=sys.stderr, flush=True),
    )
    server.run()
    # the scheduler still inside a step, or a worker thread inside a preparation: exit without
    # waiting on them at interpreter exit
    if server.stuck or server.stuck_preparations:
        what = (
            "the engine's step"
            if server.stuck
            else "a request's preparation (rendering or tokenizing its prompt)"
        )
        print(
            f"specdec: error: {what} did not end at shutdown; exiting with it unfinished",
            file=sys.stderr,
        )
        sys.stderr.flush()
        sys.stdout.flush()
        os._exit(1)
    finished = engine.metrics.snapshot()["finished"]
    ended = ", ".join(f"{count} {reason}" for reason, count in finished.items() if count)
    print(
        f"specdec: stopped; {sum(finished.values())} request(s) ended"
        + (f" ({ended})" if ended else ""),
        file=sys.stderr,
    )
    return 0
