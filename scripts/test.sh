#!/usr/bin/env bash
# Kiln's whole test suite, as CI runs it on a fresh machine: formatting,
# lints, then every test of the workspace (debug builds, one target dir).
set -euo pipefail
cd "$(dirname "$0")/.."

export CARGO_TERM_COLOR=never
cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings
cargo test --workspace --all-targets
cargo test --workspace --doc
