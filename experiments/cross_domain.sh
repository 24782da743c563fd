#!/usr/bin/env bash
# Issue 4: models trained on PTB (news), evaluated on Brown genres in open vocabulary,
# alone / + unigram cache / + neural cache (experiments/cross_domain.py), and after
# finetuning each on 80% of one genre (1 epoch, SGD lr 0.5):
#   bash experiments/cross_domain.sh GENRE RUN [RUN ...]
#   e.g. bash experiments/cross_domain.sh news runs/outputs-ptb/tied-s1 runs/outputs-ptb/groc-s1
set -euo pipefail
genre=${1:?genre to finetune on}
shift
runs=("$@")
finetuned=()
for run in "${runs[@]}"; do
  dir="runs/finetune-brown/$(basename "$run")-$genre"
  finetuned+=("$dir")
  [[ -f "$dir/results.json" ]] ||
    targetlm finetune "$run" --run-dir "$dir" \
      --set data.name='"brown"' --set data.lowercase=true --set data.train_tokens=0 \
      --set "data.train=\"$genre[:0.8]\"" --set "data.valid=\"$genre[0.8:0.9]\"" \
      --set "data.test=\"$genre[0.9:]\"" --set train.epochs=1 --set train.lr=0.5 \
      --set train.schedule='"constant"' --set train.threads=1 --set train.progress=false
done
python experiments/cross_domain.py "${runs[@]}" --out runs/cross-domain.json
python experiments/cross_domain.py "${finetuned[@]}" --genres "$genre" --out runs/cross-domain-finetuned.json
