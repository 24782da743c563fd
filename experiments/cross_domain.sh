#!/usr/bin/env bash
# Issue 4: train on PTB (news), evaluate on Brown genres in open vocabulary; tied vs GroC,
# alone / + unigram cache / + neural cache, and after finetuning on 80% of a genre.
#   bash experiments/cross_domain.sh [GENRE_TO_FINETUNE]     (default: news)
# Needs runs/outputs-ptb/{tied,groc}-s1 (bash experiments/outputs_ptb.sh 1 tied groc).
set -euo pipefail
genre=${1:-news}
root=${RUNS:-runs/outputs-ptb}
for method in tied groc; do
  dir="runs/finetune-brown/$method-$genre"
  [[ -f "$dir/results.json" ]] ||
    targetlm finetune "$root/$method-s1" --run-dir "$dir" \
      --set data.name='"brown"' --set data.lowercase=true --set data.train_tokens=0 \
      --set "data.train=\"$genre[:0.8]\"" --set "data.valid=\"$genre[0.8:0.9]\"" \
      --set "data.test=\"$genre[0.9:]\"" --set train.epochs=1 --set train.lr=0.5 \
      --set train.schedule='"constant"' --set train.threads=1 --set train.progress=false
done
python experiments/cross_domain.py "$root/tied-s1" "$root/groc-s1" --out runs/cross-domain.json
python experiments/cross_domain.py runs/finetune-brown/tied-"$genre" runs/finetune-brown/groc-"$genre" \
  --genres "$genre" --out runs/cross-domain-finetuned.json
