"""``python -m lcab.perf <topic>``: print lcab's own speed figures."""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
from collections.abc import Callable


def _topics() -> dict[str, Callable[[], None]]:
    """Every module of this package is a topic (its ``run``), plus predict's second set."""
    import lcab.perf
    from lcab.perf.predict import run_more

    modules = [m.name for m in pkgutil.iter_modules(lcab.perf.__path__) if m.name[0] != "_"]
    topics = {m.replace("_", "-"): importlib.import_module(f"lcab.perf.{m}").run for m in modules}
    return topics | {"predict-more": run_more}


def main(argv: list[str] | None = None) -> int:
    """Run one perf topic."""
    topics = _topics()
    parser = argparse.ArgumentParser(prog="python -m lcab.perf")
    parser.add_argument("topic", choices=sorted(topics))
    args = parser.parse_args(argv)
    print(
        f"torch {__import__('torch').__version__}, threads {__import__('torch').get_num_threads()}"
    )
    topics[args.topic]()
    return 0


if __name__ == "__main__":
    sys.exit(main())
