#!/usr/bin/env bash
# Inan et al. 2017 Table 1, PTB small (inan-small-ptb-{base,al,re,real}) in the CPU
# regime: the presets unchanged (VD-LSTM 2x200 with recurrent dropout 0.3 tied to the output
# masks, SGD lr 1 decayed by 0.9 per epoch after epoch 5, clip 5, BPTT 35, batch 20, tau 20,
# gamma 0.5, RE/REAL without output bias) on the first TOKENS training tokens (default 50k)
# for EPOCHS epochs (default 40, the presets' budget), validated every epoch on the first
# quarter of valid, best checkpoint kept; then evaluated on full valid and test.
# SCHEDULE=steps keeps the paper's schedule in steps instead of epochs of the smaller corpus
# (train.decay_epoch_steps=1328, the steps of one epoch of all of PTB at batch 20 x 35: lr 1
# for 6,640 steps, then x0.9 every 1,328 steps), in runs/inan-ptb-cpu-steps. METHOD re-bias
# (RE with an output bias) and base-nobias (base without one) are the audit's controls.
# On 50k tokens (72 steps an epoch) the paper's 40 epochs of steps (53,120) are EPOCHS=737:
# about 2.6 hours a run on one idle thread (about 4,000 tokens/s), so the step-matched runs are
# the GPU pack's (experiments/gpu/inan_table1.sh, all of PTB) or several sessions' work.
# TOKENS=0 trains on all of PTB (1,328 steps an epoch), in runs/inan-ptb-all: with the presets'
# per-epoch schedule that is the paper's run at the same cost per step (53,120 steps for the
# 40 epochs, about 2.6 hours on one thread). A run whose directory has a last.pt continues
# from it, so a run cut short by the end of a session resumes where it stopped.
# SET="key=value ..." adds --set overrides, e.g. a schedule compressed to fit a session (with
# RUNS=DIR so such runs get a directory of their own):
#   RUNS=runs/inan-ptb-15ep EPOCHS=15 SET="train.decay_start=3 train.decay_factor=0.75" TOKENS=0
# is lr 1 through epoch 3, then x0.75 an epoch to 0.032 at epoch 15 (the 40-epoch schedule ends
# at 0.9^35 = 0.025).
# One run per call, one thread:
#   bash experiments/inan_ptb_cpu.sh METHOD SEED  (METHOD: base, al, re, real, re-bias, base-nobias)
set -euo pipefail
source "$(dirname "$0")/common.sh"
method=${1:?method}
seed=${2:?seed}
extra=()
if [[ ${SCHEDULE:-epochs} == steps ]]; then
  root=${RUNS:-runs/inan-ptb-cpu-steps}
  extra+=(--set train.decay_epoch_steps=1328)
elif [[ ${TOKENS:-50000} == 0 ]]; then
  root=${RUNS:-runs/inan-ptb-all}
else
  root=${RUNS:-runs/inan-ptb-cpu}
fi
preset=$method
case $method in
  re-bias) preset=re extra+=(--set model.output.bias=true) ;;
  base-nobias) preset=base extra+=(--set model.output.bias=false) ;;
esac
for override in ${SET:-}; do extra+=(--set "$override"); done
dir="$root/$method-s$seed"
train_or_resume "$dir" "configs/inan-small-ptb-$preset.toml" "${extra[@]}" \
  --set train.seed="$seed" --set data.train_tokens="${TOKENS:-50000}" \
  --set data.valid='"valid[:0.25]"' --set train.epochs="${EPOCHS:-40}" \
  --set train.threads=1 --set train.progress=false
eval_splits "$dir"
