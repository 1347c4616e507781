#!/usr/bin/env python3
"""PyTorch eager side of examples/train_mlp.rs: the same MLP, data and initial
weights (read from the safetensors file the example writes), trained by the
same SGD steps; prints one JSON object {"losses": [...], "ms_per_step": x}.

    python3 tests/torch_ref/train_mlp.py INIT.safetensors --steps 50 --lr 0.5 [--device cuda]
"""

import argparse
import json
import sys
import time

import torch
from safetensors.torch import load_file


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("init")
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--lr", type=float, default=0.5)
    ap.add_argument("--device", default="cpu")
    a = ap.parse_args()
    t = {k: v.to(a.device) for k, v in load_file(a.init).items()}
    w = {k: t[k].clone().requires_grad_(True) for k in ("w1", "b1", "w2", "b2")}
    x, y = t["x"], t["y"].long()

    def loss_fn():
        h = torch.relu(torch.nn.functional.linear(x, w["w1"], w["b1"]))
        o = torch.nn.functional.linear(h, w["w2"], w["b2"])
        return torch.nn.functional.cross_entropy(o, y)

    losses = []
    start = time.perf_counter()
    for _ in range(a.steps):
        loss = loss_fn()
        grads = torch.autograd.grad(loss, list(w.values()))
        with torch.no_grad():
            for p, g in zip(w.values(), grads):
                p.sub_(g, alpha=a.lr)
        losses.append(loss.item())
    if a.device == "cuda":
        torch.cuda.synchronize()
    ms = (time.perf_counter() - start) * 1e3 / a.steps
    print(json.dumps({"losses": losses, "ms_per_step": ms, "torch": torch.__version__, "device": a.device}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
