#!/usr/bin/env bash
# On one GPU: the diffusion comparison of experiments/diffusion_multi30k.sh (diff-tiny
# base vs + WDR, En→De and De→En, every seed in SEEDS) beside its autoregressive reference of
# experiments/nmt_multi30k.sh (nmt-tiny base, the same directions and seeds), all at EPOCHS
# epochs, each run its own process (one CPU thread) side by side on the one GPU.
#
#   EPOCHS=12 SEEDS="1 2" RUNS=runs/gpu bash experiments/multi30k_gpu.sh
#
# SET="key=value ..." adds --set overrides to every run (the device is already cuda); AR=0 skips
# the autoregressive reference.
# Runs land in RUNS/diffusion/DIRECTION-PRESET-sSEED and RUNS/nmt/DIRECTION-base-sSEED, logs in
# RUNS/logs; a run that finished is skipped. Exits non-zero when any run failed (named).
# Tables: targetlm compare RUNS/diffusion --metric bleu --lambda 0.1; targetlm compare RUNS/nmt --metric bleu
set -uo pipefail
cd "$(dirname "$0")/.."
epochs=${EPOCHS:-12}
seeds=${SEEDS:-"1 2"}
ar=${AR:-1}
root=${RUNS:-runs/gpu}
overrides="train.device=\"cuda\" train.threads=1 ${SET:-}"
mkdir -p "$root/logs"
export OMP_NUM_THREADS=1
names=() pids=()
start() {  # start NAME SCRIPT DIRECTION PRESET SEED SUBDIR
  local name=$1 script=$2 direction=$3 preset=$4 seed=$5 subdir=$6
  EPOCHS=$epochs SET=$overrides RUNS=$root/$subdir LAMBDAS="" \
    bash "experiments/$script" "$direction" "$preset" "$seed" > "$root/logs/$name.txt" 2>&1 &
  names+=("$name") pids+=($!)
}
for seed in $seeds; do
  for direction in en-de de-en; do
    start "diffusion-$direction-base-s$seed" diffusion_multi30k.sh "$direction" base "$seed" diffusion
    start "diffusion-$direction-wdr-s$seed" diffusion_multi30k.sh "$direction" wdr "$seed" diffusion
    [ "$ar" = 0 ] || start "nmt-$direction-base-s$seed" nmt_multi30k.sh "$direction" base "$seed" nmt
  done
done
failed=0
for i in "${!pids[@]}"; do
  if ! wait "${pids[$i]}"; then
    echo "failed: ${names[$i]} (log: $root/logs/${names[$i]}.txt)" >&2
    failed=1
  fi
done
exit $failed
