#!/usr/bin/env python3
"""Kiln on a real GPU in one short run, PyTorch beside it (see
scripts/gpu-bench.sh, which calls this file).

    gpu_bench.py prepare [--quick] [--dir D]      here: one folder to carry
    gpu_bench.py run OUTDIR [--quick] [--dir D] [--budget S] [--only A,B]
                                                  there: JSON into OUTDIR
    gpu_bench.py report OUTDIR [--output F]       here: the markdown report
    gpu_bench.py torch MANIFEST WORKDIR OUT.json  (run's PyTorch side)

The workloads are defined once, below: each is a Kiln text program and the
same computation written in PyTorch. Only the standard library is needed
here and on lavapipe; the GPU machine's PyTorch (and numpy, if present)
is used there.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import lzma
import math
import os
import random
import shutil
import struct
import subprocess
import sys
import time
from array import array
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_DIR = REPO / ".gpu-bench"
# What travels to the GPU machine (tracked files travel anyway).
CARRY_LIMIT = 64 << 20

# Sentences repeated to fill MiniLM's batches (as `minilm --profile` does).
SENTENCES = [
    "A man is playing a guitar.",
    "Someone plays a guitar.",
    "The stock market fell sharply today.",
]


# ---------------------------------------------------------------- workloads

class Workload:
    """A Kiln program, its parameters (those in `weights` are session
    constants on both sides) and the PyTorch function of the same
    computation (`torch_fn(t, **params)` with `t` the torch module)."""

    def __init__(self, name, kind, params, body, ret, weights, torch_fn, note):
        self.name, self.kind, self.note = name, kind, note
        self.params = params  # [(name, dtype, sizes)]
        self.body, self.ret = body, ret
        self.weights = set(weights)
        self.torch_fn = torch_fn

    def program(self) -> str:
        ps = ", ".join(f"%{n}: {d}[{', '.join(map(str, s))}]" for n, d, s in self.params)
        lines = "\n".join("  " + ln.strip() for ln in self.body.strip().splitlines())
        return f"graph {self.name}({ps}) {{\n{lines}\n  return {self.ret}\n}}\n"


def chain(n):
    def f(t, x):
        return t.tanh(x * 2.0 + 1.0) * 0.5 - x
    return Workload(f"chain_{n}x{n}", "memory", [("x", "f32", [n, n])],
                    "%a = mul(%x, 2.0)\n%b = add(%a, 1.0)\n%c = tanh(%b)\n%d = mul(%c, 0.5)\n%e = sub(%d, %x)",
                    "%e", [], f, "tanh(x * 2 + 1) * 0.5 - x")


def transposed_chain(n, transposed=True):
    # examples/programs/transposed_chain.txt at n x n; `transposed=False`:
    # the same chain with x * 1.0 for x.t() (what the transpose costs).
    def f(t, x, b):
        tt = x.t() if transposed else x * 1.0
        a = tt + b
        g = t.exp(t.tanh(a * 0.5) * t.sigmoid(a))
        return (g - tt) * 1.5 + 0.25
    first = "%t = t(%x)" if transposed else "%t = mul(%x, 1.0)"
    body = first + """
%a = add(%t, %b)
%c = mul(%a, 0.5)
%d = tanh(%c)
%e = sigmoid(%a)
%f = mul(%d, %e)
%g = exp(%f)
%h = sub(%g, %t)
%i = mul(%h, 1.5)
%j = add(%i, 0.25)"""
    name = f"{'transposed' if transposed else 'plain'}_chain_{n}x{n}"
    return Workload(name, "memory", [("x", "f32", [n, n]), ("b", "f32", [n])], body, "%j", [], f,
                    "x.t() (or x * 1.0) + row, 8 elementwise ops")


def softmax(r, c):
    def f(t, s):
        return t.softmax(s, -1)
    return Workload(f"softmax_{r}x{c}", "memory", [("s", "f32", [r, c])],
                    "%p = softmax(%s, -1)", "%p", [], f, "MiniLM 32x128's attention rows")


def layer_norm(r, c):
    def f(t, x, g, b):
        return t.nn.functional.layer_norm(x, [c], g, b, 1e-12)
    return Workload(f"layer_norm_{r}x{c}", "memory",
                    [("x", "f32", [r, c]), ("g", "f32", [c]), ("b", "f32", [c])],
                    f"%y = layer_norm(%x, [{c}], %g, %b, 1e-12)", "%y", ["g", "b"], f,
                    "MiniLM 32x128's layer norm")


def linear(m, k, n):
    def f(t, x, w, b):
        return t.nn.functional.linear(x, w, b)
    return Workload(f"linear_{m}x{k}x{n}", "product",
                    [("x", "f32", [m, k]), ("w", "f32", [n, k]), ("b", "f32", [n])],
                    "%y = linear(%x, %w, %b)", "%y", ["w", "b"], f,
                    "x W^T + b, weights constant")


def mm(m, k, n):
    def f(t, a, b):
        return t.mm(a, b)
    return Workload(f"mm_{m}x{k}x{n}", "product", [("a", "f32", [m, k]), ("b", "f32", [k, n])],
                    "%c = mm(%a, %b)", "%c", [], f, "both operands inputs")


def attention(b, h, s, d):
    scale = 1.0 / math.sqrt(d)

    def f(t, q, k, v, mask):
        p = t.softmax(t.matmul(q, k.transpose(-2, -1)) * scale + mask, -1)
        return t.matmul(p, v)
    return Workload(f"attention_{b}x{h}x{s}x{d}", "mixed",
                    [("q", "f32", [b, h, s, d]), ("k", "f32", [b, h, s, d]),
                     ("v", "f32", [b, h, s, d]), ("mask", "f32", [b, 1, 1, s])],
                    f"""%kt = transpose(%k, -2, -1)
                    %s = matmul(%q, %kt)
                    %s2 = mul(%s, {scale!r})
                    %s3 = add(%s2, %mask)
                    %p = softmax(%s3, -1)
                    %o = matmul(%p, %v)""", "%o", [], f,
                    "softmax(Q K^T / sqrt(d) + mask) V, additive mask per key")


def encoder_layer(b, s, hid=384, heads=12, ffn=1536):
    d = hid // heads
    scale = 1.0 / math.sqrt(d)

    def f(t, x, mask, wq, bq, wk, bk, wv, bv, wo, bo, g1, b1, w1, c1, w2, c2, g2, b2):
        F = t.nn.functional
        q = F.linear(x, wq, bq).view(b, s, heads, d).transpose(1, 2)
        k = F.linear(x, wk, bk).view(b, s, heads, d).permute(0, 2, 3, 1)
        v = F.linear(x, wv, bv).view(b, s, heads, d).transpose(1, 2)
        p = t.softmax(t.matmul(q, k) * scale + mask, -1)
        c = t.matmul(p, v).transpose(1, 2).reshape(b, s, hid)
        h = F.layer_norm(F.linear(c, wo, bo) + x, [hid], g1, b1, 1e-12)
        y = F.linear(F.gelu(F.linear(h, w1, c1)), w2, c2)
        return F.layer_norm(y + h, [hid], g2, b2, 1e-12)
    w = [("wq", [hid, hid]), ("bq", [hid]), ("wk", [hid, hid]), ("bk", [hid]),
         ("wv", [hid, hid]), ("bv", [hid]), ("wo", [hid, hid]), ("bo", [hid]),
         ("g1", [hid]), ("b1", [hid]), ("w1", [ffn, hid]), ("c1", [ffn]),
         ("w2", [hid, ffn]), ("c2", [hid]), ("g2", [hid]), ("b2", [hid])]
    body = f"""%q0 = linear(%x, %wq, %bq)
    %q1 = view(%q0, [{b}, {s}, {heads}, {d}])
    %q = transpose(%q1, 1, 2)
    %k0 = linear(%x, %wk, %bk)
    %k1 = view(%k0, [{b}, {s}, {heads}, {d}])
    %k = permute(%k1, [0, 2, 3, 1])
    %v0 = linear(%x, %wv, %bv)
    %v1 = view(%v0, [{b}, {s}, {heads}, {d}])
    %v = transpose(%v1, 1, 2)
    %sc = matmul(%q, %k)
    %sc2 = mul(%sc, {scale!r})
    %sc3 = add(%sc2, %mask)
    %p = softmax(%sc3, -1)
    %c = matmul(%p, %v)
    %ct = transpose(%c, 1, 2)
    %cm = reshape(%ct, [{b}, {s}, {hid}])
    %a = linear(%cm, %wo, %bo)
    %r1 = add(%a, %x)
    %h = layer_norm(%r1, [{hid}], %g1, %b1, 1e-12)
    %f0 = linear(%h, %w1, %c1)
    %f1 = gelu(%f0)
    %f2 = linear(%f1, %w2, %c2)
    %r2 = add(%f2, %h)
    %y = layer_norm(%r2, [{hid}], %g2, %b2, 1e-12)"""
    return Workload(f"encoder_layer_{b}x{s}", "mixed",
                    [("x", "f32", [b, s, hid]), ("mask", "f32", [b, 1, 1, s])]
                    + [(n, "f32", sz) for n, sz in w],
                    body, "%y", [n for n, _ in w], f,
                    f"a BERT layer (MiniLM's: hidden {hid}, {heads} heads, FFN {ffn}), weights constant")


def llama_block(t_new, dim=512, heads=8, cache=256, ffn=1408):
    d = dim // heads
    half = d // 2
    start = cache - t_new
    scale = 1.0 / math.sqrt(d)

    def f(t, x, attn_norm, wq, wk, wv, wo, mlp_norm, w1, w3, w2, cos, sin, k_cache, v_cache):
        F = t.nn.functional

        def rms(z, g):
            return z * t.rsqrt(z.pow(2).mean(-1, keepdim=True) + 1e-6) * g

        def rot(z):
            return t.cat([-z[..., half:], z[..., :half]], -1)
        h = rms(x, attn_norm)
        q = F.linear(h, wq).view(1, t_new, heads, d).transpose(1, 2)
        k = F.linear(h, wk).view(1, t_new, heads, d).transpose(1, 2)
        v = F.linear(h, wv).view(1, t_new, heads, d).transpose(1, 2)
        q = q * cos + rot(q) * sin
        k = k * cos + rot(k) * sin
        k_cache[:, :, start:cache].copy_(k)
        v_cache[:, :, start:cache].copy_(v)
        mask = t.full([t_new, cache], float("-inf"), device=x.device).triu(start + 1)
        p = t.softmax(t.matmul(q, k_cache.transpose(-2, -1)) * scale + mask, -1)
        o = t.matmul(p, v_cache).transpose(1, 2).reshape(1, t_new, dim)
        x2 = x + F.linear(o, wo)
        h2 = rms(x2, mlp_norm)
        return x2 + F.linear(F.silu(F.linear(h2, w1)) * F.linear(h2, w3), w2)
    w = [("attn_norm", [dim]), ("wq", [dim, dim]), ("wk", [dim, dim]), ("wv", [dim, dim]),
         ("wo", [dim, dim]), ("mlp_norm", [dim]), ("w1", [ffn, dim]), ("w3", [ffn, dim]),
         ("w2", [dim, ffn]), ("cos", [t_new, d]), ("sin", [t_new, d])]
    params = ([("x", "f32", [1, t_new, dim])] + [(n, "f32", sz) for n, sz in w]
              + [("k_cache", "f32", [1, heads, cache, d]), ("v_cache", "f32", [1, heads, cache, d])])
    rms_body = """%{p}sq = pow(%{x}, 2)
    %{p}ms = mean(%{p}sq, [-1], true)
    %{p}eps = add(%{p}ms, 1e-06)
    %{p}r = rsqrt(%{p}eps)
    %{p}xn = mul(%{x}, %{p}r)
    %{p}h = mul(%{p}xn, %{g})"""
    rot_body = """%{z}a = slice(%{z}, -1, 0, {half})
    %{z}b = slice(%{z}, -1, {half}, {d})
    %{z}bn = neg(%{z}b)
    %{z}r = cat([%{z}bn, %{z}a], -1)
    %{z}c = mul(%{z}, %cos)
    %{z}s = mul(%{z}r, %sin)
    %{z}rot = add(%{z}c, %{z}s)"""
    body = "\n".join([
        rms_body.format(p="n1", x="x", g="attn_norm"),
        f"""%q0 = linear(%n1h, %wq)
        %k0 = linear(%n1h, %wk)
        %v0 = linear(%n1h, %wv)
        %q1 = view(%q0, [1, {t_new}, {heads}, {d}])
        %k1 = view(%k0, [1, {t_new}, {heads}, {d}])
        %v1 = view(%v0, [1, {t_new}, {heads}, {d}])
        %q = transpose(%q1, 1, 2)
        %k = transpose(%k1, 1, 2)
        %v = transpose(%v1, 1, 2)""",
        rot_body.format(z="q", half=half, d=d),
        rot_body.format(z="k", half=half, d=d),
        f"""%kslot = slice(%k_cache, 2, {start}, {cache})
        %kw = copy_(%kslot, %krot)
        %vslot = slice(%v_cache, 2, {start}, {cache})
        %vw = copy_(%vslot, %v)
        %kt = transpose(%k_cache, -2, -1)
        %s = matmul(%qrot, %kt)
        %s2 = mul(%s, {scale!r})
        %ninf = full([{t_new}, {cache}], -inf)
        %mask = triu(%ninf, {start + 1})
        %s3 = add(%s2, %mask)
        %p = softmax(%s3, -1)
        %o = matmul(%p, %v_cache)
        %ot = transpose(%o, 1, 2)
        %om = reshape(%ot, [1, {t_new}, {dim}])
        %a = linear(%om, %wo)
        %x2 = add(%x, %a)""",
        rms_body.format(p="n2", x="x2", g="mlp_norm"),
        """%g = linear(%n2h, %w1)
        %gs = silu(%g)
        %u = linear(%n2h, %w3)
        %gu = mul(%gs, %u)
        %dn = linear(%gu, %w2)
        %y = add(%x2, %dn)""",
    ])
    return Workload(f"llama_block_{t_new}x{dim}", "mixed", params, body, "%y",
                    [n for n, _ in w], f,
                    f"examples/programs/llama_block.txt scaled up: {t_new} new tokens, width {dim}, "
                    f"{heads} heads, KV cache of {cache} written in place, SiLU MLP {ffn}")


def workloads(quick: bool) -> list[Workload]:
    if quick:
        return [chain(256), transposed_chain(256), transposed_chain(256, False), softmax(384, 128), layer_norm(64, 384), linear(64, 96, 128),
                linear(1, 96, 128), mm(64, 96, 128), attention(1, 2, 16, 32),
                encoder_layer(1, 16), llama_block(8, dim=64, heads=2, cache=16, ffn=96)]
    return [chain(4096), transposed_chain(4096), transposed_chain(4096, False),
            softmax(49152, 128), layer_norm(4096, 384),
            linear(4096, 384, 1536), linear(16, 384, 1536), linear(1, 384, 1536),
            mm(4096, 384, 1536), attention(8, 12, 128, 32), encoder_layer(8, 128),
            llama_block(128)]


# The import suite's fixtures (tests/fixtures/import: small `torch.export`
# archives, their inputs and PyTorch's outputs), part of the tree a device
# call carries: profiled, and their GPU results checked against PyTorch's.
IMPORTS = REPO / "tests" / "fixtures" / "import"
IMPORTS_QUICK = ["bert", "llama", "tiny_resnet", "swin"]
# tests/import.rs's tolerance: |kiln - torch| <= ABS + REL |torch|.
IMPORT_ABS, IMPORT_REL = 1e-5, 1e-4


def import_models(quick: bool) -> list[str]:
    names = sorted(p.name[:-len(".pt2")] for p in IMPORTS.glob("*.pt2")
                   if (IMPORTS / (p.name[:-4] + ".expected.safetensors")).exists()
                   and (IMPORTS / (p.name[:-4] + ".inputs.safetensors")).exists())
    return [n for n in names if n in IMPORTS_QUICK] if quick else names


def minilm_buckets(quick: bool) -> list[tuple[int, int]]:
    return [(1, 16)] if quick else [(1, 16), (8, 128), (32, 128)]


# Compile choices overridden one at a time (`CompileOptions`; each
# variable's default is the device's own choice), timed after the defaults
# in the same run, so that the first GPU run already gives the tuning round
# its numbers: (workloads whose names start so, "minilm_BxT" for MiniLM;
# the environment).
VARIANTS = [
    ("transposed_chain", {"KILN_TRANSPOSE_TILE": "16"}),
    ("transposed_chain", {"KILN_TILE_TRANSPOSES": "off", "KILN_TRANSPOSE_BLOCKS": "on"}),
    ("transposed_chain", {"KILN_TILE_TRANSPOSES": "off", "KILN_TRANSPOSE_BLOCKS": "off"}),
    ("plain_chain", {"KILN_TRANSPOSE_BLOCKS": "on"}),
    ("softmax", {"KILN_SUBGROUPS": "off"}),
    ("layer_norm", {"KILN_SUBGROUPS": "off"}),
    ("linear", {"KILN_TALL_TILES": "off"}),
    ("linear", {"KILN_WIDE_BLOCKS": "on"}),
    ("mm", {"KILN_TALL_TILES": "off"}),
    ("mm", {"KILN_WIDE_BLOCKS": "on"}),
    ("attention", {"KILN_FUSE_ATTENTION": "off"}),
    ("encoder_layer", {"KILN_FUSE_ATTENTION": "off"}),
    ("encoder_layer", {"KILN_CHAIN_ROWS": "off"}),
    ("encoder_layer", {"KILN_CONTIGUOUS_OPERANDS": "on"}),
    ("llama_block", {"KILN_SEQUENCE": "off"}),
    ("llama_block", {"KILN_SHARE_LAUNCHES": "off"}),
    ("minilm_", {"KILN_FUSE_ATTENTION": "off"}),
    ("minilm_", {"KILN_WIDE_BLOCKS": "on"}),
]
# A variant this much faster than the default is checked against the
# reference as well: a candidate for the default.
VARIANT_CANDIDATE = 0.97


def variant_label(env: dict) -> str:
    return " ".join(f"{k}={v}" for k, v in env.items())


# ---------------------------------------------------------------- helpers

T0 = time.monotonic()


def log(msg: str) -> None:
    print(f"[gpu-bench {time.monotonic() - T0:6.1f}s] {msg}", file=sys.stderr, flush=True)


def sh(cmd, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, check=True, **kw)


def write_safetensors(path: Path, tensors: dict) -> None:
    """tensors: name -> (dtype string 'F32'/'I8', sizes, bytes)."""
    header, offset = {}, 0
    for name, (dt, sizes, data) in tensors.items():
        header[name] = {"dtype": dt, "shape": list(sizes), "data_offsets": [offset, offset + len(data)]}
        offset += len(data)
    h = json.dumps(header, separators=(",", ":")).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for _, _, data in tensors.values():
            f.write(data)


def read_safetensors(path: Path) -> dict:
    raw = Path(path).read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    base = 8 + n
    out = {}
    for name, m in header.items():
        if name == "__metadata__":
            continue
        a, b = m["data_offsets"]
        out[name] = (m["dtype"], m["shape"], raw[base + a:base + b])
    return out


def pack_weights(src: Path, dst: Path) -> None:
    """f32 matrices as int8 per row with an f32 scale per row (a quarter of
    the bytes: MiniLM's 91 MB travel in 23 MB); vectors stay f32. Both
    systems run on the dequantized weights there."""
    out = {}
    for name, (dt, shape, data) in read_safetensors(src).items():
        if dt != "F32" or len(shape) != 2:
            out[name] = (dt, shape, data)
            continue
        rows, cols = shape
        v = array("f")
        v.frombytes(data)
        q = bytearray(rows * cols)
        scales = array("f", [0.0] * rows)
        for r in range(rows):
            row = v[r * cols:(r + 1) * cols]
            m = max(max(row), -min(row))
            s = m / 127.0 if m > 0 else 1.0
            scales[r] = s
            inv = 1.0 / s
            q[r * cols:(r + 1) * cols] = bytes((round(x * inv)) & 0xFF for x in row)
        out[name + ".q"] = ("I8", shape, bytes(q))
        out[name + ".s"] = ("F32", [rows, 1], scales.tobytes())
    write_safetensors(dst, out)


def unpack_weights(src: Path, dst: Path) -> None:
    t = read_safetensors(src)
    out = {}
    try:
        import numpy as np
    except ImportError:
        np = None
    for name, (dt, shape, data) in t.items():
        if name.endswith(".s"):
            continue
        if name.endswith(".q"):
            base = name[:-2]
            _, _, sdata = t[base + ".s"]
            rows, cols = shape
            if np is not None:
                q = np.frombuffer(data, dtype=np.int8).reshape(rows, cols).astype(np.float32)
                s = np.frombuffer(sdata, dtype=np.float32).reshape(rows, 1)
                out[base] = ("F32", shape, (q * s).astype(np.float32).tobytes())
            else:
                s = array("f")
                s.frombytes(sdata)
                vals = array("f", (((b - 256) if b > 127 else b) * s[i // cols]
                                   for i, b in enumerate(data)))
                out[base] = ("F32", shape, vals.tobytes())
        else:
            out[name] = (dt, shape, data)
    write_safetensors(dst, out)


def random_f32(n: int, seed: int, scale: float) -> bytes:
    try:
        import numpy as np
        r = np.random.default_rng(seed)
        return (r.uniform(-scale, scale, n)).astype(np.float32).tobytes()
    except ImportError:
        rnd = random.Random(seed)
        return array("f", (rnd.uniform(-scale, scale) for _ in range(n))).tobytes()


def param_f32(w: Workload, i: int) -> bytes:
    """Parameter `i` of the workload, seeded: weights small (norm gains 1),
    as trained weights are; other inputs in [-1, 1)."""
    name, _, sizes = w.params[i]
    n = math.prod(sizes)
    if name not in w.weights:
        return random_f32(n, 2000 + i, 1.0)
    if name.startswith("g") or name.endswith("norm"):
        return array("f", [1.0] * n).tobytes()
    return random_f32(n, 1000 + i, 1.0 / math.sqrt(sizes[-1]))


def weights_file(w: Workload, path: Path) -> bool:
    """The workload's constant parameters (`param_f32`) as a safetensors
    file; False when it has none."""
    ts = {}
    for i, (name, dt, sizes) in enumerate(w.params):
        if name in w.weights:
            ts[name] = ("F32", sizes, param_f32(w, i))
    if not ts:
        return False
    write_safetensors(path, ts)
    return True


# Kiln's GPU results against its reference interpreter (CPU) on the same
# inputs: largest difference over the reference's largest magnitude.
CHECK_TOLERANCE = 1e-4
# MiniLM's embeddings (unit vectors): cosine to the reference's, per sentence.
CHECK_COSINE = 0.9999


def f32_values(data: bytes):
    try:
        import numpy as np
        return np.frombuffer(data, dtype=np.float32).astype(np.float64)
    except ImportError:
        return array("f", data)


def relative_error(got: bytes, want: bytes) -> float:
    g, w = f32_values(got), f32_values(want)
    if len(g) != len(w):
        return math.inf
    try:
        import numpy as np
        fin = np.isfinite(w)
        scale = max(1.0, float(np.abs(w[fin]).max(initial=0.0)))
        same_nan = np.array_equal(np.isfinite(g), fin)
        return float(np.abs(g[fin] - w[fin]).max(initial=0.0)) / scale if same_nan else math.inf
    except ImportError:
        pairs = [(a, b) for a, b in zip(g, w) if math.isfinite(b)]
        scale = max([1.0] + [abs(b) for _, b in pairs])
        return max([0.0] + [abs(a - b) for a, b in pairs]) / scale


def check_workload(w: Workload, kiln: str, prog: Path, work: Path, env: dict, timeout: float) -> dict:
    """`kiln run` of the workload on the GPU and on the reference
    interpreter, every parameter from `param_f32`: each result's largest
    difference, relative."""
    ts = {}
    for i, (name, dt, sizes) in enumerate(w.params):
        if dt != "f32":
            return {"skipped": f"parameter {name} is {dt}"}
        ts[name] = ("F32", sizes, param_f32(w, i))
    inputs = work / f"{w.name}.check-inputs.safetensors"
    write_safetensors(inputs, ts)
    got, want = work / f"{w.name}.gpu.safetensors", work / f"{w.name}.reference.safetensors"
    t = time.monotonic()
    for backend, path in (("gpu", got), ("reference", want)):
        left = timeout - (time.monotonic() - t)
        if left < 5:
            return {"error": f"no time left for the {backend} run"}
        try:
            p = subprocess.run([kiln, "run", str(prog), "--inputs", str(inputs), "--output", str(path),
                                "--backend", backend], env=env, capture_output=True, text=True,
                               timeout=left)
        except subprocess.TimeoutExpired:
            return {"error": f"the {backend} run took over {left:.0f} s"}
        if p.returncode != 0:
            return {"error": f"kiln run --backend {backend}: {p.stderr[-300:]}"}
    g, r = read_safetensors(got), read_safetensors(want)
    errs = {k: relative_error(g[k][2], r[k][2]) for k in r if k in g and r[k][0] == "F32"}
    worst = max(errs.values(), default=0.0)
    out = {"max_relative_error": worst, "results": len(errs), "tolerance": CHECK_TOLERANCE,
           "wall_s": round(time.monotonic() - t, 1)}
    if worst > CHECK_TOLERANCE or len(errs) < len(r):
        out["error"] = f"GPU results differ from the reference: {worst:.3g} (tolerance {CHECK_TOLERANCE})"
    return out


def check_import(kiln: str, name: str, work: Path, env: dict, timeout: float) -> dict:
    """`kiln run NAME.pt2 --backend gpu` against PyTorch's outputs (the
    fixture's expected file), with the import suite's tolerance."""
    out = work / f"{name}.import.safetensors"
    try:
        p = subprocess.run([kiln, "run", str(IMPORTS / f"{name}.pt2"), "--inputs",
                            str(IMPORTS / f"{name}.inputs.safetensors"), "--output", str(out),
                            "--backend", "gpu"], env=env, capture_output=True, text=True,
                           timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"error": f"kiln run took over {timeout:.0f} s"}
    if p.returncode != 0:
        return {"error": f"kiln run --backend gpu: {p.stderr[-300:]}"}
    got, want = read_safetensors(out), read_safetensors(IMPORTS / f"{name}.expected.safetensors")
    if sorted(got) != sorted(want):
        return {"error": f"wrote {sorted(got)}, PyTorch's file has {sorted(want)}"}
    worst, bad = 0.0, []
    for k, (dt, shape, data) in want.items():
        if got[k][0] != dt or got[k][1] != shape:
            bad.append(f"{k}: {got[k][0]}{got[k][1]}, PyTorch {dt}{shape}")
        elif dt != "F32":
            if got[k][2] != data:
                bad.append(f"{k} differs")
        else:
            for x, y in zip(f32_values(got[k][2]), f32_values(data)):
                if math.isnan(x) and math.isnan(y):
                    continue
                excess = abs(x - y) / (IMPORT_ABS + IMPORT_REL * abs(y))
                worst = max(worst, excess if excess == excess else math.inf)
    r = {"worst_of_tolerance": worst, "results": len(want)}
    if bad or worst > 1.0:
        r["error"] = "; ".join(bad) or f"outside the tolerance ({worst:.3g} of it)"
    return r


def check_minilm(minilm: str, model: Path, work: Path, env: dict, timeout: float) -> dict:
    """MiniLM's embeddings of SENTENCES on the GPU against the reference
    interpreter's: the smallest cosine."""
    t = time.monotonic()
    emb = {}
    for backend in ("gpu", "reference"):
        path = work / f"minilm.{backend}.safetensors"
        left = timeout - (time.monotonic() - t)
        try:
            p = subprocess.run([minilm, "--model", str(model), "--backend", backend, "--output",
                                str(path), *SENTENCES], env=env, capture_output=True, text=True,
                               timeout=max(left, 5))
        except subprocess.TimeoutExpired:
            return {"error": f"the {backend} run took over {left:.0f} s"}
        if p.returncode != 0:
            return {"error": f"minilm --backend {backend}: {p.stderr[-300:]}"}
        emb[backend] = f32_values(read_safetensors(path)["embeddings"][2])
    d = 384
    cos = []
    for i in range(len(SENTENCES)):
        a = emb["gpu"][i * d:(i + 1) * d]
        b = emb["reference"][i * d:(i + 1) * d]
        dot = sum(x * y for x, y in zip(a, b))
        na = math.sqrt(sum(x * x for x in a))
        nb = math.sqrt(sum(y * y for y in b))
        cos.append(dot / (na * nb) if na and nb else 0.0)
    out = {"min_cosine": min(cos), "sentences": len(cos), "tolerance": CHECK_COSINE,
           "wall_s": round(time.monotonic() - t, 1)}
    if min(cos) < CHECK_COSINE:
        out["error"] = f"GPU embeddings differ from the reference: cosine {min(cos):.6f}"
    return out


def du(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


# ---------------------------------------------------------------- prepare

MODEL_FILES = ["config.json", "tokenizer.json", "tokenizer_config.json", "vocab.txt",
               "special_tokens_map.json", "modules.json", "sentence_bert_config.json",
               "config_sentence_transformers.json", "1_Pooling/config.json"]


def pack_binaries(d: Path, quick: bool) -> None:
    """xz the binaries (a third of their size) so the folder and the tree fit
    one carry; the dry run, which never travels, packs fast."""
    for b in sorted((d / "bin").iterdir()):
        with open(b, "rb") as f, lzma.open(str(b) + ".xz", "wb", preset=0 if quick else 6) as g:
            shutil.copyfileobj(f, g)
        b.unlink()


def unpack_binaries(d: Path) -> None:
    for x in sorted((d / "bin").glob("*.xz")):
        b = x.with_suffix("")
        if not b.exists():
            with lzma.open(x, "rb") as f, open(b, "wb") as g:
                shutil.copyfileobj(f, g)
            b.chmod(0o755)


def prepare(args) -> int:
    d = Path(args.dir)
    if d.exists():
        shutil.rmtree(d)
    (d / "bin").mkdir(parents=True)
    if args.binaries:
        # Already built (the test suite's debug binaries): no second build.
        target, profile = Path(args.binaries), f"from {args.binaries}"
    else:
        profile = "release"
        log("building release binaries (kiln, minilm, kiln-run) ...")
        sh(["cargo", "build", "--release", "-p", "kiln", "-p", "kiln-runtime", "--bins"], cwd=REPO)
        target = Path(os.environ.get("CARGO_TARGET_DIR", REPO / "target")) / "release"
    for b in ["kiln", "minilm", "kiln-run"]:
        if not (target / b).exists():
            raise SystemExit(f"{target / b} is missing: build it first (cargo build -p kiln -p kiln-runtime --bins)")
        shutil.copy2(target / b, d / "bin" / b)
        if shutil.which("strip"):
            sh(["strip", str(d / "bin" / b)])

    log("Vulkan loader packages (amd64 .debs) ...")
    debs = d / "debs"
    debs.mkdir()
    lists = Path("/tmp/kiln-gpu-bench-apt")
    (lists / "partial").mkdir(parents=True, exist_ok=True)
    opts = ["-oAPT::Architecture=amd64", "-oAPT::Architectures=amd64", f"-oDir::State::Lists={lists}"]
    quiet = {"stdout": subprocess.DEVNULL}
    sh(["apt-get", *opts, "-qq", "update"], **quiet)
    sh(["apt-get", *opts, "-qq", "download", "libvulkan1", "libegl1", "libglvnd0", "libopengl0",
        "libgl1", "libglx0", "libgles2"], cwd=debs, **quiet)

    log("MiniLM (fetched if missing), weights packed int8 per row ...")
    model_dir = subprocess.run([str(d / "bin" / "minilm"), "--print-model-dir"], check=True,
                               capture_output=True, text=True).stdout.strip().splitlines()[-1]
    model_dir = Path(model_dir)
    (d / "model" / "1_Pooling").mkdir(parents=True)
    for f in MODEL_FILES:
        if (model_dir / f).exists():
            shutil.copy2(model_dir / f, d / "model" / f)
    pack_weights(model_dir / "model.safetensors", d / "weights.int8.safetensors")

    log("workload programs ...")
    (d / "programs").mkdir()
    ws = workloads(args.quick)
    for w in ws:
        (d / "programs" / f"{w.name}.txt").write_text(w.program())
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO,
                            capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                           capture_output=True, text=True).stdout.strip() != ""
    manifest = {
        "quick": args.quick,
        "commit": commit + ("+dirty" if dirty else ""),
        "prepared": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "binaries": profile,
        "workloads": [{"name": w.name, "kind": w.kind, "note": w.note,
                       "params": w.params, "weights": sorted(w.weights)} for w in ws],
        "minilm": [f"{b}x{t}" for b, t in minilm_buckets(args.quick)],
        "imports": import_models(args.quick),
        "sentences": SENTENCES,
    }
    (d / "manifest.json").write_text(json.dumps(manifest, indent=1))
    pack_binaries(d, args.quick)
    # A device call carries the repository's tracked files beside the folder.
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True).stdout
    tree = sum((REPO / f).stat().st_size for f in tracked.decode().split("\0")
               if f and (REPO / f).is_file())
    size = du(d) + tree
    log(f"prepared {d}: {du(d) / 2**20:.1f} MiB, with the tracked tree {size / 2**20:.1f} MiB "
        "of the 64 MiB a device call carries")
    if size > CARRY_LIMIT:
        # The dry run (debug binaries) never travels.
        what = "warning" if args.quick else "error"
        print(f"{what}: {d} is {size / 2**20:.1f} MiB, over the 64 MiB a device call carries",
              file=sys.stderr)
        if not args.quick:
            return 1
    print(d)
    return 0


# ---------------------------------------------------------------- run

def have_vulkan_loader() -> bool:
    out = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True).stdout
    return "libvulkan.so.1" in out


def setup_vulkan(d: Path, env: dict) -> list[str]:
    notes = []
    if not have_vulkan_loader():
        debs = sorted((d / "debs").glob("*.deb"))
        if not debs:
            raise SystemExit("no Vulkan loader here and no .debs in the prepared folder")
        for deb in debs:
            sh(["dpkg", "-x", str(deb), "/"])
        sh(["ldconfig"])
        notes.append(f"unpacked {len(debs)} loader packages")
    icd_dirs = [Path("/usr/share/vulkan/icd.d"), Path("/etc/vulkan/icd.d")]
    have_icd = any(p.is_dir() and any(p.glob("*.json")) for p in icd_dirs)
    nv = Path("/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json")
    if not have_icd and nv.exists():
        env["VK_DRIVER_FILES"] = str(nv)
        env["VK_ICD_FILENAMES"] = str(nv)
        egl = Path("/usr/local/nvidia/share/glvnd/egl_vendor.d/10_nvidia.json")
        if egl.exists():
            env["__EGL_VENDOR_LIBRARY_FILENAMES"] = str(egl)
        notes.append(f"ICD {nv}")
    env.setdefault("WGPU_BACKEND", "vulkan")
    env.setdefault("XDG_RUNTIME_DIR", "/tmp")
    return notes


def system_info(env) -> dict:
    info = {"date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "host": os.uname().nodename, "kernel": os.uname().release}
    try:
        q = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem",
                            "--format=csv,noheader"], capture_output=True, text=True, timeout=30)
        info["nvidia_smi"] = q.stdout.strip() or q.stderr.strip()
    except (OSError, subprocess.TimeoutExpired) as e:
        info["nvidia_smi"] = f"not available ({e})"
    return info


class Budget:
    def __init__(self, seconds: float):
        self.end = time.monotonic() + seconds

    def left(self) -> float:
        return self.end - time.monotonic()


def run_json(cmd, env, timeout) -> dict:
    t = time.monotonic()
    try:
        p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=max(timeout, 1))
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    if p.returncode != 0:
        return {"error": (p.stderr.strip().splitlines() or ["exit " + str(p.returncode)])[-1][:400]}
    try:
        r = json.loads(p.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return {"error": "no JSON in the output: " + p.stdout[-200:]}
    r["wall_s"] = round(time.monotonic() - t, 2)
    return r


def run(args) -> int:
    d = Path(args.dir).resolve()
    out = Path(args.outdir)
    out.mkdir(parents=True, exist_ok=True)
    manifest = json.loads((d / "manifest.json").read_text())
    if manifest["quick"] != args.quick:
        raise SystemExit(f"{d} was prepared {'with' if manifest['quick'] else 'without'} --quick; "
                         "run it the same way")
    budget = Budget(args.budget)
    unpack_binaries(d)
    env = dict(os.environ)
    system = {"vulkan": setup_vulkan(d, env), **system_info(env), "manifest": manifest}
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    only = set(args.only.split(",")) if args.only else None
    kiln = str(d / "bin" / "kiln")
    runs = str(args.runs)
    results: dict = {"workloads": {}, "minilm": {}}
    # Every kernel's WGSL as compiled for this device, for tuning here.
    wgsl = work / "wgsl"
    shutil.rmtree(wgsl, ignore_errors=True)

    def save():
        (out / "kiln.json").write_text(json.dumps(results, indent=1))
        (out / "system.json").write_text(json.dumps(system, indent=1))

    log("copy probe ...")
    results["probe"] = run_json([kiln, "bandwidth", "--json", "--mib", "16" if args.quick else "256"],
                                env, budget.left())
    system["adapter"] = results["probe"].get("adapter")
    log(f"  {results['probe'].get('best_gb_per_s', results['probe'].get('error'))} GB/s best; "
        f"adapter {system['adapter']}")
    save()

    by_name = {w.name: w for w in workloads(args.quick)}
    for w in manifest["workloads"]:
        name = w["name"]
        if only and name not in only:
            continue
        if budget.left() < 30:
            results["workloads"][name] = {"error": "skipped: the run's time budget was spent"}
            continue
        prog = d / "programs" / f"{name}.txt"
        r = run_json(workload_profile_cmd(kiln, d, work, by_name[name], runs), {**env, "KILN_DUMP_WGSL": str(wgsl / name)}, min(120, budget.left() - 20))
        if not args.no_check and "error" not in r:
            c = check_workload(by_name[name], kiln, prog, work, env, min(90, budget.left() - 20))
            r["check"] = c
            if "error" in c:
                r["error"] = c["error"]
        results["workloads"][name] = r
        c = r.get("check", {})
        checked = (f"; {c['max_relative_error']:.2g} from the reference" if "max_relative_error" in c
                   else f"; check: {c.get('skipped', c.get('error'))}" if c else "")
        log(f"kiln {name}: kernels {r.get('kernels_ms', '-')} ms, full {r.get('full_ms', '-')} ms"
            + checked + (f" ERROR {r['error']}" if "error" in r else ""))
        save()

    model = work / "model"
    if model.exists():
        shutil.rmtree(model)
    shutil.copytree(d / "model", model)
    (model / "2_Normalize").mkdir(exist_ok=True)  # modules.json names it; it holds nothing
    unpack_weights(d / "weights.int8.safetensors", model / "model.safetensors")
    for bucket in manifest["minilm"]:
        if only and f"minilm_{bucket}" not in only:
            continue
        if budget.left() < 30:
            results["minilm"][bucket] = {"error": "skipped: the run's time budget was spent"}
            continue
        r = run_json(minilm_profile_cmd(d, model, bucket, runs),
                     {**env, "KILN_DUMP_WGSL": str(wgsl / f"minilm_{bucket}")}, min(180, budget.left() - 20))
        results["minilm"][bucket] = r
        log(f"kiln minilm {bucket}: kernels {r.get('kernels_ms', '-')} ms, full {r.get('full_ms', '-')} ms"
            + (f" ERROR {r['error']}" if "error" in r else ""))
        save()

    results["imports"] = {}
    for name in manifest.get("imports", []):
        if only and f"import_{name}" not in only:
            continue
        if budget.left() < 30:
            results["imports"][name] = {"error": "skipped: the run's time budget was spent"}
            continue
        r = run_json([kiln, "profile", str(IMPORTS / f"{name}.pt2"), "--inputs",
                      str(IMPORTS / f"{name}.inputs.safetensors"), "--runs", runs, "--json"],
                     env, min(120, budget.left() - 20))
        if not args.no_check and "error" not in r:
            r["check"] = check_import(kiln, name, work, env, min(60, budget.left() - 20))
            if "error" in r["check"]:
                r["error"] = r["check"]["error"]
        results["imports"][name] = r
        log(f"kiln import {name}: kernels {r.get('kernels_ms', '-')} ms, full {r.get('full_ms', '-')} ms"
            + (f" ERROR {r['error']}" if "error" in r else
               f"; {r['check']['worst_of_tolerance']:.2g} of the tolerance to PyTorch" if "check" in r else ""))
        save()

    if not args.no_check and budget.left() > 40:
        c = check_minilm(str(d / "bin" / "minilm"), model, work, env, min(120, budget.left() - 20))
        results["minilm_check"] = c
        log("minilm check: " + (c["error"] if "error" in c else f"smallest cosine {c['min_cosine']:.7f}"))
        save()

    if args.variants > 0:
        reserve = 30 if args.no_torch else 150
        results["variants"] = variants_side(args, results, by_name, d, model, work, env,
                                            Budget(min(args.variants, budget.left() - reserve)))
        save()

    if args.soak or args.soak_small:
        results["soak"] = soak_side(args, d, model, work, env, budget)
        save()

    if args.no_torch:
        torch = {"error": "not run (--no-torch)"}
    else:
        log("PyTorch (CUDA eager and torch.compile) ...")
        tout = work / "torch.json"
        tout.unlink(missing_ok=True)
        left = budget.left() - 5
        try:
            p = subprocess.run([sys.executable, __file__, "torch", str(d / "manifest.json"), str(work),
                                str(tout), "--budget", str(left), *(["--only", args.only] if args.only else [])],
                               env=env, timeout=max(left, 10), stdout=subprocess.DEVNULL,
                               stderr=None)
            torch = json.loads(tout.read_text()) if tout.exists() else {
                "error": f"the PyTorch side exited {p.returncode} without results"}
        except subprocess.TimeoutExpired:
            torch = json.loads(tout.read_text()) if tout.exists() else {"error": "timed out"}
            torch["timed_out"] = True
    (out / "torch.json").write_text(json.dumps(torch, indent=1))
    save()
    if wgsl.exists():
        shutil.make_archive(str(out / "wgsl"), "gztar", root_dir=wgsl)
    runs_done = (list(results["workloads"].items()) + list(results["minilm"].items())
                 + [(f"import {n}", r) for n, r in results["imports"].items()]
                 + [("minilm check", results.get("minilm_check", {})), ("probe", results["probe"])])
    failed = [n for n, r in runs_done if "error" in r]
    failed += [f"soak {n}" for n, r in results.get("soak", {}).items() if "error" in r or r.get("rc")]
    failed += [f"variant {v['workload']} {variant_label(v['env'])}" for v in results.get("variants", [])
               if "error" in v or "error" in v.get("check", {})]
    log(f"done: {out}/kiln.json, torch.json, system.json"
        + (f"; Kiln failed on {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0


# ---------------------------------------------------------------- PyTorch

SOAK_PROGRAM = """graph soak(%x: f32[4, 6], %y: f32[6]) {
  %s = add(%x, %y)
  %t = tanh(%s)
  %m = sum(%t, [1])
  return (%t, %m)
}
"""


def workload_profile_cmd(kiln: str, d: Path, work: Path, w: Workload, runs: str) -> list[str]:
    """`kiln profile --json` of workload `w`, its weights as session
    constants where it has any."""
    cmd = [kiln, "profile", str(d / "programs" / f"{w.name}.txt"), "--runs", runs, "--json"]
    wf = work / f"{w.name}.weights.safetensors"
    if weights_file(w, wf):
        cmd += ["--weights", str(wf)]
    return cmd


def minilm_profile_cmd(d: Path, model: Path, bucket: str, runs: str) -> list[str]:
    return [str(d / "bin" / "minilm"), "--model", str(model), "--profile", bucket,
            "--runs", runs, "--json", *SENTENCES]


def variants_side(args, results: dict, by_name: dict, d: Path, model: Path, work: Path, env: dict,
                  budget) -> list:
    """Each of VARIANTS on the workloads and MiniLM buckets it names that
    ran without error, `kiln profile --json` (`minilm --profile`) with its
    environment, while `budget` lasts; those faster than the default by
    VARIANT_CANDIDATE also checked against the reference."""
    kiln = str(d / "bin" / "kiln")
    runs = str(args.runs)
    done = []
    targets = [(f"minilm_{b}", "minilm", b) for b in results["minilm"]] + \
              [(n, "workloads", n) for n in results["workloads"]]
    for prefix, venv in VARIANTS:
        for name, section, key in targets:
            default = results[section].get(key, {})
            if not name.startswith(prefix) or "kernels_ms" not in default or "error" in default:
                continue
            row = {"workload": name, "env": venv, "default_kernels_ms": default["kernels_ms"],
                   "default_full_ms": default.get("full_ms")}
            if budget.left() < 20:
                row["skipped"] = "the variants' time budget was spent"
                done.append(row)
                continue
            e = {**env, **venv}
            cmd = (minilm_profile_cmd(d, model, key, runs) if section == "minilm"
                   else workload_profile_cmd(kiln, d, work, by_name[name], runs))
            r = run_json(cmd, e, min(90, budget.left() - 10))
            for k in ("kernels_ms", "full_ms", "pipelines", "error"):
                if k in r:
                    row[k] = r[k]
            if "kernels" in r:
                row["kernels"] = len(r["kernels"])
                row["over_default"] = r["kernels_ms"] / max(default["kernels_ms"], 1e-9)
            if row.get("over_default", 1) < VARIANT_CANDIDATE and not args.no_check \
                    and budget.left() > 30:
                row["check"] = (check_minilm(str(d / "bin" / "minilm"), model, work, e,
                                             min(90, budget.left() - 10)) if section == "minilm"
                                else check_workload(by_name[name], kiln, d / "programs" / f"{name}.txt",
                                                    work, e, min(90, budget.left() - 10)))
            done.append(row)
            log(f"variant {name} {variant_label(venv)}: kernels {row.get('kernels_ms', '-')} ms "
                f"(default {default['kernels_ms']})" + (f" ERROR {row['error']}" if "error" in row else "")
                + (f"; check: {row['check'].get('error', 'ok')}" if "check" in row else ""))
    return done


def soak_side(args, d: Path, model: Path, work: Path, env: dict, budget) -> dict:
    """Issue #30's soak on the device: `minilm --soak` (buckets alternating)
    and `kiln soak` of a small program, each report's text kept."""
    out = {}
    jobs = []
    if args.soak:
        jobs.append(("minilm", [str(d / "bin" / "minilm"), "--model", str(model), "--soak",
                                str(args.soak), "--threads", "4", "--soak-buckets",
                                args.soak_buckets, *SENTENCES]))
    if args.soak_small:
        prog = work / "soak_small.txt"
        prog.write_text(SOAK_PROGRAM)
        jobs.append(("small", [str(d / "bin" / "kiln"), "soak", str(prog), "--runs",
                               str(args.soak_small), "--threads", "4"]))
    for name, cmd in jobs:
        left = budget.left() - 10
        if left < 20:
            out[name] = {"error": "skipped: the run's time budget was spent"}
            continue
        log(f"soak {name}: {' '.join(cmd[1:4])} ... (at most {left:.0f} s)")
        t = time.monotonic()
        try:
            p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=left)
            out[name] = {"rc": p.returncode, "report": p.stdout[-6000:],
                         "stderr_tail": p.stderr[-1500:]}
        except subprocess.TimeoutExpired as e:
            out[name] = {"error": f"timed out after {left:.0f} s",
                         "stderr_tail": (e.stderr or b"")[-1500:].decode(errors="replace")}
        out[name]["wall_s"] = round(time.monotonic() - t, 1)
        log(f"soak {name}: {out[name].get('report', out[name].get('error', ''))}")
    return out


def torch_side(args) -> int:
    """Times each workload on CUDA: eager (events around repeated calls on
    resident inputs) and torch.compile (default mode), and MiniLM through
    sentence-transformers on the same unpacked weights: the forward alone
    and host tokens to host embeddings. Writes what it has after each row,
    so a cut-off run still reports."""
    manifest = json.loads(Path(args.manifest).read_text())
    work = Path(args.work)
    out_path = Path(args.out)
    budget = Budget(args.budget)
    res: dict = {"workloads": {}, "minilm": {}}

    def save():
        out_path.write_text(json.dumps(res, indent=1))
    # No network there: never let a library try a hub.
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["TRANSFORMERS_OFFLINE"] = "1"
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    try:
        import torch
    except ImportError as e:
        res["error"] = f"PyTorch is not installed here ({e})"
        save()
        return 0
    res["torch"] = torch.__version__
    if not torch.cuda.is_available():
        res["error"] = "PyTorch sees no CUDA device"
        save()
        return 0
    dev = torch.device("cuda")
    res["device"] = torch.cuda.get_device_name(0)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    only = set(args.only.split(",")) if args.only else None

    def cuda_ms(f, reps=50):
        """Median of per-call CUDA event times, after warm-up."""
        for _ in range(3):
            f()
        torch.cuda.synchronize()
        times = []
        for _ in range(reps):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            f()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b))
        times.sort()
        return times[len(times) // 2]

    def wall_ms(f, reps=30):
        for _ in range(3):
            f()
        times = []
        for _ in range(reps):
            t = time.perf_counter()
            f()
            times.append((time.perf_counter() - t) * 1e3)
        times.sort()
        return times[len(times) // 2]

    by_name = {w.name: w for w in workloads(manifest["quick"])}
    compile_budget = args.budget * 0.45
    for w in manifest["workloads"]:
        name = w["name"]
        if only and name not in only:
            continue
        wl = by_name[name]
        row = {}
        try:
            g = torch.Generator(device="cpu").manual_seed(0)
            ins = {}
            for pname, _dt_, sizes in wl.params:
                if pname in wl.weights and (pname.startswith("g") or pname.endswith("norm")):
                    ins[pname] = torch.ones(sizes)
                else:
                    ins[pname] = torch.rand(sizes, generator=g) * 2 - 1
            ins = {k: v.to(dev) for k, v in ins.items()}
            mutated = [p for p in ("k_cache", "v_cache") if p in ins]

            def call(f):
                # In-place writes of the inputs (a KV cache) are part of the
                # program: each call writes the resident tensors again.
                with torch.no_grad():
                    return f(torch, **ins)
            row["eager_ms"] = cuda_ms(lambda: call(wl.torch_fn))

            # Host copies of the non-constant inputs, made once: a full
            # run uploads them, computes, and reads back the result and
            # every written input.
            host = {k: v.cpu() for k, v in ins.items() if k not in wl.weights}

            def e2e(f):
                with torch.no_grad():
                    args_ = {**{k: v for k, v in ins.items() if k in wl.weights},
                             **{k: v.to(dev) for k, v in host.items()}}
                    y = f(torch, **args_)
                    y.cpu()
                    for m in mutated:
                        args_[m].cpu()
                torch.cuda.synchronize()
            row["eager_full_ms"] = wall_ms(lambda: e2e(wl.torch_fn), reps=20)
            if budget.left() > 60 and (time.monotonic() - T0) < compile_budget:
                try:
                    t = time.monotonic()
                    fn = wl.torch_fn

                    # The torch module bound in a closure, not passed as an
                    # argument for dynamo to guard on.
                    def bound(_t, **kw):
                        return fn(torch, **kw)
                    # A fresh dynamo cache per workload: `bound` is one code
                    # object, and 8 recompiles of it make dynamo fall back
                    # to eager silently.
                    torch._dynamo.reset()
                    cf = torch.compile(bound)
                    call(cf)
                    torch.cuda.synchronize()
                    row["compile_s"] = round(time.monotonic() - t, 1)
                    row["compiled_ms"] = cuda_ms(lambda: call(cf))
                except Exception as e:  # noqa: BLE001
                    row["compiled_error"] = f"{type(e).__name__}: {str(e)[:200]}"
            else:
                row["compiled_error"] = "skipped: the time budget for torch.compile was spent"
        except Exception as e:  # noqa: BLE001
            row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
        res["workloads"][name] = row
        print(f"torch {name}: {row}", file=sys.stderr, flush=True)
        save()

    try:
        from sentence_transformers import SentenceTransformer
        model = SentenceTransformer(str(work / "model"), device="cuda")
        model.eval()
        sentences = manifest["sentences"]
        for bucket in manifest["minilm"]:
            if only and f"minilm_{bucket}" not in only:
                continue
            b, t = map(int, bucket.split("x"))
            row = {}
            try:
                texts = [sentences[i % len(sentences)] for i in range(b)]
                tok = model.tokenizer(texts, padding="max_length", truncation=True, max_length=t,
                                      return_tensors="pt")
                feats = {k: v.to(dev) for k, v in tok.items()}

                def fwd():
                    with torch.no_grad():
                        return model(dict(feats))["sentence_embedding"]
                row["eager_ms"] = cuda_ms(fwd)

                def e2e():
                    with torch.no_grad():
                        f = {k: v.to(dev) for k, v in tok.items()}
                        return model(f)["sentence_embedding"].cpu()
                row["eager_full_ms"] = wall_ms(e2e)
            except Exception as e:  # noqa: BLE001
                row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
            res["minilm"][bucket] = row
            print(f"torch minilm {bucket}: {row}", file=sys.stderr, flush=True)
            save()
    except Exception as e:  # noqa: BLE001
        res["minilm"] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
    save()
    return 0


# ---------------------------------------------------------------- report

GOALS = [
    # (goal text, how to judge it from the tables)
    ("MiniLM batch 1 end to end at most 1 ms", "minilm_full", "1x16", 1.0),
    ("MiniLM 32 x 128 at most 4 ms (full run)", "minilm_full", "32x128", 4.0),
    ("elementwise at least 2.5 TB/s", "gbps", "chain_4096x4096", 2500.0),
    ("mm [4096,384] x [384,1536] at least half of cuBLAS", "vs_torch", "mm_4096x384x1536", 2.0),
    ("softmax within 1.5x of PyTorch", "vs_torch", "softmax_49152x128", 1.5),
    ("layer_norm within 1.5x of PyTorch", "vs_torch", "layer_norm_4096x384", 1.5),
    ("an encoder layer B=8 S=128 at most PyTorch eager's time", "vs_torch", "encoder_layer_8x128", 1.0),
]


def cell(text: str) -> str:
    """`text` as one markdown table cell: a shared launch's kernel names
    are joined by " | ", and errors may hold pipes or line breaks."""
    return text.replace("|", "\\|").replace("\n", " ")


def fmt(x, digits=3):
    if x is None:
        return "-"
    if isinstance(x, str):
        return x
    if x >= 100:
        return f"{x:.0f}"
    return f"{x:.{digits}g}" if x < 1 else f"{x:.{digits}f}".rstrip("0").rstrip(".")


def report(args) -> int:
    src = Path(args.outdir)
    kiln = json.loads((src / "kiln.json").read_text())
    torch = json.loads((src / "torch.json").read_text()) if (src / "torch.json").exists() else {}
    system = json.loads((src / "system.json").read_text())
    m = system["manifest"]
    probe = kiln.get("probe", {})
    ceiling = probe.get("best_gb_per_s")
    tw = torch.get("workloads", {}) if isinstance(torch.get("workloads"), dict) else {}
    tm = torch.get("minilm", {}) if isinstance(torch.get("minilm"), dict) else {}
    base, base_name = {}, None
    if args.baseline:
        base = json.loads((Path(args.baseline) / "kiln.json").read_text())
        bs = json.loads((Path(args.baseline) / "system.json").read_text())
        base_name = f"{bs['manifest']['commit']}, {bs.get('date', '')[:10]}"

    base_torch = {}
    if args.baseline and (Path(args.baseline) / "torch.json").exists():
        base_torch = json.loads((Path(args.baseline) / "torch.json").read_text())

    def before(section, name):
        r = base.get(section, {}).get(name, {})
        k = fmt(r.get("kernels_ms"), 4) if "kernels_ms" in r else "-"
        t = base_torch.get(section, {})
        t = t.get(name, {}) if isinstance(t, dict) else {}
        return f"{k} | {fmt(t.get('eager_ms'), 4)}"
    L = []
    L.append("# Kiln on a real GPU\n")
    L.append(f"Generated by `scripts/gpu-bench.sh report` from one `scripts/gpu-bench.sh run` "
             f"({'--quick, ' if m['quick'] else ''}binaries of {m['commit']}, {m['binaries']}).\n")
    L.append(f"- date: {system.get('date')}")
    L.append(f"- adapter: {system.get('adapter')}")
    L.append(f"- nvidia-smi: {system.get('nvidia_smi')}")
    L.append(f"- PyTorch: {torch.get('torch', '-')} on {torch.get('device', '-')}"
             + (f" ({torch['error']})" if torch.get("error") else ""))
    L.append(f"- Vulkan set-up: {', '.join(system.get('vulkan') or ['system loader'])}\n")
    L.append("Kiln: `kiln profile --json` (medians after a warm-up): kernels = GPU time of all "
             "kernels of a run (timestamp queries, one compute pass); full = wall time from host "
             "inputs to host outputs. Weights are session constants on both sides. PyTorch (float32, "
             "TF32 off): eager = median CUDA-event time of one call on resident inputs; full = host "
             "inputs to host outputs, synchronized; compiled = `torch.compile` default mode, events. "
             "Ratios above 1 mean Kiln is slower.\n")
    L.append("## Copy ceiling (hand-written WGSL, `kiln bandwidth`)\n")
    if "error" in probe:
        L.append(f"error: {probe['error']}\n")
    else:
        L.append(f"{probe.get('bytes', 0) >> 20} MiB copied, read + written counted.\n")
        L.append("| kernel shape | ms | GB/s |\n|---|---|---|")
        for r in probe.get("kernels", []):
            L.append(f"| {r['kernel']} | {fmt(r['ms'], 4)} | {fmt(r['gb_per_s'])} |")
        L.append("")
    L.append("## Workloads\n")
    if base_name:
        L.append(f"\"before\": Kiln's kernels and PyTorch eager in the baseline run ({base_name}), on "
                 "another machine of the same kind: PyTorch's own change between the runs shows how much "
                 "the machines differ.\n")
    L.append("| workload | Kiln kernels ms | Kiln full ms | kernels | GB/s | of copy ceiling | GFLOP/s "
             "| PyTorch eager ms | Kiln / eager | torch.compile ms | Kiln / compiled | PyTorch full ms |"
             + (" Kiln before ms | PyTorch eager before ms |" if base_name else ""))
    L.append("|---|---|---|---|---|---|---|---|---|---|---|---|" + ("---|---|" if base_name else ""))
    for w in m["workloads"]:
        n = w["name"]
        k = kiln["workloads"].get(n, {"error": "not run"})
        t = tw.get(n, {})
        if "error" in k:
            L.append(f"| {n} | error: {cell(k['error'][:120])} |" + " |" * (12 if base_name else 10))
            continue
        ms = k["kernels_ms"]
        by = sum(x["bytes"] for x in k["kernels"])
        fl = sum(x["flops"] for x in k["kernels"])
        gbps = by / 1e9 / (ms * 1e-3) if ms > 0 else None
        gfl = fl / 1e9 / (ms * 1e-3) if ms > 0 else None
        e, c = t.get("eager_ms"), t.get("compiled_ms")
        L.append(f"| {n} | {fmt(ms, 4)} | {fmt(k['full_ms'], 4)} | {len(k['kernels'])} | {fmt(gbps)} | "
                 f"{fmt(gbps / ceiling if gbps and ceiling else None, 2)} | {fmt(gfl)} | {fmt(e, 4)} | "
                 f"{fmt(ms / e if e else None, 3)} | {fmt(c, 4) if c else cell(t.get('compiled_error', '-')[:40])} | "
                 f"{fmt(ms / c if c else None, 3)} | {fmt(t.get('eager_full_ms'), 4)} |"
                 + (f" {before('workloads', n)} |" if base_name else ""))
    L.append("")
    L.append("## MiniLM (all-MiniLM-L6-v2, sentence embeddings; PyTorch: sentence-transformers)\n")
    L.append("| batch x tokens | Kiln kernels ms | Kiln full ms | full / kernels | kernels | pipelines "
             "| PyTorch forward ms | PyTorch full ms | Kiln / PyTorch (full) |"
             + (" Kiln before ms | PyTorch forward before ms |" if base_name else ""))
    L.append("|---|---|---|---|---|---|---|---|---|" + ("---|---|" if base_name else ""))
    for bucket in m["minilm"]:
        k = kiln["minilm"].get(bucket, {"error": "not run"})
        t = tm.get(bucket, {})
        if "error" in k:
            L.append(f"| {bucket} | error: {cell(k['error'][:120])} |" + " |" * (9 if base_name else 7))
            continue
        tf = t.get("eager_full_ms")
        L.append(f"| {bucket} | {fmt(k['kernels_ms'], 4)} | {fmt(k['full_ms'], 4)} | "
                 f"{fmt(k['full_ms'] / max(k['kernels_ms'], 1e-9), 3)} | {len(k['kernels'])} | "
                 f"{k.get('pipelines', '-')} | {fmt(t.get('eager_ms'), 4)} | {fmt(tf, 4)} | "
                 f"{fmt(k['full_ms'] / tf if tf else None, 3)} |"
                 + (f" {before('minilm', bucket)} |" if base_name else ""))
    L.append("")
    L.append("## Results checked\n")
    L.append("Each workload's results from the GPU against Kiln's reference interpreter (CPU) on the "
             "same seeded inputs (`kiln run --backend gpu|reference`): the largest difference over the "
             f"reference's largest magnitude (tolerance {CHECK_TOLERANCE:g}); MiniLM's embeddings of "
             f"{len(SENTENCES)} sentences: the smallest cosine (tolerance {CHECK_COSINE}).\n")
    L.append("| workload | relative error | ok |\n|---|---|---|")
    for n, k in kiln["workloads"].items():
        c = k.get("check")
        if not c:
            L.append(f"| {n} | unchecked | - |")
        elif "max_relative_error" in c:
            L.append(f"| {n} | {c['max_relative_error']:.2g} | {'no' if 'error' in c else 'yes'} |")
        else:
            L.append(f"| {n} | {cell(c.get('skipped', c.get('error', ''))[:100])} | {'no' if 'error' in c else '-'} |")
    mc = kiln.get("minilm_check")
    if mc and "min_cosine" in mc:
        L.append(f"| MiniLM ({mc['sentences']} sentences) | cosine {mc['min_cosine']:.7f} | "
                 f"{'no' if 'error' in mc else 'yes'} |")
    else:
        L.append(f"| MiniLM | {cell((mc or {}).get('error', 'unchecked')[:100])} | {'no' if mc else '-'} |")
    L.append("")
    imports = kiln.get("imports") or {}
    if imports:
        L.append("## Imported models (the import suite's `.pt2` fixtures)\n")
        L.append("`kiln profile NAME.pt2 --inputs NAME.inputs.safetensors --json` on the fixture's "
                 "inputs (small models: batch 2, a few tokens or pixels; launch-bound), and "
                 "`kiln run --backend gpu` against PyTorch's outputs in the fixture, within the "
                 f"import suite's tolerance ({IMPORT_ABS:g} + {IMPORT_REL:g} |torch|; 1 = at it).\n")
        L.append("| model | kernels | Kiln kernels ms | Kiln full ms | of the tolerance to PyTorch | ok |")
        L.append("|---|---|---|---|---|---|")
        for n, k in imports.items():
            c = k.get("check") or {}
            if "kernels_ms" not in k:
                L.append(f"| {n} | error: {cell(k.get('error', '')[:120])} | | | | no |")
                continue
            worst = c.get("worst_of_tolerance")
            L.append(f"| {n} | {len(k['kernels'])} | {fmt(k['kernels_ms'], 4)} | {fmt(k['full_ms'], 4)} | "
                     f"{'-' if worst is None else f'{worst:.2g}'} | "
                     f"{'no' if 'error' in k else ('yes' if c else 'unchecked')} |")
        L.append("")
    variants = kiln.get("variants") or []
    if variants:
        L.append("## Compile-choice variants\n")
        L.append("Each override (`CompileOptions`, engine/src/lib.rs) alone, `kiln profile --json` "
                 "(`minilm --profile`) after the defaults in the same run; / default: kernels ms over "
                 f"the default's (under {VARIANT_CANDIDATE:g}: checked against the reference too, "
                 "a candidate for the default).\n")
        L.append("| workload | override | kernels | kernels ms | default kernels ms | / default "
                 "| full ms | default full ms | checked |")
        L.append("|---|---|---|---|---|---|---|---|---|")
        for v in variants:
            c = v.get("check") or {}
            checked = ("-" if not c else f"no: {cell(c['error'][:80])}" if "error" in c else "yes")
            if "kernels_ms" not in v:
                why = f"skipped: {v['skipped']}" if "skipped" in v else f"error: {v.get('error', '')[:120]}"
                L.append(f"| {v['workload']} | {variant_label(v['env'])} | {cell(why)} | | "
                         f"{fmt(v['default_kernels_ms'], 4)} | | | | |")
                continue
            L.append(f"| {v['workload']} | {variant_label(v['env'])} | {v.get('kernels', '-')} | "
                     f"{fmt(v['kernels_ms'], 4)} | {fmt(v['default_kernels_ms'], 4)} | "
                     f"{fmt(v.get('over_default'), 3)} | {fmt(v.get('full_ms'), 4)} | "
                     f"{fmt(v.get('default_full_ms'), 4)} | {checked} |")
        L.append("")
    L.append("## Goals (issue #32)\n")
    L.append("| goal | measured | met |\n|---|---|---|")
    for text, how, key, limit in GOALS:
        val, ok = None, None
        if how == "minilm_full":
            k = kiln["minilm"].get(key, {})
            if "full_ms" in k:
                val, ok = f"{fmt(k['full_ms'], 4)} ms", k["full_ms"] <= limit
        elif how == "gbps":
            k = kiln["workloads"].get(key, {})
            if "kernels_ms" in k and k["kernels_ms"] > 0:
                g = sum(x["bytes"] for x in k["kernels"]) / 1e9 / (k["kernels_ms"] * 1e-3)
                val, ok = f"{fmt(g)} GB/s", g >= limit
        else:
            k, t = kiln["workloads"].get(key, {}), tw.get(key, {})
            if "kernels_ms" in k and t.get("eager_ms"):
                r = k["kernels_ms"] / t["eager_ms"]
                val, ok = f"{fmt(r, 3)}x PyTorch eager", r <= limit
        L.append(f"| {text} | {val or 'unmeasured'} | {'-' if ok is None else ('yes' if ok else 'no')} |")
    L.append("")
    L.append("## Slowest kernels\n")
    rows = []
    for n, k in list(kiln["workloads"].items()) + [(f"minilm {b}", k) for b, k in kiln["minilm"].items()]:
        for x in k.get("kernels", []):
            if x.get("ms"):
                rows.append((x["ms"], n, x))
    rows.sort(key=lambda r: -r[0])
    L.append("| program | kernel | ms | GB/s | GFLOP/s |\n|---|---|---|---|---|")
    for ms, n, x in rows[:20]:
        L.append(f"| {n} | {cell(x['name'])} | {fmt(ms, 4)} | {fmt(x.get('gb_per_s'))} | {fmt(x.get('gflop_per_s'))} |")
    L.append("")
    for name, r in kiln.get("soak", {}).items():
        L.append(f"## Soak: {name} ({r.get('wall_s', '-')} s)\n")
        L.append("```\n" + (r.get("report") or r.get("error", "")).strip() + "\n```\n")
    text = "\n".join(L) + "\n"
    if args.output == "-":
        sys.stdout.write(text)
    else:
        Path(args.output).write_text(text)
        log(f"wrote {args.output}")
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(prog="gpu-bench", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("prepare")
    p.add_argument("--quick", action="store_true", help="small workloads (lavapipe dry run)")
    p.add_argument("--dir", default=str(DEFAULT_DIR))
    p.add_argument("--binaries", help="take kiln, minilm and kiln-run from this folder "
                   "(e.g. target/debug after the test suite) instead of a release build")
    p = sub.add_parser("run")
    p.add_argument("outdir")
    p.add_argument("--quick", action="store_true")
    p.add_argument("--dir", default=str(DEFAULT_DIR))
    p.add_argument("--work", default="/tmp/kiln-gpu-bench")
    p.add_argument("--budget", type=float, default=420.0, help="seconds for the whole run")
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--only", help="comma-separated workload names (minilm_BxT for MiniLM)")
    p.add_argument("--no-torch", action="store_true")
    p.add_argument("--no-check", action="store_true",
                   help="skip the GPU results' check against the reference interpreter")
    p.add_argument("--variants", type=float, default=120.0,
                   help="seconds for the compile-choice variants after the defaults (0: none)")
    p.add_argument("--soak", type=int, default=0, help="then MiniLM this many times (minilm --soak)")
    p.add_argument("--soak-buckets", default="1x16,4x32")
    p.add_argument("--soak-small", type=int, default=0,
                   help="then a small program this many times (kiln soak)")
    p = sub.add_parser("report")
    p.add_argument("outdir")
    p.add_argument("--baseline", help="an earlier run's OUTDIR: its Kiln kernel times beside these")
    p.add_argument("--output", default=str(REPO / "docs" / "performance-gpu.md"))
    p = sub.add_parser("torch")
    p.add_argument("manifest")
    p.add_argument("work")
    p.add_argument("out")
    p.add_argument("--budget", type=float, default=300.0)
    p.add_argument("--only")
    a = ap.parse_args()
    return {"prepare": prepare, "run": run, "report": report, "torch": torch_side}[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main())
