#!/usr/bin/env bash
# On a CUDA machine: install what can be installed of the GPU extras (never replacing torch), run
# the `gpu` test tier and a small sweep, and write the GPU verification table — the only source
# of a "GPU-verified" claim in lcab's README.
#
#   bash launchers/gpu_check.sh [OUT_DIR]        # default: outputs/gpu-check/<date>_<time>
#
# LCAB_PYTHON=python3 uses an interpreter that already has lcab's requirements (a machine with
# no package index: install them from wheels first) instead of setting up .venv;
# LCAB_GPU_EXTRAS="" installs no extras; LCAB_GPU_WORKERS=N runs the tier on N pytest-xdist
# workers sharing the GPU (default 1: cases are small, but Flex compiles each mask).
#
# LCAB_GPU_CP_BUDGET_S=N caps the one-GPU CP step (default 420 s; it starts no cell after that);
# LCAB_GPU_CP_SHARDS=N runs it as N processes at once (default 3: its cells leave the GPU idle).
#
# OUT_DIR receives: env.txt (GPU, driver, versions), install.log, pytest.log, junit.xml,
# verification.jsonl (one line per kernel x mask x pass, then the CP rows: strategy x kernel x
# mask x pass, ranks sharing the GPU over gloo), cp_shared*.log, verification.md (the tables), the
# sweep with its report, and the planner's probes (probe.txt, empty_blocks.txt, ring_step.txt:
# what the H100 profile's copies and empty thread blocks really cost on this GPU, and a published
# Ring P2P rank's forward, part by part, beside the planner). Each extra that fails to install
# only removes its kernels' cells.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

out=${1:-outputs/gpu-check/$(date +%Y-%m-%d_%H-%M-%S)}
mkdir -p "$out"
python=${LCAB_PYTHON:-.venv/bin/python}
if [ -z "${LCAB_PYTHON:-}" ] && [ ! -x "$python" ]; then
  # keep the machine's CUDA torch: setup.sh installs torch only when none is importable
  PYTHON=${PYTHON:-python3} bash launchers/setup.sh || exit 1
fi
"$python" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" || {
  echo "gpu_check: no CUDA device visible to torch; nothing to verify" >&2
  exit 2
}

{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1
  "$python" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"
} >"$out/env.txt"

# Pin the installed torch so that no extra can replace it.
pin="$out/constraints.txt"
"$python" -c "import torch; print('torch==' + torch.__version__)" >"$pin"
for extra in ${LCAB_GPU_EXTRAS-fa4 cudnn flashinfer}; do
  if "$python" -m pip install -q -c "$pin" -e ".[$extra]" >>"$out/install.log" 2>&1; then
    echo "installed: $extra" | tee -a "$out/install.log"
  else
    echo "not installed: $extra (see install.log)" | tee -a "$out/install.log"
  fi
done

# the planner's probes first: minutes, and they need nothing but torch, numpy and PyYAML
LCAB_PYTHON="$python" bash launchers/plan_gpu_probes.sh "$out" || echo "plan_gpu_probes: some failed"

LCAB_GPU_VERIFICATION="$out/verification.jsonl" "$python" -m pytest -m gpu -rA \
  -n "${LCAB_GPU_WORKERS:-1}" --timeout 600 -p no:cacheprovider -p no:benchmark \
  --junitxml="$out/junit.xml" tests/gpu tests/unit/test_timing.py tests/unit/test_memory.py \
  >"$out/pytest.log" 2>&1
tests_rc=$?
tail -n 3 "$out/pytest.log"

# CP on this one GPU: every strategy x kernel x mask, ranks sharing the GPU over gloo (numerics
# and bytes only); its dry run (--list) states the cells and the expected time
shards=${LCAB_GPU_CP_SHARDS:-3}
"$python" -m tests.gpu.cp_shared --list >"$out/cp_shared.log" 2>&1
tail -n 1 "$out/cp_shared.log"
pids=()
for ((i = 0; i < shards; i++)); do
  "$python" -m tests.gpu.cp_shared --shards "$shards" --shard "$i" --out "$out/cp_shared.$i.jsonl" \
    --budget-s "${LCAB_GPU_CP_BUDGET_S:-420}" >"$out/cp_shared.$i.log" 2>&1 &
  pids+=($!)
done
for ((i = 0; i < shards; i++)); do
  wait "${pids[$i]}" || tests_rc=1
  tail -n 1 "$out/cp_shared.$i.log"
  cat "$out/cp_shared.$i.jsonl" >>"$out/verification.jsonl" 2>/dev/null
done

if [ -s "$out/verification.jsonl" ]; then
  "$python" -m lcab.report.gpu_verification "$out/verification.jsonl" >"$out/verification.md"
  echo "verification table: $out/verification.md"
  # the support matrix's GPU-verified marks are read from here: commit it with the README
  mkdir -p notebooks/data
  cp "$out/verification.jsonl" notebooks/data/gpu_verification.jsonl
  echo "commit notebooks/data/gpu_verification.jsonl, then: python -m lcab.report readme"
fi

"$python" -m lcab.main -m kernel=sdpa,sdpa_cudnn,flex,torch_varlen,cudnn,fa2,fa3,fa4,ffa,ranges \
  mask=causal,causal_document problem.device=cuda problem.dtype=bfloat16 \
  "seqlen.values=[8192,32768]" bench=quick bench.progress=false hydra.sweep.dir="$out/sweep" \
  >"$out/sweep.log" 2>&1
"$python" -m lcab.report build "$out/sweep" >>"$out/sweep.log" 2>&1

exit "$tests_rc"
