"""What a ``--quiet`` training run (or one whose stderr is not a terminal) prints in place of its
progress bars: one line on stderr per stage of the data and per evaluation, and between
evaluations one at least every two minutes (``specdec.training.loop.HEARTBEAT_SECONDS``), so such
a run is never silent for minutes."""

from __future__ import annotations

import sys


def say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
