#!/usr/bin/env bash
# The planner's GPU measurements alone (a few minutes; gpu_check.sh runs them too, before its
# test tier): what the H100 profile's copies and empty thread blocks really cost on this GPU,
# and one rank of the published Ring P2P forward timed part by part beside the planner's cost of
# each part, on every mask of the published table (lcab/plan/README.md: that forward is
# where the planner misses).
#
#   bash launchers/plan_gpu_probes.sh [OUT_DIR]     # default: outputs/plan-gpu/<date>_<time>
#
# Runs the lab tools launchers/plan_copies.py, plan_empty_blocks.py and plan_ring_step.py (their
# figures live in conf/hardware/h100_nvlink_ib.yaml's sources). Needs torch with CUDA, numpy and
# PyYAML, nothing else of lcab's requirements: on a machine with no package index, carry those
# two as wheels. LCAB_PYTHON picks the interpreter (default
# .venv/bin/python where it exists, else python3). Where FlashAttention-3 is importable
# (flash_attn_interface), its own empty blocks and ring step are timed too.
# OUT_DIR receives probe.txt, empty_blocks.txt and ring_step.txt, each command line before its
# output; the exit code is 1 if any command failed, 2 without a CUDA device.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

out=${1:-outputs/plan-gpu/$(date +%Y-%m-%d_%H-%M-%S)}
mkdir -p "$out"
python=${LCAB_PYTHON:-.venv/bin/python}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # lcab from this checkout, installed or not
[ -n "${LCAB_PYTHON:-}" ] || [ -x "$python" ] || python=python3
"$python" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" || {
  echo "plan_gpu_probes: no CUDA device visible to $python's torch; nothing to measure" >&2
  exit 2
}

failed=0
measure() {  # measure FILE TOOL ARGS...: append the command and its output to OUT_DIR/FILE
  local file=$1
  shift
  echo "\$ python launchers/$*" >>"$out/$file"
  "$python" "launchers/$@" >>"$out/$file" 2>&1 || { echo "(exit $?)" >>"$out/$file"; failed=1; }
}

kernels=(torch_varlen)
"$python" -c "import flash_attn_interface" 2>/dev/null && kernels+=(fa3)

measure probe.txt plan_copies.py --device cuda
for kernel in "${kernels[@]}"; do
  measure empty_blocks.txt plan_empty_blocks.py --device cuda --kernel "$kernel"
done
# the missed cell first (full_document, cp 8), then the scale it grows with, then every mask
for args in "--mask full_document --cp 8" "--mask full_document --cp 64" "--mask full --cp 8" \
  "--mask causal_document --cp 8" "--mask causal --cp 8"; do
  for kernel in "${kernels[@]}"; do
    # shellcheck disable=SC2086  # the pairs above split into words on purpose
    measure ring_step.txt plan_ring_step.py $args --kernel "$kernel"
  done
done
cat "$out/probe.txt" "$out/empty_blocks.txt" "$out/ring_step.txt"
exit "$failed"
