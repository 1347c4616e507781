#!/usr/bin/env python3
"""Generate safetensors fixtures for Kiln programs from PyTorch eager.

For every program under examples/programs/ and tests/programs/ops/ (recursively)
this writes, next to the same relative path under tests/fixtures/:

    tests/fixtures/<relative dir>/<name>.inputs.safetensors    random inputs
    tests/fixtures/<relative dir>/<name>.expected.safetensors  what kiln_torch.py writes

e.g. examples/programs/mlp_block.txt ->
     tests/fixtures/examples/programs/mlp_block.{inputs,expected}.safetensors

Inputs are random with a seed derived from the program's path relative to the
repository root, so regeneration is deterministic. Defaults: f32/f16 uniform in
[-2, 2), i32 integers in [-5, 5], u32 in [0, 10], bool fair coin. A comment
line in the program overrides one parameter:

    # input %idx: int 0..5        integers lo <= v < hi (hi excluded)
    # input %idx: perm 0..5       distinct integers from [lo, hi) (numel <= hi - lo)
    # input %x: uniform 0.1..2.0  floats in [lo, hi)
    # input %m: bool 0.3          true with probability 0.3

Programs under tests/programs/errors/ get no fixtures: each must be refused by
eager PyTorch (the runner exits with an error); a summary is printed.

Usage:
    python3 tests/torch_ref/make_fixtures.py            # (re)write all fixtures
    python3 tests/torch_ref/make_fixtures.py softplus   # only these ops' (tests/programs/ops/<op>/)
    python3 tests/torch_ref/make_fixtures.py --check    # compare with files on disk, write nothing
    python3 tests/torch_ref/make_fixtures.py --only NAME_SUBSTRING

Only fixtures whose bytes change are written; nothing is deleted: a fixture
whose program is gone is reported as stale, for you to remove.
"""

from __future__ import annotations

import argparse
import hashlib
import re
import sys
import warnings
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, str(Path(__file__).resolve().parent))
import kiln_torch  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
PROGRAM_DIRS = ["examples/programs", "tests/programs/ops"]
ERROR_DIR = "tests/programs/errors"
FIXTURES = REPO / "tests" / "fixtures"

_ANN_RE = re.compile(r"^\s*#\s*input\s+%(\w+)\s*:\s*(\w+)\s*(.*?)\s*$")


def parse_annotations(text: str) -> dict[str, tuple[str, str]]:
    anns = {}
    for line in text.splitlines():
        m = _ANN_RE.match(line)
        if m:
            anns[m.group(1)] = (m.group(2), m.group(3))
    return anns


def _range(spec: str, conv):
    m = re.fullmatch(r"(\S+?)\.\.(\S+)", spec)
    if not m:
        raise ValueError(f"bad range {spec!r} (expected LO..HI)")
    return conv(m.group(1)), conv(m.group(2))


def seed_for(rel: str) -> int:
    return int.from_bytes(hashlib.sha256(rel.encode()).digest()[:8], "little")


def make_input(rng: np.random.Generator, p: kiln_torch.Param, ann) -> torch.Tensor:
    shape = tuple(p.shape)
    n = int(np.prod(shape)) if shape else 1
    kind, spec = ann if ann else (None, "")
    if kind is None:
        if p.dtype in (torch.float32, torch.float16):
            kind, spec = "uniform", "-2..2"
        elif p.dtype in (torch.int8, torch.int32, torch.int64):
            kind, spec = "int", "-5..6"
        elif p.dtype == torch.uint32:
            kind, spec = "int", "0..11"
        elif p.dtype == torch.bool:
            kind, spec = "bool", "0.5"
    if kind == "uniform":
        lo, hi = _range(spec, float)
        arr = rng.uniform(lo, hi, size=n)
    elif kind == "int":
        lo, hi = _range(spec, int)
        arr = rng.integers(lo, hi, size=n)
    elif kind == "perm":
        lo, hi = _range(spec, int)
        if n > hi - lo:
            raise ValueError(f"perm {spec}: {n} distinct values needed")
        arr = rng.permutation(np.arange(lo, hi))[:n]
    elif kind == "bool":
        prob = float(spec) if spec else 0.5
        arr = rng.random(size=n) < prob
    else:
        raise ValueError(f"unknown input annotation kind {kind!r} for %{p.name}")
    arr = np.asarray(arr).reshape(shape)
    if p.dtype == torch.bool:
        t = torch.from_numpy(arr.astype(np.bool_) if arr.dtype == np.bool_ else arr != 0)
    elif p.dtype.is_floating_point:
        t = torch.from_numpy(arr.astype(np.float64)).to(p.dtype)
    else:
        t = torch.from_numpy(arr.astype(np.int64)).to(p.dtype)
    return t.contiguous()


def make_inputs(rel: str, prog: kiln_torch.Program, text: str) -> dict[str, torch.Tensor]:
    anns = parse_annotations(text)
    names = {p.name for p in prog.params}
    for a in anns:
        if a not in names:
            raise ValueError(f"annotation for %{a}, which is not a parameter")
    rng = np.random.default_rng(seed_for(rel))
    return {p.name: make_input(rng, p, anns.get(p.name)) for p in prog.params}


def run_one(path: Path):
    rel = path.relative_to(REPO).as_posix()
    text = path.read_text(encoding="utf-8")
    prog = kiln_torch.parse_program(text)
    inputs = make_inputs(rel, prog, text)
    outs, params = kiln_torch.run_program(prog, {k: v.clone() for k, v in inputs.items()})
    return rel, inputs, kiln_torch.output_dict(outs, params)


def fixture_paths(rel: str):
    base = FIXTURES / Path(rel).with_suffix("")
    return base.with_name(base.name + ".inputs.safetensors"), base.with_name(base.name + ".expected.safetensors")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="compare with fixtures on disk instead of writing")
    ap.add_argument("--only", help="only programs whose path contains this")
    ap.add_argument("ops", nargs="*", help="only the programs of these ops (tests/programs/ops/<op>/)")
    a = ap.parse_args(argv)
    op_dirs = [f"tests/programs/ops/{op}/" for op in a.ops]
    for op, d in zip(a.ops, op_dirs):
        if not (REPO / d).is_dir():
            print(f"no programs for op {op}: {d} does not exist (gen_op_programs.py {op} writes them)")
            return 2
    selected = lambda rel: (not a.only or a.only in rel) and (not op_dirs or any(rel.startswith(d) for d in op_dirs))  # noqa: E731
    warnings.simplefilter("ignore")
    torch.manual_seed(0)

    failed: list[tuple[str, str]] = []
    written = 0
    mismatched: list[str] = []
    expected_files: set[Path] = set()
    counts: dict[str, int] = {}
    for d in PROGRAM_DIRS:
        for path in sorted((REPO / d).rglob("*.txt")):
            rel = path.relative_to(REPO).as_posix()
            if not selected(rel):
                continue
            counts[d] = counts.get(d, 0) + 1
            ip, ep = fixture_paths(rel)
            expected_files.update([ip, ep])
            try:
                rel, inputs, expected = run_one(path)
            except Exception as e:  # KilnError, ValueError from annotations, ...
                failed.append((rel, str(e)))
                continue
            if a.check:
                for p, d_ in ((ip, inputs), (ep, expected)):
                    if not p.exists() or p.read_bytes() != save(d_):
                        mismatched.append(p.relative_to(REPO).as_posix())
            else:
                ip.parent.mkdir(parents=True, exist_ok=True)
                for p, d_ in ((ip, inputs), (ep, expected)):
                    data = save(d_)
                    if not p.exists() or p.read_bytes() != data:
                        p.write_bytes(data)
                        written += 1

    # Stale fixtures (program removed or renamed): reported, never deleted.
    if not a.only and not a.ops:
        for d in PROGRAM_DIRS:
            fdir = FIXTURES / d
            if fdir.exists():
                for f in sorted(fdir.rglob("*.safetensors")):
                    if f not in expected_files:
                        mismatched.append(f.relative_to(REPO).as_posix() + " (stale: its program is gone)")

    # Programs eager must refuse.
    err_ok, err_bad = [], []
    for path in sorted((REPO / ERROR_DIR).rglob("*.txt")):
        rel = path.relative_to(REPO).as_posix()
        if a.ops or not selected(rel):
            continue
        text = path.read_text(encoding="utf-8")
        first = text.splitlines()[0] if text else ""
        claim = first.split("# error:", 1)[1].strip() if first.startswith("# error:") else None
        try:
            prog = kiln_torch.parse_program(text)
            inputs = make_inputs(rel, prog, text)
            kiln_torch.run_program(prog, inputs)
        except kiln_torch.KilnError as e:
            err_ok.append((rel, claim, str(e)))
            continue
        except Exception as e:
            err_bad.append((rel, f"unexpected {type(e).__name__}: {e}"))
            continue
        err_bad.append((rel, "eager ran it without error"))
        if claim is None:
            err_bad.append((rel, "first line is not '# error: ...'"))
    for rel, claim, msg in err_ok:
        if claim is None:
            err_bad.append((rel, "first line is not '# error: ...'"))

    for d, c in counts.items():
        print(f"{d}: {c} programs")
    if a.check:
        print(f"checked; {len(mismatched)} fixture file(s) differ")
        for m in mismatched:
            print(f"  DIFFERS {m}")
    else:
        print(f"wrote {written} changed fixture file(s) under {FIXTURES.relative_to(REPO)}/")
        for m in mismatched:
            print(f"  STALE {m}")
    print(f"{ERROR_DIR}: {len(err_ok)} refused by eager as expected, {len(err_bad)} problem(s)")
    for rel, claim, msg in err_ok:
        print(f"  refused {rel}: {msg}")
    for rel, msg in err_bad:
        print(f"  PROBLEM {rel}: {msg}")
    if failed:
        print(f"{len(failed)} program(s) the runner could not execute:")
        for rel, msg in failed:
            print(f"  FAILED {rel}: {msg}")
    return 1 if (failed or err_bad or (a.check and mismatched)) else 0


if __name__ == "__main__":
    sys.exit(main())
