"""``python -m lcab.plan``: Hydra predictions, or ``--calibrate`` / ``--check`` on records."""

from __future__ import annotations

import sys

from lcab.plan.cli import run

if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
