#!/usr/bin/env bash
# Issue 10: Inan et al. 2017 Table 1, PTB small (inan-small-ptb-{base,al,re,real}) in the CPU
# regime: the presets unchanged (VD-LSTM 2x200 with recurrent dropout 0.7 tied to the output
# masks, SGD lr 1 decayed by 0.9 per epoch from epoch 5, clip 5, BPTT 35, batch 20, tau 20,
# gamma 0.5, RE/REAL without output bias) on the first TOKENS training tokens (default 50k)
# for EPOCHS epochs (default 40, the presets' budget), validated every epoch on the first
# quarter of valid, best checkpoint kept; then evaluated on full valid and test.
# One run per call, one thread:
#   bash experiments/inan_ptb_cpu.sh METHOD SEED        (METHOD: base, al, re, real)
set -euo pipefail
source "$(dirname "$0")/common.sh"
method=${1:?method}
seed=${2:?seed}
root=${RUNS:-runs/inan-ptb-cpu}
dir="$root/$method-s$seed"
if [[ ! -f "$dir/results.json" ]]; then
  targetlm train "configs/inan-small-ptb-$method.toml" --run-dir "$dir" \
    --set train.seed="$seed" --set data.train_tokens="${TOKENS:-50000}" \
    --set data.valid='"valid[:0.25]"' --set train.epochs="${EPOCHS:-40}" \
    --set train.threads=1 --set train.progress=false
fi
eval_splits "$dir"
