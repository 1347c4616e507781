"""Sweep over PyTorch's own op database (OpInfo `op_db`) through `kiln run`.

For every OpInfo that supports float32 on the CPU, its first float32 CPU
samples (at most 3, `torch.manual_seed(0)` before each OpInfo) are each
wrapped in a module whose forward takes every tensor of the sample (input,
args, kwargs, tensors inside lists/tuples/dicts included) as positional
inputs, everything else baked in, and returns the call's result flattened
into tensors. The module is exported (`torch.export.export(m, tensors,
strict=False)`, with `--after-decompositions` then `ep.run_decompositions()`),
saved, run with `kiln run --backend reference` (60 s limit) and compared
with eager (same outputs, shapes, dtypes (f64 -> f32), values within
atol=1e-4 + rtol=1e-4, NaN == NaN; user inputs the call writes are compared
too).

A sample is *not exportable* (and leaves the denominator) if eager fails on
it, if its inputs are f64/complex, if its result is not a tensor (or
tuple/list of tensors), or if torch.export (or run_decompositions) fails.
Otherwise it is `ok`, `wrong` (ran, differs: max error recorded), `refused`
(non-zero exit with an error message: first line recorded), `panic`
(stderr has 'panicked' or exit code 101) or `timeout`. Results whose eager
values are not reproducible (random ops: two eager runs with different
seeds differ; `empty*`) are compared by shape and dtype only (`values`:
false in the report).

An OpInfo is `running` if all its exportable samples are ok; `wrong` if any
is wrong; else `panic` / `timeout` if any panicked / timed out; else
`refused` if any is refused; `not_exportable` if it has no exportable
sample.

Each OpInfo runs in a forked child (a crash in PyTorch or a hang is that
OpInfo's alone); OMP threads are 1.

    python3 tests/torch_ref/opinfo_sweep.py [--only NAME[,NAME]] [--limit-samples K]
        [--after-decompositions] [--gpu] [--jobs N] [--report FILE]
        [--write-fixtures DIR] [--kiln PATH] [--work DIR]

`--write-fixtures DIR` writes, for every sample classified ok or refused,
DIR/<name>__<variant>__<k>.pt2 (name and variant sanitized, variant
`default` when the OpInfo has none, k the sample's index) with
`.inputs.safetensors` and `.expected.safetensors` (`output.N`, f64 as f32)
for ok ones, `.refused` (the first line of Kiln's error) for refused ones,
and DIR/summary.json. If DIR would exceed ~6 MB only the first such sample
of each OpInfo is kept (then, if still over, one refused sample per
distinct refusal). summary.json's `fixtures` says per file stem its status
and whether values are compared (`values`: false for random ops: compare
shapes and dtypes only).

Needs torch, safetensors, numpy and `expecttest` (imported by
torch.testing._internal).
"""

import argparse
import collections
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import traceback

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")

import torch  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
ATOL = 1e-4
RTOL = 1e-4
MAX_SAMPLES = 3
KILN_TIMEOUT = 60
EXPORT_TIMEOUT = 120
FIXTURE_BUDGET = 6 * 1024 * 1024
# Ops whose results are uninitialized memory: compare shapes and dtypes only.
UNINITIALIZED = {"empty", "empty_like", "new_empty", "new_empty_strided", "empty_strided", "empty_permuted"}
KILN_DTYPES = {torch.float32, torch.float16, torch.int32, torch.int64, torch.uint32, torch.int8, torch.bool}


def sanitize(s):
    return re.sub(r"[^A-Za-z0-9_.-]", "_", s)


def opinfo_id(op):
    return op.name if not op.variant_test_name else f"{op.name}.{op.variant_test_name}"


def case_safe(stem):
    """Upper-case letters as `_` + lower case: `T` and `t` are both OpInfos,
    and file names must differ on case-insensitive file systems too."""
    return re.sub(r"[A-Z]", lambda m: "_" + m.group(0).lower(), stem)


def stem_of(op, k):
    return case_safe(f"{sanitize(op.name)}__{sanitize(op.variant_test_name or 'default')}__{k}")


# ---------------------------------------------------------------- structure


class Slot:
    def __init__(self, i):
        self.i = i


def extract(obj, tensors):
    """Replace every tensor in obj (lists, tuples, dicts) by a Slot."""
    if isinstance(obj, torch.Tensor):
        tensors.append(obj)
        return Slot(len(tensors) - 1)
    if isinstance(obj, (list, tuple)) and not isinstance(obj, torch.Size):
        items = [extract(x, tensors) for x in obj]
        if isinstance(obj, list):
            return items
        if hasattr(obj, "_fields"):  # namedtuple
            return type(obj)(*items)
        return type(obj)(items) if type(obj) is not tuple else tuple(items)
    if isinstance(obj, dict):
        return {k: extract(v, tensors) for k, v in obj.items()}
    return obj


def rebuild(obj, tensors):
    if isinstance(obj, Slot):
        return tensors[obj.i]
    if isinstance(obj, list):
        return [rebuild(x, tensors) for x in obj]
    if isinstance(obj, tuple) and not isinstance(obj, torch.Size):
        items = [rebuild(x, tensors) for x in obj]
        if hasattr(obj, "_fields"):
            return type(obj)(*items)
        return tuple(items)
    if isinstance(obj, dict):
        return {k: rebuild(v, tensors) for k, v in obj.items()}
    return obj


def flatten_out(out):
    """The result's tensors in order, or None if it holds a non-tensor."""
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (list, tuple)) and not isinstance(out, torch.Size):
        flat = []
        for x in out:
            f = flatten_out(x)
            if f is None:
                return None
            flat.extend(f)
        return flat
    return None


class Wrapped(torch.nn.Module):
    def __init__(self, fn, template, single):
        super().__init__()
        self.fn = fn
        self.template = template
        self.single = single

    def forward(self, *tensors):
        inp, args, kwargs = rebuild(self.template, list(tensors))
        out = self.fn(inp, *args, **kwargs)
        flat = flatten_out(out)
        return flat[0] if self.single else tuple(flat)


# ---------------------------------------------------------------- comparison


def same_values(a, b):
    """Exact equality with NaN == NaN (for the eager-vs-eager check)."""
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.is_complex() or a.is_floating_point():
        return bool(torch.equal(torch.nan_to_num(a, nan=0.0), torch.nan_to_num(b, nan=0.0))
                    and torch.equal(torch.isnan(a), torch.isnan(b)))
    return bool(torch.equal(a, b))


def compare(got, want, values=True):
    """None if got matches want, else a short message; plus the max error."""
    if want.is_complex():
        return "eager result is complex", None
    want_dtype = torch.float32 if want.dtype == torch.float64 else want.dtype
    if tuple(got.shape) != tuple(want.shape):
        return f"shape {list(got.shape)} != eager {list(want.shape)}", None
    if got.dtype != want_dtype:
        return f"dtype {got.dtype} != eager {want.dtype}", None
    if not values or want.numel() == 0:
        return None, 0.0
    if want.dtype == torch.bool:
        bad = int((got != want).sum())
        return (f"{bad} of {want.numel()} values differ" if bad else None), float(bad > 0)
    g = got.double()
    w = want.double()
    close = torch.isclose(g, w, rtol=RTOL, atol=ATOL, equal_nan=True)
    diff = (g - w).abs()
    finite = torch.isfinite(diff)
    err = float(diff[finite].max()) if bool(finite.any()) else 0.0
    if bool(close.all()):
        return None, err
    bad = int((~close).sum())
    nonfinite_bad = int((~close & ~finite).sum())
    i = int((~close).flatten().nonzero()[0])
    msg = (f"{bad} of {want.numel()} values differ, max abs err {err:.3g}"
           f"{f' ({nonfinite_bad} non-finite mismatches)' if nonfinite_bad else ''}"
           f"; first at flat index {i}: kiln {g.flatten()[i].item():.6g} vs eager {w.flatten()[i].item():.6g}")
    return msg, (err if nonfinite_bad == 0 else math.inf)


# ---------------------------------------------------------------- kiln


def first_line(text):
    for line in text.splitlines():
        if line.strip():
            return line.strip()
    return ""


def run_kiln(kiln, pt2, inputs, output, backend):
    env = dict(os.environ)
    if backend == "gpu":
        env.setdefault("XDG_RUNTIME_DIR", "/tmp")
        env.setdefault("WGPU_BACKEND", "vulkan")
    if os.path.exists(output):
        os.remove(output)
    cmd = [kiln, "run", pt2, "--inputs", inputs, "--output", output, "--backend", backend]
    t0 = time.time()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=KILN_TIMEOUT, env=env)
    except subprocess.TimeoutExpired:
        return {"status": "timeout", "seconds": KILN_TIMEOUT}
    secs = round(time.time() - t0, 3)
    if p.returncode == 101 or "panicked" in p.stderr:
        lines = [l for l in p.stderr.splitlines() if "panicked" in l]
        msg = lines[0].strip() if lines else first_line(p.stderr)
        # the panic message is on the line after "panicked at FILE:LINE:COL:"
        after = p.stderr.split("panicked", 1)[1].splitlines()[1:2] if "panicked" in p.stderr else []
        if after:
            msg += " " + after[0].strip()
        return {"status": "panic", "error": msg, "rc": p.returncode, "seconds": secs}
    if p.returncode != 0:
        stderr = p.stderr.replace(os.path.dirname(pt2) + os.sep, "").strip()
        err = first_line(stderr)
        rec = {"status": "refused", "error": err or f"exit {p.returncode}, no message", "rc": p.returncode,
               "seconds": secs}
        if stderr != err:
            rec["stderr"] = stderr[:3000]
        return rec
    return {"status": "ran", "seconds": secs}


def check_output(output, eager_outs, mutated, values):
    """Compare Kiln's output file with eager: outputs then written inputs."""
    try:
        got = load_file(output)
    except Exception as e:  # noqa: BLE001
        return {"status": "wrong", "error": f"cannot read output file: {e}", "max_err": None}
    n = len([k for k in got if re.fullmatch(r"output\.\d+", k)])
    if n != len(eager_outs):
        return {"status": "wrong", "error": f"{n} outputs, eager has {len(eager_outs)}", "max_err": None}
    worst = 0.0
    for i, want in enumerate(eager_outs):
        msg, err = compare(got[f"output.{i}"], want, values)
        if msg:
            return {"status": "wrong", "error": f"output.{i}: {msg}", "max_err": err}
        worst = max(worst, err or 0.0)
    for name, want in mutated.items():
        if name not in got:
            return {"status": "wrong", "error": f"input `{name}` is written by eager, not in Kiln's output",
                    "max_err": None}
        msg, err = compare(got[name], want, values)
        if msg:
            return {"status": "wrong", "error": f"written input `{name}`: {msg}", "max_err": err}
        worst = max(worst, err or 0.0)
    return {"status": "ok", "max_err": worst}


# ---------------------------------------------------------------- one OpInfo


class ExportTimeout(Exception):
    pass


def _alarm(signum, frame):
    raise ExportTimeout(f"took over {EXPORT_TIMEOUT} s")


def short_exc(e):
    s = first_line(str(e)) or ""
    return f"{type(e).__name__}: {s}"[:300]


def run_sample(op, k, sample, args, work):
    rec = {"k": k, "stem": stem_of(op, k)}
    tensors = []
    template = extract((sample.input, tuple(sample.args), dict(sample.kwargs)), tensors)
    rec["input_shapes"] = [[list(t.shape), str(t.dtype).replace("torch.", "")] for t in tensors]
    bad = [t.dtype for t in tensors if t.dtype == torch.float64 or t.is_complex()]
    if bad:
        rec.update(status="not_exportable", reason=f"{bad[0]} input")
        return rec
    base = [t.detach().contiguous().clone() for t in tensors]

    def eager(seed):
        xs = [t.clone() for t in base]
        torch.manual_seed(seed)
        inp, a, kw = rebuild(template, xs)
        return op.op(inp, *a, **kw), xs

    try:
        out, written = eager(0)
    except Exception as e:  # noqa: BLE001
        rec.update(status="not_exportable", reason=f"eager fails: {short_exc(e)}")
        return rec
    flat = flatten_out(out)
    if flat is None:
        rec.update(status="not_exportable", reason=f"not a tensor program (result {type(out).__name__})")
        return rec
    if not flat:
        rec.update(status="not_exportable", reason="not a tensor program (no tensor in the result)")
        return rec
    flat = [t.detach() for t in flat]
    try:
        out2, _ = eager(1)
        flat2 = [t.detach() for t in flatten_out(out2)]
        deterministic = len(flat2) == len(flat) and all(same_values(a, b) for a, b in zip(flat, flat2))
    except Exception:  # noqa: BLE001
        deterministic = False
    values = deterministic and op.name not in UNINITIALIZED
    rec["values"] = values
    mutated = {}
    rec["output_shapes"] = [[list(t.shape), str(t.dtype).replace("torch.", "")] for t in flat]

    module = Wrapped(op.op, template, isinstance(out, torch.Tensor))
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(EXPORT_TIMEOUT)
    try:
        torch.manual_seed(0)
        ep = torch.export.export(module, tuple(t.clone() for t in base), strict=False)
        if args.after_decompositions:
            try:
                ep = ep.run_decompositions()
            except ExportTimeout:
                raise
            except Exception as e:  # noqa: BLE001
                rec.update(status="not_exportable", reason=f"run_decompositions fails: {short_exc(e)}")
                return rec
    except Exception as e:  # noqa: BLE001
        rec.update(status="not_exportable", reason=f"export fails: {short_exc(e)}")
        return rec
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    names = list(ep.graph_signature.user_inputs)
    if len(names) != len(base):
        rec.update(status="not_exportable", reason=f"export has {len(names)} user inputs for {len(base)} tensors")
        return rec
    for name, before, after in zip(names, base, written):
        if not same_values(before, after):
            mutated[name] = after
    if mutated:
        rec["writes_inputs"] = list(mutated)
    stem = os.path.join(work, rec["stem"])
    try:
        torch.export.save(ep, stem + ".pt2")
        save_file({n: t for n, t in zip(names, base)}, stem + ".inputs.safetensors")
        expected = {}
        for i, t in enumerate(flat):
            if t.is_complex():
                continue
            t = t.float() if t.dtype == torch.float64 else t
            expected[f"output.{i}"] = t.contiguous().clone()
        save_file(expected, stem + ".expected.safetensors")
    except Exception as e:  # noqa: BLE001
        rec.update(status="not_exportable", reason=f"save fails: {short_exc(e)}")
        return rec
    rec["unheld_dtypes"] = sorted({str(t.dtype) for t in base + flat if t.dtype not in KILN_DTYPES}) or None

    for backend in ["reference"] + (["gpu"] if args.gpu else []):
        if backend == "gpu" and rec["status"] != "ok":
            break
        r = run_kiln(args.kiln, stem + ".pt2", stem + ".inputs.safetensors", stem + f".{backend}.out.safetensors",
                     backend)
        if r["status"] == "ran":
            r.update(check_output(stem + f".{backend}.out.safetensors", flat, mutated, values))
        if backend == "reference":
            rec.update(r)
            if r["status"] == "refused":
                m = re.search(r"`(?:torch\.ops\.)?((?:aten|prims|[A-Za-z0-9_]+)\.[A-Za-z0-9_]+\.[A-Za-z0-9_]+)`",
                              strip_node(r["error"]))
                if m:
                    rec["op"] = m.group(1)
        else:
            rec["gpu"] = r
    return rec


def run_opinfo(op, args, work):
    res = {"id": opinfo_id(op), "name": op.name, "variant": op.variant_test_name, "samples": []}
    torch.manual_seed(0)
    torch.set_num_threads(1)
    try:
        samples = op.sample_inputs("cpu", torch.float32, requires_grad=False)
        picked = []
        for s in samples:
            picked.append(s)
            if len(picked) >= args.limit_samples:
                break
    except Exception as e:  # noqa: BLE001
        res["error"] = f"sample_inputs fails: {short_exc(e)}"
        return res
    for k, s in enumerate(picked):
        try:
            res["samples"].append(run_sample(op, k, s, args, work))
        except Exception as e:  # noqa: BLE001
            res["samples"].append({"k": k, "stem": stem_of(op, k), "status": "not_exportable",
                                   "reason": f"sweep error: {short_exc(e)}",
                                   "trace": traceback.format_exc()[-2000:]})
    return res


def opinfo_status(res):
    st = [s["status"] for s in res["samples"] if s["status"] != "not_exportable"]
    if not st:
        return "not_exportable"
    for x in ("wrong", "panic", "timeout", "refused"):
        if x in st:
            return x
    return "running"


# ---------------------------------------------------------------- driver


def child_main(op, args, work, wfd):
    try:
        res = run_opinfo(op, args, work)
    except BaseException as e:  # noqa: BLE001
        res = {"id": opinfo_id(op), "name": op.name, "variant": op.variant_test_name, "samples": [],
               "error": f"sweep error: {short_exc(e)}"}
    data = json.dumps(res, default=str).encode()
    with os.fdopen(wfd, "wb") as f:
        f.write(data)
    os._exit(0)


def start(op, args, work):
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        child_main(op, args, work, w)
    os.close(w)
    return {"pid": pid, "fd": r, "op": op, "t0": time.time(), "buf": b""}


def finish(job, timed_out=False):
    if timed_out:
        os.kill(job["pid"], signal.SIGKILL)
    with os.fdopen(job["fd"], "rb") as f:
        data = job["buf"] + f.read()
    _, status = os.waitpid(job["pid"], 0)
    op = job["op"]
    if data:
        try:
            return json.loads(data)
        except ValueError:
            pass
    why = "timed out" if timed_out else f"died (wait status {status})"
    return {"id": opinfo_id(op), "name": op.name, "variant": op.variant_test_name, "samples": [],
            "error": f"sweep child {why}"}


def run_all(ops, args, work):
    """Each OpInfo in a forked child; up to --jobs at a time."""
    import select

    results = {}
    pending = list(ops)
    running = []
    per_op_limit = EXPORT_TIMEOUT + 30 + args.limit_samples * (EXPORT_TIMEOUT + KILN_TIMEOUT * (2 if args.gpu else 1) + 30)
    done = 0
    t_start = time.time()
    while pending or running:
        while pending and len(running) < args.jobs:
            running.append(start(pending.pop(0), args, work))
        fds = [j["fd"] for j in running]
        ready, _, _ = select.select(fds, [], [], 1.0)
        still = []
        for j in running:
            finished = False
            if j["fd"] in ready:
                chunk = os.read(j["fd"], 1 << 20)
                if chunk:
                    j["buf"] += chunk
                else:
                    finished = True
            if finished or time.time() - j["t0"] > per_op_limit:
                res = finish(j, timed_out=not finished)
                res["seconds"] = round(time.time() - j["t0"], 2)
                results[res["id"]] = res
                done += 1
                st = [s["status"] for s in res["samples"]]
                print(f"[{done}/{len(ops)} {time.time() - t_start:5.0f}s] {res['id']}: {opinfo_status(res)} "
                      f"({' '.join(st)}){'  ' + res['error'] if res.get('error') else ''}", flush=True)
            else:
                still.append(j)
        running = still
    return [results[opinfo_id(op)] for op in ops]


def strip_node(msg):
    """The message without "error: " and the "(node `n`, from File ...: `code`)" part."""
    msg = re.sub(r"^error:\s*", "", msg)
    msg = re.sub(r"\s*\(node `[^`]*`(, from File .*?: `.*?`)?\)", "", msg)
    return msg


def refusal_key(s):
    """The refusal's group: the op's name if Kiln lacks it, else the message
    with names of tensors, paths and numbers taken out."""
    msg = strip_node(s.get("stderr") or s.get("error", ""))
    msg = re.sub(r"\s*\n\s*", " ", msg)
    msg = re.sub(r"^\S+\.pt2: ", "", msg)
    msg = re.sub(r"^node \d+: ", "", msg)
    msg = re.sub(r"; this is a bug in Kiln's importer.*$", " [says: a bug in Kiln's importer]", msg)
    msg = re.sub(r"\(line \d+: `%[^`]*= ([A-Za-z0-9_.]+)\([^`]*\)`: ", r"(`\1(...)`: ", msg)
    msg = re.sub(r"\s*\(it has: .*", "", msg)
    msg = re.sub(r"tensor `[^`]*`", "tensor `_`", msg)
    op = s.get("op")
    if op:
        msg = msg.replace(f"op `torch.ops.{op}`", "").replace(f"op `{op}`", "").replace(f"`torch.ops.{op}`", "").replace(f"`{op}`", "").strip(" :;,")
        if msg.startswith("is not supported by Kiln"):
            return op
        msg = f"{op}: {msg}"
    msg = re.sub(r"(?<![A-Za-z_0-9])\d+(?![A-Za-z_0-9])", "N", msg)
    return re.sub(r"\s+", " ", msg).strip()[:200]


CATEGORIES = [
    ("op not in Kiln", r"is not supported by Kiln"),
    ("message says: bug in Kiln's importer", r"a bug in Kiln's importer"),
    ("Infinity/NaN float argument", r'holds "(-?Infinity|NaN)"'),
    ("dtype Kiln does not hold", r"does not hold|dtype (float64|complex|uint8|bfloat16)"),
    ("overload Kiln lacks", r"has no overload|no overload of"),
    ("data-dependent / symbolic shapes", r"depends on the values|symbolic"),
    ("random", r"random"),
    ("effect token input", r"kind `token`"),
]


def refusal_category(s):
    msg = s.get("stderr") or s.get("error", "")
    for name, pat in CATEGORIES:
        if re.search(pat, msg):
            return name
    return "other"


def summarize(results, args):
    counts = collections.Counter(opinfo_status(r) for r in results)
    samples = [s for r in results for s in r["samples"]]
    sc = collections.Counter(s["status"] for s in samples)
    exportable = sum(1 for r in results if opinfo_status(r) != "not_exportable")
    summary = {
        "torch": torch.__version__,
        "mode": "after_decompositions" if args.after_decompositions else "export",
        "opinfos": len(results),
        "opinfos_exportable": exportable,
        "opinfos_running": counts["running"],
        "opinfos_refused": counts["refused"],
        "opinfos_wrong": counts["wrong"],
        "opinfos_panic": counts["panic"],
        "opinfos_timeout": counts["timeout"],
        "opinfos_with_a_panic": sum(1 for r in results if any(s["status"] == "panic" for s in r["samples"])),
        "opinfos_with_an_ok_sample": sum(1 for r in results if any(s["status"] == "ok" for s in r["samples"])),
        "samples": len(samples),
        "samples_by_status": dict(sc),
    }
    if args.gpu:
        g = collections.Counter(s["gpu"]["status"] for s in samples if "gpu" in s)
        summary["gpu_samples_by_status"] = dict(g)
        summary["opinfos_running_on_gpu"] = sum(
            1 for r in results if opinfo_status(r) == "running"
            and all(s.get("gpu", {}).get("status") == "ok" for s in r["samples"] if s["status"] == "ok"))
    reasons = collections.Counter(refusal_key(s) for s in samples if s["status"] == "refused")
    reasons_op = collections.Counter()
    for r in results:
        for key in {refusal_key(s) for s in r["samples"] if s["status"] == "refused"}:
            reasons_op[key] += 1
    summary["refused_samples_by_category"] = dict(collections.Counter(
        refusal_category(s) for s in samples if s["status"] == "refused").most_common())
    ne = collections.Counter(re.sub(r"\d+", "N", s["reason"])[:120] for s in samples if s["status"] == "not_exportable")
    return summary, reasons, reasons_op, ne


def print_summary(summary, reasons, reasons_op, ne, results, top):
    print()
    print(f"torch {summary['torch']}, mode {summary['mode']}")
    print(f"OpInfos (float32 on CPU): {summary['opinfos']}; exportable: {summary['opinfos_exportable']}")
    print(f"  runs as eager does: {summary['opinfos_running']}")
    print(f"  refused:            {summary['opinfos_refused']}")
    print(f"  wrong:              {summary['opinfos_wrong']}")
    print(f"  panic:              {summary['opinfos_panic']} (OpInfos with any panic: {summary['opinfos_with_a_panic']})")
    print(f"  timeout:            {summary['opinfos_timeout']}")
    print(f"  with at least one ok sample: {summary['opinfos_with_an_ok_sample']}")
    print(f"samples: {summary['samples']} {summary['samples_by_status']}")
    if "gpu_samples_by_status" in summary:
        print(f"gpu (samples ok on the reference): {summary['gpu_samples_by_status']}; "
              f"OpInfos running on the gpu too: {summary['opinfos_running_on_gpu']}")
    print(f"refused samples by kind: {summary['refused_samples_by_category']}")
    print(f"\nrefusal reasons (samples, OpInfos), top {top}:")
    for key, n in reasons.most_common(top):
        print(f"  {n:4d} {reasons_op[key]:4d}  {key}")
    print("\nnot exportable reasons, top 15:")
    for key, n in ne.most_common(15):
        print(f"  {n:4d}  {key}")
    bad = [(r["id"], s) for r in results for s in r["samples"] if s["status"] in ("wrong", "panic", "timeout")]
    if bad:
        print("\nwrong / panic / timeout samples:")
        for oid, s in bad:
            print(f"  {s['status']:7s} {oid} #{s['k']} {s.get('input_shapes')}: {s.get('error', '')}")
    gbad = [(r["id"], s) for r in results for s in r["samples"] if s.get("gpu", {}).get("status", "ok") != "ok"]
    if gbad:
        print("\ngpu failures (ok on the reference):")
        for oid, s in gbad:
            print(f"  {s['gpu']['status']:7s} {oid} #{s['k']}: {s['gpu'].get('error', '')}")
    errs = [r for r in results if r.get("error")]
    if errs:
        print("\nOpInfos the sweep could not process:")
        for r in errs:
            print(f"  {r['id']}: {r['error']}")


def fsize(path):
    return os.path.getsize(path) if os.path.exists(path) else 0


def write_fixtures(results, summary, work, out_dir):
    os.makedirs(out_dir, exist_ok=True)
    for f in os.listdir(out_dir):
        if f.endswith((".pt2", ".safetensors", ".refused")) or f == "summary.json":
            os.remove(os.path.join(out_dir, f))

    def files(s):
        # Refused samples keep their inputs and eager's outputs too: when Kiln
        # learns the op, the fixture can check what it computes.
        stem = s["stem"]
        fs = [stem + ".pt2", stem + ".inputs.safetensors", stem + ".expected.safetensors"]
        return [f for f in fs if s["status"] == "ok" or os.path.exists(os.path.join(work, f))]

    def dest(f):  # the stem as stem_of makes it now (reports of older runs)
        return case_safe(f)

    def size(sel):
        return sum(fsize(os.path.join(work, f)) for _, s in sel for f in files(s)) + sum(
            len(s.get("error", "")) + 1 for _, s in sel if s["status"] == "refused")

    chosen = [(r, s) for r in results for s in r["samples"] if s["status"] in ("ok", "refused")]
    policy = "all ok and refused samples"
    print(f"\nfixtures, {policy}: {len(chosen)} samples, {size(chosen) / 1e6:.2f} MB")
    if size(chosen) > FIXTURE_BUDGET:
        seen = set()
        first = []
        for r, s in chosen:
            if r["id"] not in seen:
                seen.add(r["id"])
                first.append((r, s))
        chosen = first
        policy = "first ok or refused sample of each OpInfo"
        print(f"fixtures, {policy}: {len(chosen)} samples, {size(chosen) / 1e6:.2f} MB")
    if size(chosen) > FIXTURE_BUDGET:
        seen = set()
        kept = []
        for r, s in chosen:
            if s["status"] == "refused":
                key = refusal_key(s)
                if key in seen:
                    continue
                seen.add(key)
            kept.append((r, s))
        chosen = kept
        policy += ", one refused sample per distinct refusal"
        print(f"fixtures, {policy}: {len(chosen)} samples, {size(chosen) / 1e6:.2f} MB")
    fixtures = {}
    for r, s in chosen:
        for f in files(s):
            shutil.copyfile(os.path.join(work, f), os.path.join(out_dir, dest(f)))
        entry = {"opinfo": r["id"], "sample": s["k"], "status": s["status"], "values": s.get("values", True),
                 "outputs": len(s.get("output_shapes", []))}
        if any("complex" in d for _, d in s.get("output_shapes", [])):
            entry["complex_outputs_not_in_expected"] = True
        if s.get("writes_inputs"):
            entry["writes_inputs"] = s["writes_inputs"]
        if s["status"] == "refused":
            with open(os.path.join(out_dir, dest(s["stem"]) + ".refused"), "w") as f:
                f.write(s["error"] + "\n")
            entry["error"] = s["error"]
        else:
            entry["max_err"] = s.get("max_err")
        fixtures[dest(s["stem"])] = entry
    doc = dict(summary)
    doc["tolerance"] = {"atol": ATOL, "rtol": RTOL, "nan_equal": True}
    doc["fixture_policy"] = policy
    doc["per_opinfo"] = {r["id"]: opinfo_status(r) for r in results}
    doc["fixtures"] = fixtures
    with open(os.path.join(out_dir, "summary.json"), "w") as f:
        json.dump(doc, f, indent=1, sort_keys=True)
        f.write("\n")
    total = sum(fsize(os.path.join(out_dir, f)) for f in os.listdir(out_dir))
    print(f"wrote {len(fixtures)} fixtures to {out_dir}: {total} bytes ({total / 1e6:.2f} MB)")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", help="OpInfo names (or name.variant), comma-separated")
    ap.add_argument("--limit-samples", type=int, default=MAX_SAMPLES)
    ap.add_argument("--jobs", type=int, default=1)
    ap.add_argument("--gpu", action="store_true", help="also run the GPU backend on samples ok on the reference")
    ap.add_argument("--after-decompositions", action="store_true", help="export, then ep.run_decompositions()")
    ap.add_argument("--report", default="/tmp/opinfo_report.json")
    ap.add_argument("--write-fixtures", metavar="DIR")
    ap.add_argument("--kiln", default=os.path.join(ROOT, "target", "debug", "kiln"))
    ap.add_argument("--work", help="scratch directory (default /tmp/opinfo_work[_decomp])")
    ap.add_argument("--top", type=int, default=40, help="refusal reasons to print")
    ap.add_argument("--from-report", metavar="FILE",
                    help="run nothing: summarize (and with --write-fixtures write fixtures from --work) a report")
    args = ap.parse_args()
    if args.from_report:
        with open(args.from_report) as f:
            old = json.load(f)
        results = old["results"]
        args.gpu = "gpu_samples_by_status" in old["summary"]
        args.after_decompositions = old["summary"]["mode"] == "after_decompositions"
        summary, reasons, reasons_op, ne = summarize(results, args)
        summary["seconds"] = old["summary"].get("seconds")
        summary["torch"] = old["summary"]["torch"]
        print_summary(summary, reasons, reasons_op, ne, results, args.top)
        if args.write_fixtures:
            work = args.work or ("/tmp/opinfo_work_decomp" if args.after_decompositions else "/tmp/opinfo_work")
            write_fixtures(results, summary, work, args.write_fixtures)
        return
    args.kiln = os.path.abspath(args.kiln)
    if not os.path.exists(args.kiln):
        sys.exit(f"no Kiln binary at {args.kiln}: cargo build --bin kiln, or --kiln PATH")
    work = args.work or ("/tmp/opinfo_work_decomp" if args.after_decompositions else "/tmp/opinfo_work")
    if os.path.isdir(work):
        shutil.rmtree(work)
    os.makedirs(work)

    import warnings

    warnings.filterwarnings("ignore")
    from torch.testing._internal.common_methods_invocations import op_db

    ops = [op for op in op_db if torch.float32 in op.supported_dtypes("cpu")]
    if args.only:
        want = set(args.only.split(","))
        ops = [op for op in ops if op.name in want or opinfo_id(op) in want]
        if not ops:
            sys.exit(f"no OpInfo named {args.only}")
    print(f"{len(ops)} OpInfos support float32 on the CPU; at most {args.limit_samples} samples each; "
          f"kiln {args.kiln}; work {work}", flush=True)
    t0 = time.time()
    results = run_all(ops, args, work)
    elapsed = time.time() - t0
    summary, reasons, reasons_op, ne = summarize(results, args)
    summary["seconds"] = round(elapsed, 1)
    print_summary(summary, reasons, reasons_op, ne, results, args.top)
    print(f"\n{elapsed:.0f} s")
    report = {"summary": summary,
              "refusal_reasons": [{"reason": k, "samples": n, "opinfos": reasons_op[k]} for k, n in reasons.most_common()],
              "not_exportable_reasons": [{"reason": k, "samples": n} for k, n in ne.most_common()],
              "results": [dict(r, status=opinfo_status(r)) for r in results]}
    with open(args.report, "w") as f:
        json.dump(report, f, indent=1, default=str)
    print(f"report: {args.report}")
    if args.write_fixtures:
        write_fixtures(results, summary, work, args.write_fixtures)


if __name__ == "__main__":
    main()
