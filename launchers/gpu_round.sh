#!/usr/bin/env bash
# The GPU round (issue 63, Part 2) as device calls: each call is one command that stages its own
# wheels, installs them, imports them and runs its steps, so a machine that went back between
# two calls (30 s idle) loses nothing. Steps run in the issue's order of priority, each under its
# own limit; results come back as one archive per call (a device call returns at most 8 files).
#
#   bash launchers/gpu_round.sh plan       # here: the calls, what each carries, limits, minutes
#   bash launchers/gpu_round.sh prepare    # here: one wheelhouse per call in .whl/CALL (ignored)
#   bash launchers/gpu_round.sh CALL [OUT] # there: the device's `run` command (OUT: $OUT)
#
# Before `prepare`: the wheels it carries are built here and cached (bash launchers/wheelhouse.sh
# build NAME; FA3: copy ../shared/wheels/fa3 into ~/.cache/lcab/wheels/fa3/KEY/); `prepare` holds
# each one to its recipe's checks again (launchers/wheel_check.py) before packing it.
# On a machine with no CUDA (here) a call stages, installs and imports, runs what needs no GPU
# (the design-card command's dry run, the libraries' own Python on the CPU), and stops at the
# first step that needs CUDA, exit 3, naming the steps left.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

# CALL -> "kernels it carries (wheelhouse.sh build names) | LCAB_GPU_KERNELS | steps"
declare -A CALLS=(
  [fa3]="fa3|fa3|design paper tier"
  [kernels]="ffa fa2 bsa|ffa,fa2,sparse_fa2|tier ownpython"
  [measure]="flashmask|flashmask|nvml telemetry tier"
  [extra]="fa3|sdpa_cudnn,flex,fa3|timer frontier"
)
ORDER=(fa3 kernels measure extra) # the issue's priority: the design card and FA3 first
# a cold H100's start, one call's copies, the session's device time, and the allowance for
# stage + install + import in each call (seconds)
START_S=120 TRANSFER_S=15 BUDGET_S=900 INSTALL_S=60
# each step's limit (seconds; a call's timeout_s is INSTALL_S plus its steps') and what it checks
declare -A LIMIT=([design]=150 [paper]=100 [tier]=120 [ownpython]=60 [nvml]=45 [telemetry]=45
  [timer]=240 [frontier]=240)
declare -A WHAT=(
  [design]="python -m lcab.main -m kernel=fa3,sparse cp=ulysses,ring mask=causal,document, 4 ranks sharing the GPU over gloo, bf16: records + numerics"
  [paper]="FA3 vs arXiv 2407.08608 Figs. 5-6: 16 heads x 128, bf16, 16K tokens, full and causal, fwd and bwd TFLOP/s (648 / 616 / 561)"
  [tier]="gpu_check.sh numerics for the call's kernels: kernel tier (14 masks x fwd/bwd vs fp64) and CP on the shared GPU at worlds 2 and 4"
  [ownpython]="tests/realwheel: each library's own Python over lcab's CPU emulation of its extension, with the wheel installed"
  [nvml]="launchers/nvml_windows.py: the energy counter's update period, the power reading's window, energy per call long vs naive"
  [telemetry]="python -m lcab.perf telemetry: the NVML sampler's cost on a ~1 ms pass (telemetry_cost.txt)"
  [timer]="python -m lcab.perf gpu-timer: lcab vs do_bench with NVML clocks beside both"
  [frontier]="seqlen=frontier at bench.memory_budget_gib=20: FA3 alone and under a ring of 2 on the shared GPU; records carry the planner's prediction"
)

die() {
  echo "gpu_round: $*" >&2
  exit 2
}
fields() { # fields CALL: BUILT GPU_KERNELS STEPS TIMEOUT of a call, or die
  [ -n "${CALLS[$1]+x}" ] || die "unknown call '$1' (valid: plan, prepare, ${ORDER[*]})"
  IFS='|' read -r BUILT GPU_KERNELS STEPS <<<"${CALLS[$1]}"
  local step
  TIMEOUT=$INSTALL_S
  for step in $STEPS; do TIMEOUT=$((TIMEOUT + LIMIT[$step])); done
}

plan() {
  local call step total=$START_S
  echo "device calls, in order (one run each: carry .whl/CALL, command \"bash launchers/gpu_round.sh CALL\")"
  for call in "${ORDER[@]}"; do
    fields "$call"
    total=$((total + TIMEOUT + TRANSFER_S))
    printf '%-8s carries %-15s timeout_s %3d  (%4.1f min of device time by its end, worst case)\n' \
      "$call" "$BUILT" "$TIMEOUT" "$(echo "$total / 60" | bc -l)"
    printf '    %-9s %3ds  %s\n' stage "$INSTALL_S" "stage .whl/$call/part-1, install it (no \
index), import lcab and each library; the design card's dry run"
    for step in $STEPS; do
      printf '    %-9s %3ds  %s\n' "$step" "${LIMIT[$step]}" "${WHAT[$step]}"
    done
  done
  echo "budget: $((BUDGET_S / 60)) min of device time including a ~$((START_S / 60)) min start;" \
    "the worst case above runs past it, so calls go in this order and the round stops where" \
    "the time ends (status's budget_left_s below a call's timeout_s + 60: stop, say where)"
}

prepare() {  # one house per call, made anew (each wheel checked again on its way in)
  local call
  for call in "${ORDER[@]}"; do
    fields "$call"
    LCAB_WHEEL_EXTRAS="" LCAB_WHEEL_BUILT="$BUILT" bash launchers/wheelhouse.sh make \
      ".whl/$call" || echo "gpu_round: .whl/$call not made (see above): its call cannot run"
    [ "$(find ".whl/$call" -maxdepth 1 -name 'part-*' 2>/dev/null | wc -l)" -le 1 ] ||
      echo "gpu_round: .whl/$call has several parts: one call carries one (fewer kernels)"
  done
  du -sh .whl/*/part-* 2>/dev/null
}

stepped() { # stepped STEP CMD...: CMD under the step's limit, its output in $work/STEP.log
  local step=$1 rc
  shift
  echo "gpu_round: step $step (limit ${LIMIT[$step]:-60} s)"
  timeout -k 10 "${LIMIT[$step]:-60}" "$@" >"$work/$step.log" 2>&1
  rc=$?
  tail -n 15 "$work/$step.log"
  echo "gpu_round: step $step exit $rc" | tee -a "$work/summary.txt"
  return "$rc"
}

run_call() {
  local call=$1 out=${2:-${OUT:-outputs/gpu-round}} step python=${LCAB_PYTHON:-python3}
  fields "$call"
  work=$(mktemp -d /tmp/gpu-round-"$call".XXXX)
  mkdir -p "$out"
  trap 'tar -C "$work" -czf "$out/round-$call.tgz" . && cp "$work/summary.txt" "$out/summary-$call.txt"' EXIT
  {
    echo "call $call at $(date -u +%FT%TZ): kernels $GPU_KERNELS; steps $STEPS"
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv 2>&1
  } | tee "$work/summary.txt"
  local part=.whl/$call/part-1
  [ -d "$part" ] || die "no $part: carry .whl/$call (bash launchers/gpu_round.sh prepare, here)"
  # a stage of this call's own (a part's manifest names only its house's wheels), installed
  # where gpu_check.sh installs a staged house
  export LCAB_WHEELHOUSE_STAGE=/tmp/lcab-wheelhouse-$call LCAB_PYTHON=$python
  export LCAB_GPU_KERNELS=$GPU_KERNELS
  rm -rf "$LCAB_WHEELHOUSE_STAGE"
  bash launchers/wheelhouse.sh stage "$part" "$LCAB_WHEELHOUSE_STAGE" | tee -a "$work/summary.txt"
  local exports
  exports=$(bash launchers/wheelhouse.sh install "$LCAB_WHEELHOUSE_STAGE" 2>>"$work/install.log") ||
    die "install failed: $(tail -n 3 "$work/install.log")"
  eval "$exports"
  "$python" - "$GPU_KERNELS" <<'PY' 2>&1 | tee -a "$work/summary.txt" || die "import failed"
import importlib, sys
import torch
import lcab.main  # noqa: F401  (lcab's own requirements came with the part)
from lcab.kernels import get_kernel
print("torch", torch.__version__, "CUDA", torch.version.cuda, "device", torch.cuda.is_available())
for name in sys.argv[1].split(","):
    package = get_kernel(name).caps.package
    if package:  # the library itself, imported (its compiled extension loads with it)
        module = importlib.import_module(package)
        print(f"{name}: {package} imported from {module.__file__}")
PY
  "$python" -m lcab.main -m kernel=fa3,sparse cp=ulysses,ring mask=causal,document topology=local4 \
    topology.backend=gloo problem.dtype=bfloat16 dry_run=true >"$work/dry_run.log" 2>&1 ||
    echo "gpu_round: the design card's dry run failed (dry_run.log)" | tee -a "$work/summary.txt"
  cuda=$("$python" -c 'import torch; print(int(torch.cuda.is_available()))')
  for step in $STEPS; do
    if [ "$cuda" != 1 ] && [ "$step" != ownpython ]; then
      echo "gpu_round: stopped before '$step': no CUDA device (left: ${STEPS#*"$step"})" |
        tee -a "$work/summary.txt"
      exit 3
    fi
    "step_$step" || true # a failed step is said in summary.txt; the next still runs
  done
}

sweep_dir() { echo "hydra.sweep.dir=$work/$1"; }
step_design() {
  stepped design "$LCAB_PYTHON" -m lcab.main -m kernel=fa3,sparse cp=ulysses,ring \
    mask=causal,document topology=local4 topology.backend=gloo problem.device=cuda \
    problem.dtype=bfloat16 bench=quick bench.progress=false "$(sweep_dir design)"
}
step_paper() {
  stepped paper "$LCAB_PYTHON" -m lcab.main -m kernel=fa3 mask=full,causal cp=none bench=paper \
    problem.heads_q=16 problem.heads_kv=16 problem.head_dim=128 problem.dtype=bfloat16 \
    problem.device=cuda "seqlen.values=[16384]" bench.progress=false "$(sweep_dir paper)"
}
step_tier() {
  LCAB_GPU_STEPS=numerics LCAB_GPU_LIMIT_NUMERICS=$((LIMIT[tier] - 20)) \
    LCAB_GPU_CP_BUDGET_S=$((LIMIT[tier] / 2)) stepped tier bash launchers/gpu_check.sh "$work/check"
}
step_ownpython() { # needs no GPU: it also runs here
  LCAB_REAL_WHEEL_SITE=/tmp/lcab-site stepped ownpython "$LCAB_PYTHON" -m pytest \
    tests/realwheel/check_ffa_cpu.py tests/realwheel/check_bsa_cpu.py -q --noconftest \
    -p no:cacheprovider -o addopts= -W ignore::UserWarning
}
step_nvml() {
  stepped nvml "$LCAB_PYTHON" launchers/nvml_windows.py "$work/nvml_windows.jsonl"
}
step_telemetry() {
  LCAB_PERF_ROUNDS=120 stepped telemetry "$LCAB_PYTHON" -m lcab.perf telemetry
}
step_timer() {
  LCAB_GPU_TIMER_OUT="$work/gpu_timer.jsonl" LCAB_GPU_TIMER_KERNELS=$GPU_KERNELS \
    stepped timer "$LCAB_PYTHON" -m lcab.perf gpu-timer
}
step_frontier() {  # FA3 alone, then under a ring of 2 sharing the GPU (2 x 20 GiB fit an H100)
  LIMIT[frontier]=$((LIMIT[frontier] / 2))
  stepped frontier "$LCAB_PYTHON" -m lcab.main -m kernel=fa3 mask=causal seqlen=frontier \
    bench=quick bench.memory_budget_gib=20 problem.device=cuda problem.dtype=bfloat16 \
    bench.progress=false "$(sweep_dir frontier)"
  stepped frontier "$LCAB_PYTHON" -m lcab.main -m kernel=fa3 cp=ring topology=local2 \
    topology.backend=gloo mask=causal seqlen=frontier bench=quick bench.memory_budget_gib=20 \
    problem.device=cuda problem.dtype=bfloat16 bench.progress=false "$(sweep_dir frontier_ring)"
}

case ${1:-} in
  plan) plan ;;
  prepare) prepare ;;
  "" | -h | --help) sed -n '2,17p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
  *) run_call "$@" ;;
esac
