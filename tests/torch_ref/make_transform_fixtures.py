#!/usr/bin/env python3
"""Fixtures for Kiln's function transforms, from torch.func.

For every program in examples/programs/ this runs the program (PyTorch eager,
through kiln_torch.py) under torch.func.vjp, torch.func.jvp and
torch.func.vmap, with the inputs of its existing fixture
(tests/fixtures/examples/programs/NAME.inputs.safetensors) and seeded random
cotangents, tangents and batches, and writes

    tests/fixtures/transforms/NAME.safetensors

holding, under these names (PARAM without %, K an output index):

    vjp.ct_K              cotangent of floating output K
    vjp.out.K             the outputs
    vjp.grad.PARAM        gradient of each floating parameter
    jvp.t_PARAM           tangent of each floating parameter
    jvp.tangent.K         tangent of floating output K
    vmap.PARAM            the parameters batched at dimension 0 (size 3)
    vmap.out.K            the batched outputs

matching `kiln vjp PROG`, `kiln jvp PROG` and
`kiln vmap PROG --in-dims 0,0,... --batch-size 3` (../shared/spec/transforms.md).
A transform torch.func refuses for a program is left out (listed in the
file's metadata, key "info", as JSON); Kiln computes those anyway.

Usage:
    python3 tests/torch_ref/make_transform_fixtures.py             # (re)write
    python3 tests/torch_ref/make_transform_fixtures.py mlp_block   # only these programs
    python3 tests/torch_ref/make_transform_fixtures.py --check     # compare, write nothing

Only files whose bytes change are written.
"""

from __future__ import annotations

import argparse
import json
import sys
import warnings
from pathlib import Path

import torch
from safetensors.torch import load_file, save

sys.dont_write_bytecode = True
sys.path.insert(0, str(Path(__file__).resolve().parent))
import kiln_torch  # noqa: E402
from make_fixtures import seed_for  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
OUT = REPO / "tests" / "fixtures" / "transforms"
BATCH = 3
FLOATS = (torch.float32, torch.float16)


def contiguous(t: torch.Tensor) -> torch.Tensor:
    return t.detach().clone(memory_format=torch.contiguous_format)


def fixture(path: Path) -> tuple[bytes, list[str]]:
    rel = path.relative_to(REPO).as_posix()
    prog = kiln_torch.parse_program(path.read_text(encoding="utf-8"))
    inputs = load_file(str(REPO / "tests" / "fixtures" / path.relative_to(REPO).with_suffix(".inputs.safetensors")))
    names = [p.name for p in prog.params]
    wrt = [n for n in names if inputs[n].dtype in FLOATS]
    gen = torch.Generator().manual_seed(seed_for("transforms/" + rel) % (2**63))

    def rand_like(t: torch.Tensor) -> torch.Tensor:
        return (torch.rand(t.shape, generator=gen, dtype=torch.float64) * 2 - 1).to(t.dtype)

    def f(*xs):
        env = dict(inputs)
        env.update(zip(wrt, xs))
        outs, _ = kiln_torch.run_program(prog, env)
        return tuple(outs)

    out: dict[str, torch.Tensor] = {}
    refused: list[str] = []
    primals = tuple(inputs[n] for n in wrt)
    base = f(*primals)
    floating = [k for k, o in enumerate(base) if o.dtype in FLOATS]

    def attempt(name, fn):
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                fn()
        except Exception as e:  # what torch.func refuses
            msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            refused.append(f"{name}: {type(e).__name__}: {msg[:200]}")

    def do_vjp():
        cts = {k: rand_like(base[k]) for k in floating}

        def ff(*xs):
            o = f(*xs)
            return tuple(o[k] for k in floating)

        outs, fn = torch.func.vjp(ff, *primals)
        grads = fn(tuple(cts[k] for k in floating))
        for k in floating:
            out[f"vjp.ct_{k}"] = contiguous(cts[k])
        for k, o in enumerate(base):
            out[f"vjp.out.{k}"] = contiguous(o)
        for n, g in zip(wrt, grads):
            out[f"vjp.grad.{n}"] = contiguous(g)

    def do_jvp():
        ts = tuple(rand_like(p) for p in primals)

        def ff(*xs):
            o = f(*xs)
            return tuple(o[k] for k in floating)

        _, tangents = torch.func.jvp(ff, primals, ts)
        for n, t in zip(wrt, ts):
            out[f"jvp.t_{n}"] = contiguous(t)
        for k, t in zip(floating, tangents):
            out[f"jvp.tangent.{k}"] = contiguous(t)

    def do_vmap():
        batched = {}
        for n in names:
            x = inputs[n]
            if x.dtype in FLOATS:
                batched[n] = torch.stack([x] + [rand_like(x) for _ in range(BATCH - 1)])
            else:
                batched[n] = torch.stack([x] * BATCH)

        def g(*xs):
            outs, _ = kiln_torch.run_program(prog, dict(zip(names, xs)))
            return tuple(outs)

        res = torch.func.vmap(g, in_dims=tuple(0 for _ in names))(*(batched[n] for n in names))
        for n in names:
            out[f"vmap.{n}"] = contiguous(batched[n])
        for k, o in enumerate(res):
            out[f"vmap.out.{k}"] = contiguous(o)

    if wrt and floating:
        attempt("vjp", do_vjp)
        attempt("jvp", do_jvp)
    attempt("vmap", do_vmap)
    # A refused transform leaves nothing half written.
    for r in refused:
        prefix = r.split(":")[0] + "."
        for k in [k for k in out if k.startswith(prefix)]:
            del out[k]
    # One metadata key: the header's key order is not stable.
    meta = {"info": json.dumps({"program": rel, "refused": refused})}
    return save(out, metadata=meta), refused


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--check", action="store_true")
    ap.add_argument("programs", nargs="*", help="only these examples/programs/ (names without .txt)")
    args = ap.parse_args(argv)
    all_programs = sorted((REPO / "examples" / "programs").glob("*.txt"))
    missing = [n for n in args.programs if not (REPO / "examples" / "programs" / f"{n}.txt").exists()]
    if missing:
        print(f"no program examples/programs/{missing[0]}.txt")
        return 2
    programs = [p for p in all_programs if not args.programs or p.stem in args.programs]
    torch.manual_seed(0)
    OUT.mkdir(parents=True, exist_ok=True)
    differ = []
    total_refused = 0
    written = 0
    for path in programs:
        data, refused = fixture(path)
        total_refused += len(refused)
        for r in refused:
            print(f"{path.stem}: torch.func refuses {r}")
        dest = OUT / (path.stem + ".safetensors")
        if args.check:
            if not dest.exists() or dest.read_bytes() != data:
                differ.append(dest.name)
        elif not dest.exists() or dest.read_bytes() != data:
            dest.write_bytes(data)
            written += 1
    print(f"{len(programs)} programs ({written} fixtures written), {total_refused} transforms refused by torch.func")
    if differ:
        print("differ:", ", ".join(differ))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
