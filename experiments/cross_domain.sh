#!/usr/bin/env bash
# Models trained on PTB (news), evaluated on Brown genres in open vocabulary,
# alone / + unigram cache / + neural cache with Pappas et al.'s cache settings
# (experiments/cross_domain.py; GRID=1 adds the validation grid), and after finetuning each on
# 80% of one genre (3 epochs as Pappas et al. §5.1, "trained for an additional 3 epochs on the
# target domain"; the run's own optimiser at a constant LR):
#   [LR=0.5] [DEVICE=cpu] [EPOCHS=3] [GRID=1] bash experiments/cross_domain.sh GENRE RUN [RUN ...]
#   e.g. LR=0.001 bash experiments/cross_domain.sh news runs/outputs-ptb/tied-s1 runs/outputs-ptb/groc-s1
# (LR 0.5 suits the SGD-trained runs, 0.001 the Adam-trained configs/outputs-ptb-* ones.)
set -euo pipefail
genre=${1:?genre to finetune on}
shift
runs=("$@")
lr=${LR:-0.5}
device=${DEVICE:-cpu}
epochs=${EPOCHS:-3}
grid=()
[[ -n "${GRID:-}" ]] && grid=(--grid)
finetuned=()
for run in "${runs[@]}"; do
  dir="runs/finetune-brown/$(basename "$run")-$genre-e$epochs"  # 1-epoch dirs are not reused
  finetuned+=("$dir")
  [[ -f "$dir/results.json" ]] ||
    targetlm finetune "$run" --run-dir "$dir" \
      --set data.name='"brown"' --set data.lowercase=true --set data.train_tokens=0 \
      --set "data.train=\"$genre[:0.8]\"" --set "data.valid=\"$genre[0.8:0.9]\"" \
      --set "data.test=\"$genre[0.9:]\"" --set train.epochs="$epochs" --set train.lr="$lr" --set train.device="\"$device\"" \
      --set train.schedule='"constant"' --set train.threads=1 --set train.progress=false
done
python experiments/cross_domain.py "${runs[@]}" "${grid[@]}" --out runs/cross-domain.json
python experiments/cross_domain.py "${finetuned[@]}" --genres "$genre" "${grid[@]}" \
  --out runs/cross-domain-finetuned.json
