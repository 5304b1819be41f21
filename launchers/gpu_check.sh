#!/usr/bin/env bash
# On a CUDA machine: install what can be installed of the GPU extras (never replacing torch), then
# check the GPU path in steps — the only source of a "GPU-verified" claim in lcab's README.
#
#   bash launchers/gpu_check.sh [OUT_DIR]        # default: outputs/gpu-check/<date>_<time>
#
# Steps (LCAB_GPU_STEPS picks some, in this order; default all), each under its own time limit
# (LCAB_GPU_LIMIT_<STEP>=seconds) so a slow one costs only its share of a lent machine:
#   numerics  the `gpu` test tier (every CUDA kernel x mask x fwd/bwd vs fp64, the timing and
#             memory tests) and, at the same time, the one-GPU CP step (every strategy x kernel x
#             mask, ranks sharing the GPU over gloo) — numerics only, so they may share the GPU
#   choice    SDPA's backend choice: PyTorch's, lcab's and the profiler's kernels (tests.gpu.sdpa_choice)
#   timer     lcab's per-pass time vs triton.testing.do_bench, same call (python -m lcab.perf gpu-timer),
#             and the NVML sampler's cost on a ~1 ms pass (python -m lcab.perf telemetry)
#   sweep     a small sweep through the whole app, with its report
#   probes    the planner's GPU measurements (launchers/plan_gpu_probes.sh)
# The timing steps run after the numerics, with the GPU to themselves.
#
# LCAB_PYTHON=python3 uses an interpreter that already has lcab's requirements instead of .venv;
# LCAB_GPU_EXTRAS="" installs no extras. On a machine with no package index (the lent GPU
# machines) a staged wheelhouse (`bash launchers/wheelhouse.sh stage PART`) makes both the
# default: the image's python3 with what the wheelhouse installs, and no pip call that would wait
# on an index (.venv never travels: it is git-ignored). LCAB_GPU_KERNELS=a,b narrows the tier, the
# CP step, the timer and the sweep to those kernels (one call's wheels, say);
# LCAB_GPU_WORKERS=N runs the tier on N pytest-xdist
# workers sharing the GPU (default 1: cases are small, but Flex compiles each mask);
# LCAB_GPU_CP_BUDGET_S caps the CP step (default 420 s; it starts no cell after that) and
# LCAB_GPU_CP_SHARDS=N runs it as N processes at once (default 3: its cells leave the GPU idle);
# LCAB_GPU_TIMER_KERNELS and LCAB_GPU_SWEEP_KERNELS (comma-separated) narrow those steps.
#
# OUT_DIR receives: env.txt (GPU, driver, versions), install.log, pytest.log, junit.xml,
# verification.jsonl (one line per kernel x mask x pass, then the CP rows), cp_shared*.log,
# verification.md (the tables), sdpa_choice.{txt,jsonl}, gpu_timer.{txt,jsonl},
# telemetry_cost.txt, the sweep with its report, and the planner's probes (probe.txt,
# empty_blocks.txt, ring_step.txt). Each extra
# that fails to install only removes its kernels' cells; each step that fails is named at the end.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

out=${1:-outputs/gpu-check/$(date +%Y-%m-%d_%H-%M-%S)}
mkdir -p "$out"
stage=${LCAB_WHEELHOUSE_STAGE:-/tmp/lcab-wheelhouse}
python=${LCAB_PYTHON:-.venv/bin/python} extras=${LCAB_GPU_EXTRAS-fa4 flashinfer}
if [ -f "$stage/manifest.txt" ]; then  # the no-index road: the image's Python, no pip install
  python=${LCAB_PYTHON:-python3} extras=${LCAB_GPU_EXTRAS-}
  echo "gpu_check: a wheelhouse is staged in $stage: $python, extras '${extras}'"
elif [ -z "${LCAB_PYTHON:-}" ] && [ ! -x "$python" ]; then
  # keep the machine's CUDA torch: setup.sh installs torch only when none is importable
  PYTHON=${PYTHON:-python3} bash launchers/setup.sh || exit 1
fi
"$python" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" || {
  echo "gpu_check: no CUDA device visible to torch; nothing to verify" >&2
  exit 2
}
steps=${LCAB_GPU_STEPS:-numerics choice timer sweep probes}
failed=()

# Pin the installed torch so that no extra can replace it.
pin="$out/constraints.txt"
"$python" -c "import torch; print('torch==' + torch.__version__)" >"$pin"
# what a wheelhouse carried here (lcab's requirements, the GPU extras, and the kernels built by
# launchers/kernel_build.sh: FA3 and the other source builds), staged part by part with
# `wheelhouse.sh stage`: installed first, with no index
if [ -f "$stage/manifest.txt" ]; then
  if exports=$(bash launchers/wheelhouse.sh install "$stage" 2>>"$out/install.log"); then
    eval "$exports"
    echo "installed: the staged wheelhouse ($stage)" | tee -a "$out/install.log"
  else
    echo "not installed: the staged wheelhouse ($stage; see install.log)" | tee -a "$out/install.log"
  fi
fi
for extra in $extras; do
  if "$python" -m pip install -q -c "$pin" -e ".[$extra]" >>"$out/install.log" 2>&1; then
    echo "installed: $extra" | tee -a "$out/install.log"
  else
    echo "not installed: $extra (see install.log)" | tee -a "$out/install.log"
  fi
done

{
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1
  "$python" - <<'EOF'
import platform
from importlib import metadata

import torch

print("torch", torch.__version__, "cuda", torch.version.cuda, "cudnn",
      torch.backends.cudnn.version(), "python", platform.python_version())
for dist in ("triton", "flash-attn-4", "nvidia-cutlass-dsl", "nvidia-cutlass-dsl-libs-cu13",
             "quack-kernels", "apache-tvm-ffi", "nvidia-cudnn-frontend", "flashinfer-python",
             "flash-attn", "flash-attn-3", "transformer-engine", "fastvideo-kernel",
             "magi-attention", "cuda-bindings", "hydra-core", "omegaconf"):
    try:
        print(dist, metadata.version(dist))
    except metadata.PackageNotFoundError:
        print(dist, "not installed")
try:  # what a source build switched off (kernel_build.sh writes it into FA3's wheel)
    from flash_attn_config import CONFIG
    print("flash_attn_3 build flags", {k: v for k, v in CONFIG["build_flags"].items() if v})
except ImportError:
    pass
EOF
} >"$out/env.txt" 2>&1
cat "$out/env.txt"

bounded() { # bounded SECONDS CMD...: CMD in its own process group, the whole group ended at the limit
  local seconds=$1 pid watchdog rc
  shift
  setsid -w "$@" &
  pid=$!
  (sleep "$seconds" && kill -TERM -- "-$pid" 2>/dev/null && sleep 5 && kill -KILL -- "-$pid") \
    >/dev/null 2>&1 &
  watchdog=$!
  wait "$pid"
  rc=$?
  kill "$watchdog" 2>/dev/null
  return "$rc"
}
limit() { # limit STEP DEFAULT: this step's time limit in seconds
  local var="LCAB_GPU_LIMIT_${1^^}"
  echo "${!var:-$2}"
}
has() { [[ " $steps " == *" $1 "* ]]; }

if has numerics; then
  # the tier and the CP step at once: both judge numerics only, and each leaves the GPU idle
  # most of the time (small cases, compiles, host staging)
  LCAB_GPU_VERIFICATION="$out/tier.jsonl" bounded "$(limit numerics 900)" "$python" -m pytest \
    -m gpu -rA -n "${LCAB_GPU_WORKERS:-1}" --timeout 600 -p no:cacheprovider -p no:benchmark \
    --junitxml="$out/junit.xml" tests/gpu tests/unit/test_timing.py tests/unit/test_memory.py \
    tests/unit/test_sdpa_backend.py \
    >"$out/pytest.log" 2>&1 &
  tier=$!
  shards=${LCAB_GPU_CP_SHARDS:-3}
  narrow=(${LCAB_GPU_KERNELS:+--kernels "$LCAB_GPU_KERNELS"})
  "$python" -m tests.gpu.cp_shared --list "${narrow[@]}" >"$out/cp_shared.log" 2>&1
  tail -n 1 "$out/cp_shared.log"
  pids=()
  for ((i = 0; i < shards; i++)); do
    bounded "$(limit numerics 900)" "$python" -m tests.gpu.cp_shared "${narrow[@]}" --shards "$shards" \
      --shard "$i" --out "$out/cp_shared.$i.jsonl" --budget-s "${LCAB_GPU_CP_BUDGET_S:-420}" \
      >"$out/cp_shared.$i.log" 2>&1 &
    pids+=($!)
  done
  wait "$tier" || failed+=("tier (pytest.log)")
  tail -n 3 "$out/pytest.log"
  cat "$out/tier.jsonl" >"$out/verification.jsonl" 2>/dev/null
  for ((i = 0; i < shards; i++)); do
    wait "${pids[$i]}" || failed+=("cp shard $i (cp_shared.$i.log)")
    tail -n 1 "$out/cp_shared.$i.log"
    cat "$out/cp_shared.$i.jsonl" >>"$out/verification.jsonl" 2>/dev/null
  done
  if [ -s "$out/verification.jsonl" ]; then
    "$python" -m lcab.report gpu-table "$out/verification.jsonl" >"$out/verification.md"
    echo "verification table: $out/verification.md"
    # the support matrix's GPU-verified marks are read from here: commit it with the README
    mkdir -p notebooks/data
    cp "$out/verification.jsonl" notebooks/data/gpu_verification.jsonl
    echo "commit notebooks/data/gpu_verification.jsonl, then: python -m lcab.report docs"
  fi
fi

if has choice; then
  bounded "$(limit choice 120)" "$python" -m tests.gpu.sdpa_choice --out "$out/sdpa_choice.jsonl" \
    >"$out/sdpa_choice.txt" 2>&1 || failed+=("choice (sdpa_choice.txt)")
  cat "$out/sdpa_choice.txt"
fi

if has timer; then
  LCAB_GPU_TIMER_KERNELS=${LCAB_GPU_TIMER_KERNELS:-${LCAB_GPU_KERNELS:-}} \
    LCAB_GPU_TIMER_OUT="$out/gpu_timer.jsonl" bounded "$(limit timer 300)" "$python" -m lcab.perf \
    gpu-timer >"$out/gpu_timer.txt" 2>&1 || failed+=("timer (gpu_timer.txt)")
  cat "$out/gpu_timer.txt"
  # the NVML sampler's cost on a ~1 ms GPU pass (issue 51's target: < 1 %); ~1 minute
  LCAB_PERF_ROUNDS=${LCAB_PERF_ROUNDS:-120} bounded "$(limit telemetry 150)" "$python" -m \
    lcab.perf telemetry >"$out/telemetry_cost.txt" 2>&1 || failed+=("telemetry (telemetry_cost.txt)")
  cat "$out/telemetry_cost.txt"
fi

if has sweep; then
  kernels=${LCAB_GPU_SWEEP_KERNELS:-${LCAB_GPU_KERNELS:-sdpa,sdpa_cudnn,flex,torch_varlen,cudnn,fa2,fa3,fa4,ffa,ranges}}
  bounded "$(limit sweep 300)" "$python" -m lcab.main -m "kernel=$kernels" \
    mask=causal,causal_document problem.device=cuda problem.dtype=bfloat16 \
    "seqlen.values=[8192,32768]" bench=quick bench.progress=false hydra.sweep.dir="$out/sweep" \
    >"$out/sweep.log" 2>&1 || failed+=("sweep (sweep.log)")
  "$python" -m lcab.report build "$out/sweep" >>"$out/sweep.log" 2>&1
  tail -n 30 "$out/sweep.log"
fi

if has probes; then
  # the planner's probes need nothing but torch, numpy and PyYAML
  LCAB_PYTHON="$python" bounded "$(limit probes 300)" bash launchers/plan_gpu_probes.sh "$out" \
    >/dev/null || failed+=("probes (probe.txt, empty_blocks.txt, ring_step.txt)")
  tail -n 40 "$out/ring_step.txt" 2>/dev/null
fi

if [ "${#failed[@]}" -gt 0 ]; then
  printf 'gpu_check: failed: %s\n' "${failed[@]}"
  exit 1
fi
echo "gpu_check: every step passed ($steps)"
