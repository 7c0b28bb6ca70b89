"""What a ``--quiet`` training run prints in place of its progress bars: one line on stderr per
stage of the data and per evaluation, so a quiet run is never silent for minutes."""

from __future__ import annotations

import sys


def say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
