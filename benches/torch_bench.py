#!/usr/bin/env python3
"""PyTorch on this machine's CPU, beside Kiln: the workloads of
`cargo bench --bench report`, in eager mode and with torch.compile.

    python3 benches/torch_bench.py WORKLOADS.json   # prints results as JSON

WORKLOADS.json (written by the report bench) names:
  functionalize: [{"n": statements, "program": path, "inputs": path}]
      timed as make_fx(torch.func.functionalize(f, remove=mode)) tracing
  programs: [{"name", "program", "inputs"}]
      the text programs run with aten ops (overloads resolved once), eager
  blocks: {"mlp": {...}, "attention": {...}} inputs of the MLP and
      attention blocks, eager and torch.compile
  chain: [n, ...] elementwise chain tanh(x * 2 + 1) * 0.5 - x, GB/s
  transposed_chain: n  examples/programs/transposed_chain.txt at n x n
  minilm: {"dir": model dir, "batches": [...], "sentences": [...]}
  imports: [{"name", "pt2", "inputs"}] the models of torch.export archives
      (tests/fixtures/import), built again by make_import_fixtures.py, eager

Every figure is the best of a few runs after a warm-up. A section that
fails reports its error instead of numbers.
"""

from __future__ import annotations

import json
import os
import sys
import time
import warnings
from pathlib import Path

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
warnings.filterwarnings("ignore")
sys.dont_write_bytecode = True

import torch  # noqa: E402
from safetensors.torch import load_file  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "torch_ref"))
import kiln_torch  # noqa: E402


def best(f, reps=5, budget_s=20.0):
    """Best wall time of `f()` in seconds, after one warm-up call."""
    f()
    times = []
    start = time.perf_counter()
    for _ in range(reps):
        t = time.perf_counter()
        f()
        times.append(time.perf_counter() - t)
        if time.perf_counter() - start > budget_s:
            break
    return min(times)


def err(e: BaseException) -> str:
    s = str(e).strip().splitlines()
    return f"{type(e).__name__}: {s[0] if s else ''}"[:120]


def resolved_program(prog):
    """The program as a function of its inputs, with each statement's
    overload chosen on the first call (kiln_torch resolves per call)."""
    chosen: dict[int, object] = {}

    def call(i, st, args):
        op = chosen.get(i)
        if op is not None:
            pos, kw = kiln_torch.bind(op, args)
            return op(*pos, **kw)
        packet = getattr(torch.ops.aten, st.op, None)
        for cand in kiln_torch._candidate_overloads(packet) if packet is not None else []:
            try:
                pos, kw = kiln_torch.bind(cand, args)
            except kiln_torch.NoBind:
                continue
            chosen[i] = cand
            return cand(*pos, **kw)
        return kiln_torch.resolve_and_call(st.op, args)

    def run(inputs):
        env = {p.name: inputs[p.name].clone() for p in prog.params}
        for i, st in enumerate(prog.stmts):
            res = call(i, st, kiln_torch._resolve_args(st.args, env))
            vals = list(res) if isinstance(res, (list, tuple)) else [res]
            for n, r in zip(st.results, vals):
                env[n] = r
        return [env[r.name] for r in prog.returns]

    return run


def functionalize_rows(items):
    from torch.fx.experimental.proxy_tensor import make_fx
    import functionalize_sizes as fs

    # Candidates of each size in seed order: per mode, the first program
    # PyTorch's functionalize handles is timed, and its seed reported so
    # that Kiln times the same program.
    out = {}
    for it in items:
        row = out.setdefault(str(it["n"]), {})
        prog = kiln_torch.parse_program(Path(it["program"]).read_text())
        ins = load_file(it["inputs"])
        inputs = [ins[p.name] for p in prog.params]
        f = fs.make_fn(prog)
        for mode in ("mutations", "mutations_and_views"):
            if isinstance(row.get(mode), float):
                continue
            try:
                t = time.perf_counter()
                make_fx(torch.func.functionalize(f, remove=mode))(*fs.fresh(inputs))
                row[mode] = time.perf_counter() - t
                row[mode + "_seed"] = it.get("seed", 42)
            except Exception as e:  # noqa: BLE001
                if mode not in row:
                    row[mode] = err(e)
    return out


def transform_rows(items):
    """make_fx(torch.func.grad(f)) of each loss program: seconds and nodes."""
    from torch.fx.experimental.proxy_tensor import make_fx
    import functionalize_sizes as fs

    out = {}
    for it in items:
        try:
            prog = kiln_torch.parse_program(Path(it["program"]).read_text())
            ins = load_file(it["inputs"])
            inputs = [ins[p.name] for p in prog.params]
            names = [p.name for p in prog.params]

            def loss(*xs):
                # run_program mutates copies: torch.func.grad refuses
                # in-place writes to its own inputs (leaves).
                outs, _ = kiln_torch.run_program(prog, dict(zip(names, xs)))
                return outs[0]

            argnums = tuple(i for i, t in enumerate(inputs) if t.is_floating_point())
            g = torch.func.grad(loss, argnums=argnums)
            t = time.perf_counter()
            gm = make_fx(g)(*fs.fresh(inputs))
            s = time.perf_counter() - t
            nodes = sum(1 for n in gm.graph.nodes if n.op == "call_function")
            out[it["name"]] = {"s": s, "nodes": nodes}
        except Exception as e:  # noqa: BLE001
            out[it["name"]] = {"error": err(e)}
    return out


def program_rows(items):
    out = {}
    for it in items:
        try:
            prog = kiln_torch.parse_program(Path(it["program"]).read_text())
            ins = load_file(it["inputs"])
            run = resolved_program(prog)
            with torch.no_grad():
                out[it["name"]] = {"eager_s": best(lambda: run(ins), reps=20, budget_s=5)}
        except Exception as e:  # noqa: BLE001
            out[it["name"]] = {"error": err(e)}
    return out


def mlp(x, w1, b1, w2, b2, g, b):
    n = torch.nn.functional.layer_norm(x, [x.shape[-1]], g, b)
    h = torch.nn.functional.linear(n, w1, b1)
    o = torch.nn.functional.linear(torch.nn.functional.gelu(h), w2, b2)
    return o.add_(x)


def attention(x, wq, wk, wv, wo, mask):
    s, d = x.shape
    q = (x @ wq.t()).view(s, 4, d // 4).transpose(0, 1)
    k = (x @ wk.t()).view(s, 4, d // 4).permute(1, 2, 0)
    v = (x @ wv.t()).view(s, 4, d // 4).transpose(0, 1)
    a = (q @ k).mul_(0.125).masked_fill_(mask, -10000.0).softmax(-1)
    return (a @ v).transpose(0, 1).reshape(s, d) @ wo.t()


def eager_and_compiled(f, args, reps=10):
    row = {}
    with torch.no_grad():
        row["eager_s"] = best(lambda: f(*[a.clone() for a in args]), reps=reps)
        try:
            cf = torch.compile(f)
            row["compile_s"] = best(lambda: cf(*[a.clone() for a in args]), reps=reps)
        except Exception as e:  # noqa: BLE001
            row["compile_error"] = err(e)
    return row


def block_rows(blocks):
    out = {}
    for name, it in blocks.items():
        try:
            prog = kiln_torch.parse_program(Path(it["program"]).read_text())
            ins = load_file(it["inputs"])
            f = {"mlp": mlp, "attention": attention}[name]
            out[name] = eager_and_compiled(f, [ins[p.name] for p in prog.params])
        except Exception as e:  # noqa: BLE001
            out[name] = {"error": err(e)}
    return out


def chain(x):
    return torch.tanh(x * 2.0 + 1.0) * 0.5 - x


def chain_rows(sizes):
    out = {}
    for n in sizes:
        try:
            x = torch.rand(n)
            row = {}
            with torch.no_grad():
                row["eager_s"] = best(lambda: chain(x), reps=5)
                try:
                    cf = torch.compile(chain)
                    row["compile_s"] = best(lambda: cf(x), reps=5)
                except Exception as e:  # noqa: BLE001
                    row["compile_error"] = err(e)
            out[str(n)] = row
        except Exception as e:  # noqa: BLE001
            out[str(n)] = {"error": err(e)}
    return out


def transposed_chain(t, b):
    a = t + b
    f = torch.tanh(a * 0.5) * torch.sigmoid(a)
    return (torch.exp(f) - t) * 1.5 + 0.25


def transposed_chain_rows(n):
    """examples/programs/transposed_chain.txt at n x n, with x.t() and
    with x * 1.0 (a contiguous copy) in its place."""
    out = {}
    x = torch.rand(n, n)
    b = torch.rand(n)
    for key, f in [("transposed", lambda x, b: transposed_chain(x.t(), b)), ("plain", lambda x, b: transposed_chain(x * 1.0, b))]:
        row = {}
        try:
            with torch.no_grad():
                row["eager_s"] = best(lambda: f(x, b), reps=5)
                try:
                    cf = torch.compile(f)
                    row["compile_s"] = best(lambda: cf(x, b), reps=5)
                except Exception as e:  # noqa: BLE001
                    row["compile_error"] = err(e)
        except Exception as e:  # noqa: BLE001
            row["error"] = err(e)
        out[key] = row
    return out


def minilm_rows(cfg):
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(cfg["dir"], device="cpu")
    model.max_seq_length = 128
    out = {}
    sentences = cfg["sentences"]
    for b in cfg["batches"]:
        texts = [sentences[i % len(sentences)] for i in range(b)]
        row = {}
        try:
            row["eager_s"] = best(lambda: model.encode(texts, batch_size=b), reps=3)
        except Exception as e:  # noqa: BLE001
            row["error"] = err(e)
        out[str(b)] = row
    return out


def import_rows(items):
    """Each imported model built again as the fixture script builds it
    (same seeds, so the same weights), run eagerly on the same inputs."""
    import inspect

    import make_import_fixtures as mf

    out = {}
    for it in items:
        row = out.setdefault(it["name"], {})
        try:
            name = it["name"].split("/")[-1]
            ctor = (mf.MODELS.get(name) or mf.BENCH[name])[0]
            torch.manual_seed(0)
            model = ctor().eval()
            mf.randomize(model, 1)
            ins = load_file(it["inputs"])
            params = inspect.signature(model.forward).parameters
            args = [ins[n] for n in params if n in ins]
            if len(args) != len(ins):
                args = list(ins.values())
            with torch.no_grad():
                row["eager_s"] = best(lambda: model(*args), reps=5)
        except Exception as e:  # noqa: BLE001
            row["error"] = err(e)
    return out


def main() -> int:
    w = json.loads(Path(sys.argv[1]).read_text())
    res = {"torch": torch.__version__, "threads": torch.get_num_threads()}
    for key, f in [
        ("functionalize", functionalize_rows),
        ("programs", program_rows),
        ("blocks", block_rows),
        ("chain", chain_rows),
        ("transposed_chain", transposed_chain_rows),
        ("transforms", transform_rows),
        ("minilm", minilm_rows),
        ("imports", import_rows),
    ]:
        if key in w:
            try:
                res[key] = f(w[key])
            except Exception as e:  # noqa: BLE001
                res[key] = {"error": err(e)}
            print(f"torch: {key} done", file=sys.stderr)
    print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
