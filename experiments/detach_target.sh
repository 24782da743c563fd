#!/usr/bin/env bash
# Does AL train better with ỹ as a constant (objective.detach_target = true, the
# default, as the paper's analysis differentiates only through the logits) or with gradients
# through ỹ into E_out? inan-small-ptb-al at the reduced budget of experiments/common.sh.
#   bash experiments/detach_target.sh SEED
set -euo pipefail
source "$(dirname "$0")/common.sh"
seed=${1:?seed}
root=${RUNS:-runs/detach-target}
for detach in true false; do
  train_reduced configs/inan-small-ptb-al.toml "$root/detach-$detach-s$seed" "$seed" \
    --set objective.detach_target="$detach"
done
