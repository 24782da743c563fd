# Shared by the experiment scripts: the reduced CPU budget every compared run gets.
# TOKENS training tokens (default 300k of PTB's 930k), EPOCHS epochs (default 1), lr halved
# after every epoch, one thread (so two runs share the 2 cores side by side).
# The evaluations after training run on one thread too: torch's default (a thread per core)
# beside another run oversubscribes the cores, and its small per-step matmuls then wait on each
# other (all of PTB's valid beside training runs: 34 s to 3.5 min on 2 threads, 13 s on one).
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
tokens=${TOKENS:-300000}
epochs=${EPOCHS:-1}

# train_reduced CONFIG RUN_DIR SEED [--set ...]: skip a run that already finished
train_reduced() {
  local config=$1 dir=$2 seed=$3
  shift 3
  [[ -f "$dir/results.json" ]] && return 0
  targetlm train "$config" --run-dir "$dir" \
    --set train.seed="$seed" --set data.train_tokens="$tokens" --set train.epochs="$epochs" \
    --set train.decay_start=1 --set train.decay_factor=0.5 \
    --set train.threads=1 --set train.progress=false "$@"
}

# train_or_resume RUN_DIR CONFIG [TRAIN_ARGS ...]: targetlm train into RUN_DIR, continuing from its
# last.pt when an earlier call was cut short (a session's end); a finished run is left as it is
train_or_resume() {
  local dir=$1 config=$2 resume=()
  shift 2
  [[ -f "$dir/results.json" ]] && return 0
  [[ -f "$dir/last.pt" ]] && resume=(--resume)
  targetlm train "$config" --run-dir "$dir" "${resume[@]}" "$@"
}

# eval_splits RUN_DIR [EVAL_ARGS ...]: eval-valid.json and eval-test.json on the full splits
# (data.valid reset to all of valid), each written whole or not at all; existing ones are kept
eval_splits() {
  local dir=$1 split
  shift
  for split in valid test; do
    [[ -f "$dir/eval-$split.json" ]] && continue
    targetlm eval "$dir" --split "$split" --set data.valid='"valid"' "$@" --json \
      > "$dir/eval-$split.json.tmp" && mv "$dir/eval-$split.json.tmp" "$dir/eval-$split.json"
  done
}
