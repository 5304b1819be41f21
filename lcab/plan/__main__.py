"""``python -m lcab.plan``: Hydra predictions, or ``--check`` / ``--check-memory`` on records."""

from __future__ import annotations

import logging
import os
import sys

from lcab.plan.cli import run


def exit_now(code: int) -> None:
    """End the process once its output is written, without tearing down its objects.

    A planner sweep leaves tens of composed configs (each ~10^4 OmegaConf nodes), masks and
    predictions in memory; the interpreter's finalisation freed them one by one for about a
    second of a 10-second command. Everything the planner writes is closed by then; streams and
    log handlers (Hydra's per-job ``app.log``) are flushed here first.
    """
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    exit_now(run(sys.argv[1:]))
