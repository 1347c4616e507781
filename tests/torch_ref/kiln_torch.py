#!/usr/bin/env python3
"""PyTorch eager reference runner for Kiln program text.

    python3 tests/torch_ref/kiln_torch.py run PROG --inputs IN.safetensors --output OUT.safetensors

Parses the text format of shared/spec/program-format.md and executes every
statement with ``torch.ops.aten.<op>`` in eager mode, so views alias and
in-place ops mutate exactly as PyTorch does. Writes ``output.0``, ``output.1``,
... for the returned values (made contiguous) plus the final value of every
parameter under its own name.

Kiln has no 64-bit floats: every float64 tensor written out is converted to
float32 (only at the output; inside the program the values keep whatever
dtype eager gives them). int64 is Kiln's i64.

Also usable as a library: ``parse_program(text)``, ``run_program(prog, inputs)``.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from dataclasses import dataclass, field
from typing import Any

import torch

# ---------------------------------------------------------------------------
# Text format
# ---------------------------------------------------------------------------

DTYPES = {
    "f32": torch.float32,
    "f16": torch.float16,
    "i32": torch.int32,
    "i64": torch.int64,
    "u32": torch.uint32,
    "i8": torch.int8,
    "bool": torch.bool,
}
DTYPE_NAMES = {v: k for k, v in DTYPES.items()}


class KilnError(Exception):
    """An error the runner reports to the user (non-zero exit, no traceback)."""


class ParseError(KilnError):
    def __init__(self, msg: str, line: int, col: int):
        super().__init__(f"parse error at line {line}, column {col}: {msg}")
        self.line = line
        self.col = col


@dataclass
class Tok:
    kind: str  # 'val' (%name), 'ident', 'int', 'float', 'str', 'punct', 'eof'
    text: str
    line: int
    col: int
    value: Any = None


_TOKEN_RE = re.compile(
    r"""
    (?P<ws>[ \t\r]+)
  | (?P<nl>\n)
  | (?P<comment>\#[^\n]*)
  | (?P<val>%[A-Za-z0-9_]+)
  | (?P<str>"(?:[^"\\\n]|\\.)*")
  | (?P<num>-?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][+-]?\d+)?)
  | (?P<ident>-?[A-Za-z_][A-Za-z0-9_]*)
  | (?P<punct>[()\[\]{},:=])
    """,
    re.VERBOSE,
)


def tokenize(text: str) -> list[Tok]:
    toks: list[Tok] = []
    pos = 0
    line = 1
    line_start = 0
    while pos < len(text):
        m = _TOKEN_RE.match(text, pos)
        col = pos - line_start + 1
        if not m:
            raise ParseError(f"unexpected character {text[pos]!r}", line, col)
        kind = m.lastgroup
        s = m.group()
        if kind == "nl":
            line += 1
            line_start = m.end()
        elif kind in ("ws", "comment"):
            pass
        elif kind == "num":
            if re.fullmatch(r"-?\d+", s):
                toks.append(Tok("int", s, line, col, int(s)))
            else:
                toks.append(Tok("float", s, line, col, float(s)))
        elif kind == "str":
            body = s[1:-1]
            body = re.sub(r"\\(.)", lambda mm: {"n": "\n", "t": "\t"}.get(mm.group(1), mm.group(1)), body)
            toks.append(Tok("str", s, line, col, body))
        elif kind == "ident":
            if s.startswith("-"):
                if s[1:] != "inf":
                    raise ParseError(f"unexpected '-' before {s[1:]!r}", line, col)
                toks.append(Tok("float", s, line, col, -math.inf))
            else:
                toks.append(Tok("ident", s, line, col))
        else:
            toks.append(Tok(kind, s, line, col))
        pos = m.end()
    toks.append(Tok("eof", "", line, pos - line_start + 1))
    return toks


@dataclass(frozen=True)
class Ref:
    """A reference to a %value."""
    name: str
    line: int
    col: int


@dataclass(frozen=True)
class DType:
    dtype: torch.dtype


@dataclass
class Param:
    name: str
    dtype: torch.dtype
    shape: list[int]


@dataclass
class Stmt:
    results: list[str]
    op: str
    args: list[Any]
    line: int
    col: int


@dataclass
class Program:
    name: str
    params: list[Param]
    stmts: list[Stmt]
    returns: list[Ref]
    return_line: int = 0
    comments: list[str] = field(default_factory=list)


class Parser:
    def __init__(self, text: str):
        self.toks = tokenize(text)
        self.i = 0

    def peek(self, k: int = 0) -> Tok:
        return self.toks[min(self.i + k, len(self.toks) - 1)]

    def next(self) -> Tok:
        t = self.toks[self.i]
        if t.kind != "eof":
            self.i += 1
        return t

    def err(self, msg: str, t: Tok | None = None):
        t = t or self.peek()
        found = t.text if t.kind != "eof" else "end of file"
        raise ParseError(f"{msg}, found {found!r}", t.line, t.col)

    def expect_punct(self, p: str) -> Tok:
        t = self.peek()
        if t.kind == "punct" and t.text == p:
            return self.next()
        self.err(f"expected '{p}'")

    def is_punct(self, p: str) -> bool:
        t = self.peek()
        return t.kind == "punct" and t.text == p

    def expect_ident(self, word: str | None = None) -> Tok:
        t = self.peek()
        if t.kind == "ident" and (word is None or t.text == word):
            return self.next()
        self.err(f"expected {word!r}" if word else "expected a name")

    def parse(self) -> Program:
        self.expect_ident("graph")
        name = self.expect_ident().text
        self.expect_punct("(")
        params: list[Param] = []
        defined: set[str] = set()
        while not self.is_punct(")"):
            t = self.peek()
            if t.kind != "val":
                self.err("expected a parameter '%name'")
            self.next()
            pname = t.text[1:]
            if pname in defined:
                raise ParseError(f"parameter %{pname} defined twice", t.line, t.col)
            defined.add(pname)
            self.expect_punct(":")
            dt = self.peek()
            if not ((dt.kind == "ident") and dt.text in DTYPES):
                self.err("expected a dtype (f32, f16, i32, i64, u32, bool)")
            self.next()
            self.expect_punct("[")
            shape: list[int] = []
            while not self.is_punct("]"):
                d = self.peek()
                if d.kind != "int" or d.value < 0:
                    self.err("expected a non-negative dimension")
                shape.append(self.next().value)
                if not self.is_punct("]"):
                    self.expect_punct(",")
            self.expect_punct("]")
            params.append(Param(pname, DTYPES[dt.text], shape))
            if not self.is_punct(")"):
                self.expect_punct(",")
        self.expect_punct(")")
        self.expect_punct("{")
        stmts: list[Stmt] = []
        returns: list[Ref] | None = None
        return_line = 0
        while True:
            t = self.peek()
            if t.kind == "punct" and t.text == "}":
                if returns is None:
                    self.err("expected 'return' before '}'")
                self.next()
                break
            if returns is not None:
                self.err("expected '}' after return")
            if t.kind == "ident" and t.text == "return":
                self.next()
                return_line = t.line
                returns = []
                if self.is_punct("("):
                    self.next()
                    while not self.is_punct(")"):
                        returns.append(self.parse_ref())
                        if not self.is_punct(")"):
                            self.expect_punct(",")
                    self.next()
                else:
                    returns.append(self.parse_ref())
                for r in returns:
                    if r.name not in defined:
                        raise ParseError(f"undefined value %{r.name}", r.line, r.col)
                continue
            results: list[str] = []
            if t.kind == "val":
                while True:
                    v = self.peek()
                    if v.kind != "val":
                        self.err("expected a result '%name'")
                    self.next()
                    rn = v.text[1:]
                    if rn in defined or rn in results:
                        raise ParseError(f"%{rn} is defined twice", v.line, v.col)
                    results.append(rn)
                    if self.is_punct(","):
                        self.next()
                        continue
                    break
                self.expect_punct("=")
            optok = self.peek()
            if optok.kind != "ident":
                self.err("expected an op name")
            self.next()
            self.expect_punct("(")
            args = []
            while not self.is_punct(")"):
                args.append(self.parse_arg(defined))
                if not self.is_punct(")"):
                    self.expect_punct(",")
            self.expect_punct(")")
            defined.update(results)
            stmts.append(Stmt(results, optok.text, args, optok.line, optok.col))
        if self.peek().kind != "eof":
            self.err("expected end of file after '}'")
        return Program(name, params, stmts, returns, return_line)

    def parse_ref(self) -> Ref:
        t = self.peek()
        if t.kind != "val":
            self.err("expected a value '%name'")
        self.next()
        return Ref(t.text[1:], t.line, t.col)

    def parse_arg(self, defined: set[str]):
        t = self.peek()
        if t.kind == "val":
            r = self.parse_ref()
            if r.name not in defined:
                raise ParseError(f"undefined value %{r.name}", r.line, r.col)
            return r
        if t.kind in ("int", "float", "str"):
            self.next()
            return t.value
        if t.kind == "ident":
            self.next()
            if t.text == "true":
                return True
            if t.text == "false":
                return False
            if t.text == "none":
                return None
            if t.text == "inf":
                return math.inf
            if t.text == "nan":
                return math.nan
            if t.text in DTYPES:
                return DType(DTYPES[t.text])
            raise ParseError(f"unknown literal {t.text!r}", t.line, t.col)
        if self.is_punct("["):
            self.next()
            items = []
            while not self.is_punct("]"):
                items.append(self.parse_arg(defined))
                if not self.is_punct("]"):
                    self.expect_punct(",")
            self.next()
            return items
        self.err("expected an argument")


def parse_program(text: str) -> Program:
    return Parser(text).parse()


# ---------------------------------------------------------------------------
# Op resolution: bind positional text arguments against ATen schemas
# ---------------------------------------------------------------------------

class NoBind(Exception):
    pass


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _check(ty: str, n, v):
    """Return the Python value to pass for schema type `ty`, or raise NoBind."""
    if ty.startswith("Optional[") and ty.endswith("]"):
        if v is None:
            return None
        return _check(ty[len("Optional["):-1], n, v)
    if ty == "Tensor":
        if isinstance(v, torch.Tensor):
            return v
        raise NoBind
    if ty == "number":  # Scalar
        if isinstance(v, (bool, int, float)):
            return v
        raise NoBind
    if ty in ("int", "SymInt"):
        if _is_int(v):
            return v
        raise NoBind
    if ty == "float":
        if isinstance(v, float) or _is_int(v):
            return float(v)
        raise NoBind
    if ty == "bool":
        if isinstance(v, bool):
            return v
        raise NoBind
    if ty == "str":
        if isinstance(v, str):
            return v
        raise NoBind
    if ty == "ScalarType":
        if isinstance(v, DType):
            return v.dtype
        raise NoBind
    if ty.startswith("List[") and ty.endswith("]"):
        elem = ty[len("List["):-1]
        if elem in ("int", "SymInt") and _is_int(v) and n is not None:
            return [v]  # int[1] / int[2] accept a single int, as in ATen
        if not isinstance(v, list):
            raise NoBind
        return [_check(elem, None, x) for x in v]
    # Layout, Device, MemoryFormat, Generator, Dimname, ...: only via defaults
    raise NoBind


def _returns_tensors(schema) -> bool:
    for r in schema.returns:
        t = str(r.real_type)
        if t not in ("Tensor", "List[Tensor]"):
            return False
    return len(schema.returns) > 0


def _candidate_overloads(packet):
    out = []
    for ov in packet.overloads():
        op = getattr(packet, ov)
        s = op._schema
        if any(a.kwarg_only and a.alias_info is not None and a.alias_info.is_write for a in s.arguments):
            continue  # out= variants
        if not _returns_tensors(s):
            continue
        out.append(op)
    return out


def bind(op, args):
    """Bind text args against one overload; return (pos, kw) or raise NoBind."""
    s = op._schema
    params = s.arguments
    if len(args) > len(params):
        raise NoBind
    pos, kw = [], {}
    for i, a in enumerate(params):
        if i < len(args):
            v = _check(str(a.real_type), a.N, args[i])
        elif a.has_default_value():
            continue
        else:
            raise NoBind
        if a.kwarg_only:
            kw[a.name] = v
        else:
            if kw:
                raise NoBind
            pos.append(v)
    return pos, kw


def describe(v) -> str:
    if isinstance(v, torch.Tensor):
        return f"{DTYPE_NAMES.get(v.dtype, str(v.dtype).replace('torch.', ''))}{list(v.shape)}"
    if isinstance(v, DType):
        return DTYPE_NAMES[v.dtype]
    if isinstance(v, list):
        return "[" + ", ".join(describe(x) for x in v) + "]"
    return repr(v)




def resolve_and_call(opname: str, args: list):
    packet = getattr(torch.ops.aten, opname, None) if not opname.startswith("__") else None
    cands = []
    if packet is not None:
        try:
            cands = _candidate_overloads(packet)
        except Exception:
            cands = []
    for op in cands:
        try:
            pos, kw = bind(op, args)
        except NoBind:
            continue
        return op(*pos, **kw)
    if not cands:
        raise KilnError(f"unknown op {opname!r} (no aten.{opname} tensor overload)")
    sigs = "\n    ".join(str(op._schema) for op in cands)
    raise KilnError(
        f"no overload of aten.{opname} accepts ({', '.join(describe(a) for a in args)});"
        f" candidates:\n    {sigs}"
    )


# ---------------------------------------------------------------------------
# Execution
# ---------------------------------------------------------------------------

def _resolve_args(v, env):
    if isinstance(v, Ref):
        return env[v.name]
    if isinstance(v, list):
        return [_resolve_args(x, env) for x in v]
    return v


def run_program(prog: Program, inputs: dict[str, torch.Tensor]):
    """Run `prog`; returns (outputs list, params dict of final values)."""
    env: dict[str, Any] = {}
    for p in prog.params:
        if p.name not in inputs:
            raise KilnError(f"input tensor {p.name!r} missing from the inputs file")
        t = inputs[p.name]
        if t.dtype != p.dtype:
            raise KilnError(
                f"input {p.name!r} has dtype {describe(t).split('[')[0]}, the program declares {DTYPE_NAMES[p.dtype]}"
            )
        if list(t.shape) != p.shape:
            raise KilnError(f"input {p.name!r} has shape {list(t.shape)}, the program declares {p.shape}")
        env[p.name] = t.clone().contiguous()  # distinct, contiguous storage
    for st in prog.stmts:
        args = _resolve_args(st.args, env)
        try:
            res = resolve_and_call(st.op, args)
        except KilnError as e:
            raise KilnError(f"line {st.line}: {e}") from None
        except Exception as e:  # what eager refuses
            msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise KilnError(f"line {st.line}: {st.op}: torch refused: {type(e).__name__}: {msg}") from None
        if len(st.results) == 0:
            continue
        # An op returning Tensor[] (split, chunk, unbind, ...) is always
        # unpacked: the statement names exactly one value per piece.
        vals = list(res) if isinstance(res, (list, tuple)) else [res]
        if len(vals) != len(st.results):
            raise KilnError(
                f"line {st.line}: {st.op} gives {len(vals)} result(s), the statement names {len(st.results)}"
            )
        for n, r in zip(st.results, vals):
            env[n] = r
    outs = []
    for r in prog.returns:
        v = env[r.name]
        if not isinstance(v, torch.Tensor):
            raise KilnError(f"returned value %{r.name} is not a tensor")
        outs.append(v)
    params = {p.name: env[p.name] for p in prog.params}
    return outs, params


def to_kiln(t: torch.Tensor) -> torch.Tensor:
    """Contiguous, unaliased copy in a Kiln dtype (float64->float32)."""
    t = t.detach()
    if t.dtype == torch.float64:
        t = t.to(torch.float32)
    return t.clone(memory_format=torch.contiguous_format)


def output_dict(outs, params) -> dict[str, torch.Tensor]:
    d = {f"output.{i}": to_kiln(t) for i, t in enumerate(outs)}
    for k, v in params.items():
        d[k] = to_kiln(v)
    return d


def run_file(prog_path: str, inputs_path: str | None) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    with open(prog_path, encoding="utf-8") as f:
        text = f.read()
    prog = parse_program(text)
    inputs = load_file(inputs_path) if inputs_path else {}
    outs, params = run_program(prog, inputs)
    return output_dict(outs, params)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="kiln_torch.py", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run", help="run a program in PyTorch eager")
    r.add_argument("prog")
    r.add_argument("--inputs", help="safetensors file with one tensor per parameter")
    r.add_argument("--output", required=True, help="safetensors file to write")
    p = sub.add_parser("parse", help="parse a program and print a summary")
    p.add_argument("prog")
    s = sub.add_parser("show", help="print the tensors of a safetensors file")
    s.add_argument("file")
    a = ap.parse_args(argv)
    try:
        if a.cmd == "show":
            from safetensors.torch import load_file

            torch.set_printoptions(precision=4, linewidth=120, threshold=200)
            for k, v in load_file(a.file).items():
                print(f"{k}: {describe(v)}\n{v}")
            return 0
        if a.cmd == "parse":
            with open(a.prog, encoding="utf-8") as f:
                prog = parse_program(f.read())
            print(f"graph {prog.name}: {len(prog.params)} params, {len(prog.stmts)} statements, {len(prog.returns)} returns")
            return 0
        from safetensors.torch import save_file

        out = run_file(a.prog, a.inputs)
        save_file(out, a.output)
        return 0
    except KilnError as e:
        print(f"error: {a.prog}: {e}", file=sys.stderr)
        return 1
    except OSError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except Exception as e:  # e.g. a corrupt safetensors file
        print(f"error: {a.prog}: {type(e).__name__}: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
