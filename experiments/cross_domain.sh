#!/usr/bin/env bash
# Issue 4: models trained on PTB (news), evaluated on Brown genres in open vocabulary,
# alone / + unigram cache / + neural cache (experiments/cross_domain.py), and after
# finetuning each on 80% of one genre (1 epoch, the run's own optimiser at a constant LR):
#   [LR=0.5] [DEVICE=cpu] bash experiments/cross_domain.sh GENRE RUN [RUN ...]
#   e.g. LR=0.001 bash experiments/cross_domain.sh news runs/outputs-ptb/tied-s1 runs/outputs-ptb/groc-s1
# (LR 0.5 suits the SGD-trained runs, 0.001 the Adam-trained configs/outputs-ptb-* ones.)
set -euo pipefail
genre=${1:?genre to finetune on}
shift
runs=("$@")
lr=${LR:-0.5}
device=${DEVICE:-cpu}
finetuned=()
for run in "${runs[@]}"; do
  dir="runs/finetune-brown/$(basename "$run")-$genre"
  finetuned+=("$dir")
  [[ -f "$dir/results.json" ]] ||
    targetlm finetune "$run" --run-dir "$dir" \
      --set data.name='"brown"' --set data.lowercase=true --set data.train_tokens=0 \
      --set "data.train=\"$genre[:0.8]\"" --set "data.valid=\"$genre[0.8:0.9]\"" \
      --set "data.test=\"$genre[0.9:]\"" --set train.epochs=1 --set train.lr="$lr" --set train.device="\"$device\"" \
      --set train.schedule='"constant"' --set train.threads=1 --set train.progress=false
done
python experiments/cross_domain.py "${runs[@]}" --out runs/cross-domain.json
python experiments/cross_domain.py "${finetuned[@]}" --genres "$genre" --out runs/cross-domain-finetuned.json
