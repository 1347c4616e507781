#!/usr/bin/env bash
# Kiln's whole test suite, as CI runs it on a fresh machine: installs what
# the GPU tests need (Mesa's software Vulkan driver, lavapipe) when absent,
# then formatting, lints, and every test of the workspace (debug builds,
# one target dir), then the web page in headless Chromium with WebGPU
# (scripts/web.sh test: installs the wasm toolchain, Chromium and
# playwright-core when absent; release builds only for the wasm module and
# the exported model).
set -euo pipefail
cd "$(dirname "$0")/.."

# The GPU tests run for real: lavapipe where there is no GPU driver.
./scripts/ensure_vulkan.sh
# Vulkan only (wgpu would otherwise fall back to GL), and quiet Mesa.
export WGPU_BACKEND="${WGPU_BACKEND:-vulkan}"
export XDG_RUNTIME_DIR="${XDG_RUNTIME_DIR:-/tmp}"

export CARGO_TERM_COLOR=never
cargo fmt --all -- --check
cargo clippy --workspace --all-targets -- -D warnings
# The runtime alone: the engine without its compiler still builds clean.
cargo clippy -p kiln-runtime -- -D warnings
cargo test --workspace --all-targets
cargo test --workspace --doc
# The op programs are generated (tests/torch_ref/gen_op_programs.py):
# regenerating them all must change nothing.
python3 tests/torch_ref/gen_op_programs.py --check
# The GPU benchmark's dry run (scripts/gpu-bench.sh, issue #32) on lavapipe:
# prepare, run and report at small sizes with the suite's debug binaries,
# so the one command a GPU machine gets is known to work before it does.
GB=target/gpu-bench-quick
./scripts/gpu-bench.sh prepare --quick --binaries "${CARGO_TARGET_DIR:-target}/debug" --dir "$GB/carry"
./scripts/gpu-bench.sh run "$GB/out" --quick --dir "$GB/carry" --work "$GB/work" --no-torch \
    --soak 4 --soak-small 200
./scripts/gpu-bench.sh report "$GB/out" --output "$GB/report.md"
(cd web && cargo fmt -- --check)
./scripts/web.sh test
