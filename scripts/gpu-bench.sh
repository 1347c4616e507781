#!/usr/bin/env bash
# Kiln on a real GPU, PyTorch beside it, in one short run (issue #32).
#
#   scripts/gpu-bench.sh prepare [--quick]   here: release binaries (kiln,
#       minilm, kiln-run, stripped), the Vulkan loader .debs, MiniLM with
#       its weights packed int8 per row, the workload programs, a manifest:
#       all in .gpu-bench/ (ignored; under 64 MiB, for the device's `carry`)
#   scripts/gpu-bench.sh run OUTDIR [--quick] [--budget S] [--only A,B]
#       [--soak N] [--soak-small N] [--variants S]
#       there: unpacks the binaries, and the loaders where none is
#       installed, then the WGSL
#       copy probe (`kiln bandwidth`), `kiln profile --json` per workload,
#       MiniLM at 1x16, 8x128, 32x128, and PyTorch (CUDA eager and
#       torch.compile) on the same workloads and weights; writes
#       OUTDIR/kiln.json, torch.json, system.json; with --soak, MiniLM N
#       times on one session (4 threads) and/or a small program, memory
#       reported after the warm-up and at the end (issue #30's soak);
#       before PyTorch, for at most --variants S seconds (120; 0: none),
#       each compile choice of VARIANTS in gpu_bench.py overridden alone
#       (KILN_TILE_TRANSPOSES=off, KILN_FUSE_ATTENTION=off, ...), timed
#       beside its default, the faster ones checked: the tuning round's data
#   scripts/gpu-bench.sh report OUTDIR [--output F]
#       here: docs/performance-gpu.md from those files
#
# On the GPU machine (device tool), with .gpu-bench carried:
#   scripts/gpu-bench.sh run $OUT 2>&1 | tee $OUT/log.txt
# `--quick` (small workloads, MiniLM 1x16) is the lavapipe dry run the test
# suite makes, so the script is known to work before a GPU is at hand.
set -euo pipefail
cd "$(dirname "$0")/.."
exec python3 scripts/gpu_bench.py "$@"
