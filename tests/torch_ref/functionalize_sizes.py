#!/usr/bin/env python3
"""Graph sizes of PyTorch's own functionalization of every Kiln program.

For every program in examples/programs/ and tests/programs/ops/ (recursively)
this traces

    make_fx(torch.func.functionalize(f, remove=MODE))(*inputs)

for MODE in "mutations" and "mutations_and_views", where ``f(*params)`` runs
the program with kiln_torch's parser and executor (parameters are mutated in
place, outputs returned), and counts the graph's ``call_function`` nodes, all
of them, including the trailing ``copy_`` that writes mutated inputs back.
Example inputs are the committed fixtures
tests/fixtures/<program without .txt>.inputs.safetensors.

Each traced graph is then run on fresh copies of the inputs and its outputs and
final input values are compared with eager (``torch.allclose(equal_nan=True)``
for floats with rtol 1e-4 (f16: 1e-2) and atol rtol * max |eager value|,
so that a different summation order is not a difference; exact for the rest;
shapes and dtypes must match). Results go to
tests/fixtures/functionalize_sizes.json:

    "examples/programs/mlp_block.txt": {"mutations": 12, "mutations_and_views": 14}
    "...": {"mutations": null, "error_mutations": "RuntimeError: ...",
            "mutations_and_views": null, "error_mutations_and_views": "...",
            "wrong_mutations_and_views": true}

null plus ``error_<mode>`` means functionalize failed (tracing or running the
graph raised) or, with ``wrong_<mode>: true``, gave a result different from
eager. The summary printed at the end lists the failures and the largest graphs.

Usage:
    python3 tests/torch_ref/functionalize_sizes.py            # rewrite the JSON
    python3 tests/torch_ref/functionalize_sizes.py --check    # compare with the JSON on disk, write nothing
    python3 tests/torch_ref/functionalize_sizes.py --only NAME_SUBSTRING   # print only, write nothing
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
import warnings
from pathlib import Path

import torch
from safetensors.torch import load_file
from torch.fx.experimental.proxy_tensor import make_fx

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, str(Path(__file__).resolve().parent))
import kiln_torch  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
PROGRAM_DIRS = ["examples/programs", "tests/programs/ops"]
FIXTURES = REPO / "tests" / "fixtures"
OUT = FIXTURES / "functionalize_sizes.json"
MODES = ["mutations", "mutations_and_views"]


class _InPlace:
    """A parameter handed to ``kiln_torch.run_program`` as itself.

    run_program copies each input (``t.clone().contiguous()``) so the caller's
    tensors stay untouched; here the parameters must be the traced inputs
    themselves, so that writes to them are input mutations functionalize has
    to reproduce. ``clone()`` returns the tensor, ``contiguous()`` of a
    contiguous tensor returns itself (the inputs are fresh clones).
    """

    def __init__(self, t: torch.Tensor):
        self.t = t
        self.dtype = t.dtype
        self.shape = t.shape

    def clone(self):
        return self.t


def make_fn(prog: kiln_torch.Program):
    def f(*args):
        outs, _ = kiln_torch.run_program(prog, {p.name: _InPlace(a) for p, a in zip(prog.params, args)})
        return tuple(outs)

    return f


def fresh(inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    return [t.clone() for t in inputs]


_ADDR_RE = re.compile(r"0x[0-9a-fA-F]+")


def short_error(e: BaseException) -> str:
    msg = str(e).strip()
    first = msg.splitlines()[0].strip() if msg else ""
    s = f"{type(e).__name__}: {first}" if first else type(e).__name__
    s = _ADDR_RE.sub("0x?", s)  # object addresses would make the file nondeterministic
    return s if len(s) <= 300 else s[:297] + "..."


def same(a: torch.Tensor, b: torch.Tensor) -> str | None:
    """None if `a` (graph) matches `b` (eager), else what differs."""
    if not isinstance(a, torch.Tensor):
        return f"got {type(a).__name__}, eager gives a tensor"
    if a.dtype != b.dtype:
        return f"dtype {a.dtype} vs eager {b.dtype}"
    if a.shape != b.shape:
        return f"shape {list(a.shape)} vs eager {list(b.shape)}"
    if a.dtype.is_floating_point:
        rtol = 1e-2 if b.dtype == torch.float16 else 1e-4
        a, b = a.double(), b.double()
        # Tolerances scaled to the tensor: mm of a t_copy and mm of a
        # transposed view sum in different orders (linear/no_bias differs by
        # 2e-6 on values near 0). What functionalize gets wrong is off by O(1).
        fin = b[torch.isfinite(b)]
        scale = max(1.0, fin.abs().max().item()) if fin.numel() else 1.0
        if torch.allclose(a, b, rtol=rtol, atol=rtol * scale, equal_nan=True):
            return None
        both_nan = torch.isnan(a) & torch.isnan(b)
        d = (a - b).abs().nan_to_num(nan=float("inf"))[~both_nan].max().item()
        return f"values differ (max abs diff {d:.3g})"
    if torch.equal(a.to(torch.int64), b.to(torch.int64)):
        return None
    return f"values differ ({int((a.to(torch.int64) != b.to(torch.int64)).sum())} elements)"


def compare(g_outs, g_ins, e_outs, e_ins, names) -> str | None:
    if len(g_outs) != len(e_outs):
        return f"{len(g_outs)} outputs vs eager {len(e_outs)}"
    for i, (a, b) in enumerate(zip(g_outs, e_outs)):
        d = same(a, b)
        if d:
            return f"output {i}: {d}"
    for n, a, b in zip(names, g_ins, e_ins):
        d = same(a, b)
        if d:
            return f"final value of %{n}: {d}"
    return None


def measure(rel: str) -> dict:
    path = REPO / rel
    prog = kiln_torch.parse_program(path.read_text(encoding="utf-8"))
    base = FIXTURES / Path(rel).with_suffix("")
    loaded = load_file(str(base.with_name(base.name + ".inputs.safetensors")))
    inputs = [loaded[p.name].clone() for p in prog.params]
    names = [p.name for p in prog.params]
    f = make_fn(prog)

    entry: dict = {}
    e_ins = fresh(inputs)
    try:
        torch.manual_seed(0)
        e_outs = list(f(*e_ins))
    except Exception as e:  # eager itself refuses: nothing to functionalize
        for m in MODES:
            entry[m] = None
        entry["error_eager"] = short_error(e)
        return entry

    for mode in MODES:
        try:
            torch.manual_seed(0)
            gm = make_fx(torch.func.functionalize(f, remove=mode))(*fresh(inputs))
        except Exception as e:
            entry[mode] = None
            entry[f"error_{mode}"] = "trace: " + short_error(e)
            continue
        n = sum(1 for node in gm.graph.nodes if node.op == "call_function")
        g_ins = fresh(inputs)
        try:
            torch.manual_seed(0)
            g_outs = gm(*g_ins)
            g_outs = list(g_outs) if isinstance(g_outs, (list, tuple)) else [g_outs]
        except Exception as e:
            entry[mode] = None
            entry[f"error_{mode}"] = "run: " + short_error(e)
            continue
        diff = compare(g_outs, g_ins, e_outs, e_ins, names)
        if diff:
            entry[mode] = None
            entry[f"error_{mode}"] = f"differs from eager: {diff} (graph of {n} nodes)"
            entry[f"wrong_{mode}"] = True
        else:
            entry[mode] = n
            # The same graph without dead nodes (copy_ epilogues are impure
            # and stay): what Kiln's own graphs are compared with.
            gm.graph.eliminate_dead_code()
            entry[f"{mode}_live"] = sum(1 for node in gm.graph.nodes if node.op == "call_function")
    return entry


def programs() -> list[str]:
    rels = []
    for d in PROGRAM_DIRS:
        rels += [p.relative_to(REPO).as_posix() for p in (REPO / d).rglob("*.txt")]
    return sorted(rels)


def dumps(results: dict) -> str:
    return json.dumps(results, sort_keys=True, indent=1) + "\n"


def summary(results: dict) -> None:
    print(f"{len(results)} programs")
    eager = sorted(r for r, e in results.items() if "error_eager" in e)
    if eager:
        print(f"{len(eager)} refused by eager (not measured)")
    for m in MODES:
        failed = sorted(r for r, e in results.items() if e[m] is None and f"error_{m}" in e and not e.get(f"wrong_{m}"))
        wrong = sorted(r for r, e in results.items() if e.get(f"wrong_{m}"))
        ok = [e[m] for e in results.values() if e[m] is not None]
        print(
            f"remove={m}: {len(ok)} ok ({sum(ok)} call_function nodes in all),"
            f" {len(failed)} failed, {len(wrong)} wrong (differ from eager)"
        )
        for r in failed:
            print(f"  FAILED {r}: {results[r][f'error_{m}']}")
        for r in wrong:
            print(f"  WRONG  {r}: {results[r][f'error_{m}']}")
    key = lambda r: max((results[r][m] or 0) for m in MODES)  # noqa: E731
    print("10 largest graphs (call_function nodes):")
    for r in sorted(results, key=lambda r: (-key(r), r))[:10]:
        e = results[r]
        print("  " + "  ".join(f"{m}={e[m]}" for m in MODES) + f"  {r}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="compare with the JSON on disk instead of writing")
    ap.add_argument("--only", help="only programs whose path contains this (prints, writes nothing)")
    a = ap.parse_args(argv)
    warnings.simplefilter("ignore")
    torch.set_num_threads(1)

    t0 = time.monotonic()
    results = {}
    for rel in programs():
        if a.only and a.only not in rel:
            continue
        results[rel] = measure(rel)
    print(f"measured in {time.monotonic() - t0:.1f} s")
    summary(results)

    text = dumps(results)
    if a.only:
        print(text, end="")
        return 0
    if a.check:
        if not OUT.exists() or OUT.read_text(encoding="utf-8") != text:
            print(f"{OUT.relative_to(REPO)} differs")
            return 1
        print(f"{OUT.relative_to(REPO)} is up to date")
        return 0
    OUT.write_text(text, encoding="utf-8")
    print(f"wrote {OUT.relative_to(REPO)} ({len(text.encode())} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
