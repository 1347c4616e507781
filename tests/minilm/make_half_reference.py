#!/usr/bin/env python3
"""Writes sentence-transformers' all-MiniLM-L6-v2 in half precision for Kiln's
f16-arithmetic test.

    python3 tests/minilm/make_half_reference.py [--cache-dir DIR]

The model of make_reference.py (same cache, same sentences), converted with
`model.half()` and run on the CPU, each sentence on its own:

  reference_f16.safetensors   embeddings  f32 [n, 384]  SentenceTransformer.encode of
                                                        the half model, widened to f32

PyTorch's half model computes as Kiln's f16 arithmetic is meant to: f16
weights and activations, products and reductions accumulating in f32.
"""

import argparse
import sys
from pathlib import Path

import make_reference as mr  # noqa: E402  (beside this file; sets the offline env)
import numpy as np
import torch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cache-dir")
    args = ap.parse_args()
    model = mr.load_model(mr.resolve_cache_dir(args.cache_dir)).half()
    rows = []
    with torch.no_grad():
        for s in mr.SENTENCES:
            e = model.encode([s], batch_size=1, convert_to_tensor=True)
            if e.dtype != torch.float16:
                mr.fail(f"the half model returned {e.dtype}")
            rows.append(e.float().cpu().numpy()[0])
    emb = np.stack(rows).astype(np.float32)
    if not np.isfinite(emb).all():
        mr.fail("non-finite embeddings from the half model")
    meta = {"torch": torch.__version__, "model": "all-MiniLM-L6-v2 .half() on the CPU"}
    mr.write_safetensors(mr.HERE / "reference_f16.safetensors", {"embeddings": emb}, meta)
    print(f"wrote {mr.HERE / 'reference_f16.safetensors'}: {emb.shape[0]} sentences", file=sys.stderr)


if __name__ == "__main__":
    main()
