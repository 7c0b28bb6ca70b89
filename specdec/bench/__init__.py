"""``specdec bench``: speed and acceptance of specdec and its alternatives, side by side in one
run."""

from specdec.bench.methods import Method, parse_method
from specdec.bench.prompts import BenchPrompt, load_prompt_set
from specdec.bench.runner import BenchRecord, run_bench

__all__ = ["BenchPrompt", "BenchRecord", "Method", "load_prompt_set", "parse_method", "run_bench"]
