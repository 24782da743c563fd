#!/usr/bin/env bash
# Install WordNet 3.0 for targetlm.lexicon (GroC) from Debian's packages, offline-friendly:
#   /usr/share/wordnet        wordnet-base (data/index files) + wordnet-sense-index (index.sense)
#                             + lexnames, which no Debian package ships (kept in the shared data dir)
#   $NLTK_HOME/corpora/wordnet  a copy NLTK reads with no download (NLTK >= 3.10 only opens files
#                             under its data path, so a symlink into /usr/share is refused)
# Usage: bash scripts/install_wordnet.sh [SHARED_DATA_DIR]   (default: $TARGETLM_DATA)
# Idempotent: apt runs only when the packages are missing. Needs root for apt and /usr/share.
# Online alternative (no root): python -m nltk.downloader wordnet
set -euo pipefail
DATA="${1:-${TARGETLM_DATA:-}}"
NLTK_HOME="${NLTK_HOME:-$HOME/nltk_data}"
WORDNET=/usr/share/wordnet

if [ ! -f "$WORDNET/data.noun" ] || [ ! -f "$WORDNET/index.sense" ]; then
    export DEBIAN_FRONTEND=noninteractive
    apt-get install -y -q wordnet-base wordnet-sense-index >/dev/null 2>&1 \
        || { apt-get update -q >/dev/null && apt-get install -y -q wordnet-base wordnet-sense-index >/dev/null; }
fi
if [ ! -f "$WORDNET/lexnames" ]; then
    ADDON="$DATA/wordnet-debian-addon/lexnames"
    if [ -z "$DATA" ] || [ ! -f "$ADDON" ]; then
        echo "install_wordnet.sh: lexnames not found; pass the shared data dir (with wordnet-debian-addon/lexnames) or set TARGETLM_DATA" >&2
        exit 1
    fi
    install -m 0644 "$ADDON" "$WORDNET/lexnames"
fi
if [ ! -f "$NLTK_HOME/corpora/wordnet/lexnames" ] || [ ! -f "$NLTK_HOME/corpora/wordnet/index.sense" ]; then
    mkdir -p "$NLTK_HOME/corpora"
    rm -rf "$NLTK_HOME/corpora/wordnet"
    cp -rL "$WORDNET" "$NLTK_HOME/corpora/wordnet"
fi
echo "WordNet 3.0 ready in $NLTK_HOME/corpora/wordnet"
