#!/usr/bin/env bash
# The main job: sentence embeddings with all-MiniLM-L6-v2 on the GPU at hand
# (lavapipe, installed if no Vulkan driver is present). Arguments go to the
# `minilm` binary: [--backend gpu|reference] [--model DIR] [--output FILE] SENTENCE...
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/ensure_vulkan.sh
export XDG_RUNTIME_DIR="${XDG_RUNTIME_DIR:-/tmp}"
exec cargo run --release --bin minilm -- "$@"
