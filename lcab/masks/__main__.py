"""``python -m lcab.masks``: summarise a mask and draw its picture.

Examples::

    python -m lcab.masks causal_document --seqlen 65536 --out mask.png
    python -m lcab.masks sliding_window --seqlen 8192 -p window=512
    python -m lcab.masks --list
"""

from __future__ import annotations

import argparse
import ast
import sys
from typing import Any

from lcab.flops import attention_flops
from lcab.masks.factory import get_pattern, list_masks, make_mask
from lcab.masks.picture import save_mask_picture


def _parse_param(text: str) -> tuple[str, Any]:
    if "=" not in text:
        raise ValueError(f"-p expects key=value; got {text!r}")
    key, raw = text.split("=", 1)
    try:
        value = ast.literal_eval(raw)
    except (ValueError, SyntaxError):
        value = raw  # a bare word, e.g. doc_source=pile
    return key.strip(), value


def main(argv: list[str] | None = None) -> int:
    """Run the CLI; returns the exit code (2 for bad input)."""
    parser = argparse.ArgumentParser(
        prog="python -m lcab.masks", description=__doc__.split("\n")[0]
    )
    parser.add_argument("name", nargs="?", default="causal_document", help="mask pattern")
    parser.add_argument("--seqlen", type=int, default=65536, help="sequence length S")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("-p", "--param", action="append", default=[], help="key=value (repeat)")
    parser.add_argument("--heads-q", type=int, default=64, help="query heads for the FLOP figure")
    parser.add_argument("--head-dim", type=int, default=128, help="head dim for the FLOP figure")
    parser.add_argument("--out", default="mask.png", help="PNG path ('' to skip the picture)")
    parser.add_argument("--list", action="store_true", help="list patterns and their parameters")
    args = parser.parse_args(argv)
    if args.list:
        for name in list_masks():
            pattern = get_pattern(name)
            params = ", ".join(pattern.param_names()) or "-"
            print(f"{name:24s} {pattern.summary}\n{'':24s} params: {params}")
        return 0
    try:
        overrides = dict(_parse_param(p) for p in args.param)
        mask = make_mask(args.name, args.seqlen, seed=args.seed, **overrides)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    fwd = attention_flops(mask, args.heads_q, args.head_dim, pass_="fwd")
    print(f"{mask.summary()} fwd={fwd / 1e12:.4g} TFLOP (Hq={args.heads_q}, D={args.head_dim})")
    if args.out:
        path = save_mask_picture(mask, args.out)
        print(f"picture: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
