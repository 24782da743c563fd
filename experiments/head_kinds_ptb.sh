#!/usr/bin/env bash
# The multi-token head designs side by side on one harness: a small decoder Transformer trained
# from scratch on PTB with each head kind at N = 4, all at one budget, then evaluated with the
# head ensemble (benchmark them as self-speculative drafters with benchmarks/speculative.py --run RUN:
# the command in docs/history.md).
#
# Budget (the CPU-50k regime of experiments/heo_tf_ptb.sh, unchanged for every arm): 2 layers x
# d 128 (d_ff 512, 4 attention heads, post-LN, ReLU, tied, dropout 0.3, label smoothing 0.1),
# blocks of 128 tokens, batch 8 (1K tokens a step), the first 50k PTB training tokens (49
# steps an epoch), Adam 2.5e-4 at a constant rate (no schedule to compress), validated every
# epoch on the first quarter of valid, stopped by a patience of 5 within 30 epochs (at most
# 1,470 steps), best checkpoint kept; seed SEED (default 1); one thread per run.
# Each kind keeps its paper's loss weighting (its preset): simple / wdr / medusa Heo et al.'s
# 1/2 L0 + alpha/(2N-2) sum Ln with alpha 1 (Medusa-1 trains its heads on a frozen body, which
# has no weighting to copy; Medusa-2's per-head decay is not used), gloeckle the equal sum,
# mtp DeepSeek-V3's lambda 0.3 over the depths' mean.
# What would keep it from showing a difference: one seed (the seed sd of this regime is 0.9 ppl
# for base and 3.7-3.9 for N 4 heads), and a trunk this small drafts poorly whatever the heads.
#   bash experiments/head_kinds_ptb.sh [SEED]
set -euo pipefail
seed=${1:-1}
here=$(dirname "$0")
export RUNS=${RUNS:-runs/head-kinds-ptb}
bash "$here/heo_tf_ptb.sh" base "$seed"
bash "$here/heo_tf_ptb.sh" sim-n4 "$seed"
bash "$here/heo_tf_ptb.sh" wdr-n4 "$seed"
SET='model.heads.kind="medusa"' LABEL=medusa bash "$here/heo_tf_ptb.sh" sim-n4 "$seed"
bash "$here/heo_tf_ptb.sh" gloeckle "$seed"
bash "$here/heo_tf_ptb.sh" mtp "$seed"
