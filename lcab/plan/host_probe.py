"""``python -m lcab.plan.host_probe``: this host's speed figures and ``hardware=auto``'s factors.

The probe itself is `lcab.plan.host_speed` (what it measures, and its cache); the scaling is
`lcab.plan.hardware.auto_profile`.

    python -m lcab.plan.host_probe           # this host's figures and the factors (cached)
    python -m lcab.plan.host_probe --fresh   # measure again
    python -m lcab.plan.host_probe --fresh --reference RECORDS.jsonl   # the profile's figures
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import asdict
from pathlib import Path

from lcab.plan.hardware import CPU_PROFILE, factors, reference_figures
from lcab.plan.host_speed import HostFigures, cache_dir, host_figures, host_key


def main(argv: list[str] | None = None) -> int:
    """Print this host's figures, the profile's and the factors ``hardware=auto`` applies."""
    parser = argparse.ArgumentParser(prog="python -m lcab.plan.host_probe")
    parser.add_argument("--fresh", action="store_true", help="measure again (refresh the cache)")
    parser.add_argument(
        "--reference",
        metavar="RECORDS",
        help="records of cells of the profile's own fit measured on this host: print the "
        f"host_probe line that makes {CPU_PROFILE} scaled to this host predict them",
    )
    args = parser.parse_args(argv)
    start = time.perf_counter()
    here = host_figures(fresh=args.fresh)
    took = time.perf_counter() - start
    ref = reference_figures()
    print(f"host: {host_key()}  ({took:.2f} s; cache {cache_dir() / 'host_probe.json'})")
    for name, factor in factors(here, ref).items():
        print(
            f"  {name:<17} here {getattr(here, name):9.3f}   {CPU_PROFILE} host "
            f"{getattr(ref, name):9.3f}   x{factor:.2f}"
        )
    if args.reference:
        return _reference(Path(args.reference), here)
    return 0


def _reference(records: Path, here: HostFigures) -> int:
    """Print the ``host_probe`` figures of the profile's host, from this host's records.

    This host's speed over the fit host's is the median of predicted / measured time of the
    records' passes on the unscaled profile (one factor, as issue 40 found one factor enough);
    the fit host's figures are then this host's divided by it. Measure the records and run the
    probe on an otherwise idle machine, at the same time.
    """
    from statistics import median

    from lcab.plan.calibrate import check, points_of
    from lcab.plan.hardware import load_profile
    from lcab.records.sinks import read_records

    rows = check(points_of(read_records(records)), load_profile(CPU_PROFILE))
    if not rows:
        print(f"lcab: {records}: no ok CP records to compare with {CPU_PROFILE}", file=sys.stderr)
        return 2
    speed = median(r.predicted_ms / r.measured_ms for r in rows)
    line = ", ".join(f"{k}: {v / speed:.3g}" for k, v in asdict(here).items())
    print(f"{len(rows)} passes: this host runs them x{speed:.2f} the speed {CPU_PROFILE} predicts")
    print(f"host_probe: {{{line}}}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
