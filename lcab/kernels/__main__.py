"""``python -m lcab.kernels``: the registry's lists for shell scripts, so no script types one.

python -m lcab.kernels names                      # every kernel, one a line
python -m lcab.kernels names --gpu-compared --sep ,   # the GPU checks' kernels: fa2,...
python -m lcab.kernels names --device cpu         # the kernels that run on CPU
python -m lcab.kernels packages                   # kernel, package, install command
"""

from __future__ import annotations

import argparse
import sys

from lcab.kernels.registry import KERNELS, gpu_compared


def main(argv: list[str] | None = None) -> int:
    """Print the list asked for; 2 (argparse) on a bad argument."""
    parser = argparse.ArgumentParser(prog="python -m lcab.kernels", description=__doc__)
    sub = parser.add_subparsers(dest="what", required=True)
    names = sub.add_parser("names", help="kernel names, in registration order")
    names.add_argument("--gpu-compared", action="store_true", help="Kernel.gpu_compared only")
    names.add_argument("--device", choices=("cpu", "cuda"), help="kernels that run there")
    names.add_argument("--sep", default="\n", help="separator (default: a newline)")
    sub.add_parser("packages", help="kernel<TAB>package<TAB>install, for optional packages")
    args = parser.parse_args(argv)
    if args.what == "packages":
        for name in KERNELS.names():
            requires = KERNELS.get(name).caps.requires
            if requires is not None:
                print(f"{name}\t{requires.name}\t{requires.install}")
        return 0
    chosen = gpu_compared() if args.gpu_compared else KERNELS.names()
    if args.device:
        chosen = [n for n in chosen if args.device in KERNELS.get(n).caps.devices]
    print(args.sep.join(chosen))
    return 0


if __name__ == "__main__":
    sys.exit(main())
