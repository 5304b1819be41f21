"""``python -m lcab.perf <topic>``: print lcab's own speed figures."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable


def _topics() -> dict[str, Callable[[], None]]:
    from lcab.perf import (
        balance,
        cp,
        gpu_timer,
        kernels,
        masks,
        predict,
        schedule,
        startup,
        telemetry,
        timer_overhead,
    )

    return {
        "masks": masks.run,
        "timer-overhead": timer_overhead.run,
        "gpu-timer": gpu_timer.run,
        "kernels": kernels.run,
        "balance": balance.run,
        "cp": cp.run,
        "predict": predict.run,
        "predict-more": predict.run_more,
        "schedule": schedule.run,
        "startup": startup.run,
        "telemetry": telemetry.run,
    }


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
