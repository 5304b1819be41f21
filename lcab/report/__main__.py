"""``python -m lcab.report support|readme``: print the support matrices, or refresh the README."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    """Run one report command."""
    parser = argparse.ArgumentParser(prog="python -m lcab.report")
    parser.add_argument("command", choices=["support", "readme"])
    args = parser.parse_args(argv)
    if args.command == "support":
        from lcab.report.support import kernel_matrix_markdown, strategy_matrix_markdown

        print(kernel_matrix_markdown(), strategy_matrix_markdown(), sep="\n\n")
    else:
        from lcab.report.readme import README, update

        print(f"{README}: {'updated' if update() else 'already current'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
