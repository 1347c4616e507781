#!/usr/bin/env python3
"""PyTorch side of examples/finetune_minilm.rs: all-MiniLM-L6-v2
(sentence-transformers) with only encoder layer 5 trainable, the same
sentence pairs, cosine-similarity loss and SGD steps; prints one JSON object
{"losses": [...]}.

    python3 tests/torch_ref/finetune_minilm.py MODEL_DIR --steps 10 --lr 0.3
"""

import argparse
import json
import sys

import torch
from sentence_transformers import SentenceTransformer

# Keep in step with PAIRS in examples/finetune_minilm.rs.
PAIRS = [
    ("A man is playing a guitar.", "Someone plays an instrument.", 0.9),
    ("The stock market fell sharply today.", "A cat sleeps on the sofa.", 0.0),
    ("The weather is cold and rainy.", "It is a warm sunny day.", 0.2),
    ("She is reading a book in the library.", "A woman reads in a quiet room.", 0.8),
]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("model_dir")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--lr", type=float, default=0.3)
    a = ap.parse_args()
    torch.manual_seed(0)
    model = SentenceTransformer(a.model_dir, device="cpu")
    model.eval()  # no dropout: the same function Kiln differentiates
    params = []
    for name, p in model.named_parameters():
        p.requires_grad_(".layer.5." in name)
        if p.requires_grad:
            params.append(p)
    texts = [p[0] for p in PAIRS] + [p[1] for p in PAIRS]
    feats = model.tokenize(texts)
    target = torch.tensor([p[2] for p in PAIRS])
    n = len(PAIRS)
    losses = []
    for _ in range(a.steps):
        e = model(dict(feats))["sentence_embedding"]
        cos = (e[:n] * e[n:]).sum(1)
        loss = ((cos - target) ** 2).mean()
        grads = torch.autograd.grad(loss, params)
        with torch.no_grad():
            for p, g in zip(params, grads):
                p.sub_(g, alpha=a.lr)
        losses.append(loss.item())
    print(json.dumps({"losses": losses, "trainable": len(params), "torch": torch.__version__}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
