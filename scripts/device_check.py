"""The claims of exact mode on one device, checked with random weights made on the spot.

For each model shape (SmolLM2-135M's, and with ``--large`` Qwen2.5-1.5B's): the target loaded in
the dtype measured fastest on the device, exact mode as ``generate`` sets it; the decoding
guard's verdict (``specdec.tuning.guard``: trees of 1 to 16 nodes in 1 and in 16 rows, prompt
chunks, against one token at a time, bit for bit); then greedy decoding with plain decoding,
prompt lookup and a random ReDrafter and EAGLE drafter, each compared token for token with plain
decoding, exact mode on; and tokens/s of each. One PASS or FAIL line per claim at the end (exit
status 1 on a FAIL); the speeds are printed, not judged.

    python scripts/device_check.py --device cuda --out device-check [--large]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

SHAPES = {
    "smollm2-135m": dict(
        vocab_size=49152,
        hidden_size=576,
        intermediate_size=1536,
        num_layers=30,
        num_heads=9,
        num_kv_heads=3,
    ),
    "qwen2.5-1.5b": dict(
        vocab_size=151936,
        hidden_size=1536,
        intermediate_size=8960,
        num_layers=28,
        num_heads=12,
        num_kv_heads=2,
        architecture="qwen2",
    ),
}
PROMPTS = [
    "def fibonacci(n):\n    " * 3,
    "The history of the bicycle begins",
    "Write a list of ten fruits: apple, banana,",
]


def check_shape(name: str, folder: Path, device: str, claims: list, tokens: int) -> dict:
    import specdec
    from specdec.plugins.registry import default_registry
    from specdec.testing import make_random_drafter
    from specdec.tuning.guard import check_decoding

    backend = default_registry().get("backend", "torch").factory()
    target = specdec.load(folder, backend="torch", device=device, slots=16, capacity=640)
    report = {"shape": name, "dtype": str(target.dtype), "exact": target.exactness.reason}
    to_target = lambda array: backend.from_numpy(array, target)  # noqa: E731
    for rows in (1, 16):
        began = time.perf_counter()
        check = check_decoding(target, backend.to_numpy, to_target, max_nodes=16, rows=rows)
        report[f"guard_rows_{rows}"] = check.failed or "holds"
        report[f"guard_rows_{rows}_seconds"] = round(time.perf_counter() - began, 2)
        claims.append(
            (f"{name}: the guard, trees of 1-16 nodes in {rows} row(s)", check.holds, check.failed)
        )
    drafters = {
        "plain": ("none", {}),
        "lookup": ("lookup", {}),
        "redrafter": (
            str(
                make_random_drafter(folder.parent / f"{name}-rd", folder, kind="redrafter", seed=1)
            ),
            {},
        ),
        "eagle": (
            str(make_random_drafter(folder.parent / f"{name}-eagle", folder, kind="eagle", seed=2)),
            {},
        ),
    }
    one = specdec.load(folder, backend="torch", device=device, slots=1, capacity=640)
    outputs, rates = {}, {}
    for method, (drafter, options) in drafters.items():
        done, seconds = [], 0.0
        for prompt in PROMPTS:
            result = specdec.generate(
                one,
                prompt,
                drafter=drafter,
                max_new_tokens=tokens,
                stop_at_eos=False,
                speculation="always",
                **options,
            )
            done.append(result.tokens)
            seconds += result.stats.time_total
        outputs[method] = done
        rates[method] = round(sum(map(len, done)) / seconds, 1)
    report["tokens_per_second"] = rates
    for method, done in outputs.items():
        if method == "plain":
            continue
        same = sum(a == b for a, b in zip(done, outputs["plain"]))
        claims.append(
            (
                f"{name}: {method} identical to plain decoding, exact mode on",
                same == len(PROMPTS),
                f"{same} of {len(PROMPTS)} prompts",
            )
        )
    return report


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--out", default="device-check")
    parser.add_argument("--large", action="store_true", help="also Qwen2.5-1.5B's shapes")
    parser.add_argument("--max-new-tokens", type=int, default=48)
    args = parser.parse_args()
    from specdec.testing import make_random_model

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    claims, reports = [], []
    for name in ["smollm2-135m"] + (["qwen2.5-1.5b"] if args.large else []):
        folder = out / "models" / name
        if not (folder / "config.json").is_file():
            make_random_model(folder, seed=0, with_tokenizer=True, **SHAPES[name])
        reports.append(check_shape(name, folder, args.device, claims, args.max_new_tokens))
        print(json.dumps(reports[-1]), flush=True)
    (out / "device_check.json").write_text(json.dumps(reports, indent=1))
    for claim, holds, detail in claims:
        print(f"{'PASS' if holds else 'FAIL'}: {claim}" + ("" if holds else f" ({detail})"))
    return 0 if all(holds for _, holds, _ in claims) else 1


if __name__ == "__main__":
    sys.exit(main())
