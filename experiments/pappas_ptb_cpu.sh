#!/usr/bin/env bash
# Pappas et al. 2020 Table 2, PTB closed vocabulary (pappas-ptb-{tied,adaptive,groc})
# in the CPU regime: the presets' optimiser, dropout, stopping rule and Table 8 settings with
# a narrower prefix, the same for all: 2 x 256 LSTM units with a 128-dim last layer and
# embedding (GroC: a char-CNN of 4 widths x 32 channels = d), on the first TOKENS training
# tokens (default 50k), validated every epoch on the first quarter of valid, the paper's rule
# (lr x 0.1 after 4 epochs without improvement, stop after 8) within EPOCHS (default 40);
# then evaluated on full valid and test. One run per call, one thread:
#   bash experiments/pappas_ptb_cpu.sh METHOD SEED        (METHOD: tied, adaptive, groc)
# CONTINUE=1 EPOCHS=N continues a finished run that reached the epoch cap (exact resume) to N.
set -euo pipefail
source "$(dirname "$0")/common.sh"
method=${1:?method}
seed=${2:?seed}
root=${RUNS:-runs/pappas-ptb-cpu}
dir="$root/$method-s$seed"
prefix=(--set model.encoder.hidden_size=256 --set model.encoder.output_size=128
  --set model.embedding.size=128)
[[ $method == groc ]] && prefix+=(--set model.embedding.widths=[1,2,3,4]
  --set model.embedding.channels_per_width=32)
resume=()
if [[ -n ${CONTINUE:-} && -f "$dir/results.json" ]]; then
  resume=(--resume)
  rm -f "$dir/results.json" "$dir"/eval-*.json
fi
if [[ ! -f "$dir/results.json" ]]; then
  targetlm train "configs/pappas-ptb-$method.toml" --run-dir "$dir" "${resume[@]}" "${prefix[@]}" \
    --set train.seed="$seed" --set data.train_tokens="${TOKENS:-50000}" \
    --set data.valid='"valid[:0.25]"' --set train.epochs="${EPOCHS:-40}" \
    --set train.threads=1 --set train.progress=false
fi
eval_splits "$dir"
