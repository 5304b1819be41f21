#!/usr/bin/env bash
# The CPU measurements the planner is calibrated and checked on (lcab/plan/README.md):
# every strategy x causal, causal_document, share_question x world 2, 4, 6, 8 on gloo, one
# node, 512 tokens per rank, 24:8 heads of dim 32 (24 heads divide every world size), kernel
# `ranges`. USP and LoongTrain use Ulysses degree 2 so that one node still has a ring.
# The whole sweep runs LCAB_PLAN_RUNS times (default 3), each cell in fresh processes, and every
# record is kept: the planner takes the median of a cell's runs (`lcab.plan.calibrate.points_of`),
# so one run that stalls (8 gloo ranks share 2 cores) does not decide a point. Writes the merged
# records to ${1:-notebooks/data/plan_cpu_records.jsonl}. ~11 min a run on 2 cores (33 min for
# three); run it on an otherwise idle machine (the figures are wall-clock times).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-notebooks/data/plan_cpu_records.jsonl}
runs=${LCAB_PLAN_RUNS:-3}
root=$(mktemp -d /tmp/lcab-plan-cpu.XXXXXX)
common=(kernel=ranges mask=causal,causal_document,share_question
  topology=local2,local4,local6,local8 seqlen.values=[512] seqlen.per_device=true
  problem.heads_q=24 problem.heads_kv=8 problem.head_dim=32
  bench.warmup=1 bench.reps=5 bench.mask_samples=1 bench.check_numerics=false
  bench.progress=false)
for run in $(seq 1 "$runs"); do
  .venv/bin/python -m lcab.main -m cp=ulysses,ring,ring_allgather "${common[@]}" \
    hydra.sweep.dir="$root/run$run/1d"
  # one multirun per 2-D strategy (each writes its own folder; `cp=usp,loongtrain
  # ++cp.ulysses_degree=2` in one sweep works too: ++ sets the key in each cp the sweep composes)
  for cp in usp loongtrain; do
    .venv/bin/python -m lcab.main -m cp=$cp cp.ulysses_degree=2 "${common[@]}" \
      hydra.sweep.dir="$root/run$run/2d-$cp"
  done
done
mkdir -p "$(dirname "$out")"
cat "$root"/run*/1d/records.jsonl "$root"/run*/2d-*/records.jsonl > "$out"
echo "[lcab] $(wc -l < "$out") records ($runs runs) -> $out"
