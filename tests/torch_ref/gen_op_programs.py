#!/usr/bin/env python3
"""Write the per-op test programs under tests/programs/ops/<op>/<case>.txt.

    python3 tests/torch_ref/gen_op_programs.py              # write every op's programs
    python3 tests/torch_ref/gen_op_programs.py softplus     # only these ops' (folder names)
    python3 tests/torch_ref/gen_op_programs.py --check      # compare, write nothing (CI)
    python3 tests/torch_ref/gen_op_programs.py --list       # print the case names only

Every program is plain Kiln text (shared/spec/program-format.md); this script
only saves typing. It writes only the programs whose text changed and deletes
nothing: a program on disk that it does not generate is reported (`--check`
fails on it), for you to remove or to add here. Edit the cases here, not the
generated files. Sizes are awkward on
purpose (1, 3, 50, 783); non-contiguous operands are made inside the program
(transpose, slice with a step, expand for reads); dtypes f32, f16, i32, bool and
u32 appear where eager supports them. Fixtures: make_fixtures.py.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
OUT = REPO / "tests" / "programs" / "ops"

CASES: dict[str, str] = {}  # "op/case" -> program text


def shp(shape) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


def add(op: str, case: str, params: list[str], body: list[str], rets: list[str], anns=None, note: str | None = None):
    key = f"{op}/{case}"
    assert key not in CASES, key
    gname = re.sub(r"[^A-Za-z0-9_]", "_", f"{op}__{case}")
    lines = [f"# op {op}: {case.replace('_', ' ')}" + (f". {note}" if note else "")]
    for a in anns or []:
        lines.append(f"# input {a}")
    lines.append(f"graph {gname}({', '.join(params)}) {{")
    for b in body:
        lines.append(f"  {b}")
    if len(rets) == 1:
        lines.append(f"  return {rets[0]}")
    else:
        lines.append(f"  return ({', '.join(rets)})")
    lines.append("}")
    CASES[key] = "\n".join(lines) + "\n"


class Operand:
    """A parameter, possibly turned into a non-contiguous view in the program."""

    def __init__(self, name: str, dt: str, shape, layout: str = "c", ann: str | None = None):
        self.params: list[str] = []
        self.lines: list[str] = []
        self.anns: list[str] = []
        shape = list(shape)
        src = name
        if layout == "c":
            self.params.append(f"%{name}: {dt}{shp(shape)}")
        elif layout == "t":  # transposed: a [b, a] parameter viewed as [a, b]
            src = name + "_src"
            s = shape[:-2] + [shape[-1], shape[-2]]
            self.params.append(f"%{src}: {dt}{shp(s)}")
            self.lines.append(f"%{name} = transpose(%{src}, -1, -2)")
        elif layout == "s":  # every other element of the last dim, starting at 1
            src = name + "_src"
            s = shape[:-1] + [2 * shape[-1] + 1]
            self.params.append(f"%{src}: {dt}{shp(s)}")
            self.lines.append(f"%{name} = slice(%{src}, -1, 1, none, 2)")
        elif layout == "e":  # expanded from size 1 in the first dim
            src = name + "_src"
            s = [1] + shape[1:]
            self.params.append(f"%{src}: {dt}{shp(s)}")
            self.lines.append(f"%{name} = expand(%{src}, {shp(shape)})")
        else:
            raise ValueError(layout)
        if ann:
            self.anns.append(f"%{src}: {ann}")
        self.ref = f"%{name}"


def assemble(*ops: Operand):
    params, lines, anns = [], [], []
    for o in ops:
        params += o.params
        lines += o.lines
        anns += o.anns
    return params, lines, anns


LAYOUT_NAMES = {"c": "contiguous", "t": "transposed", "s": "step_slice", "e": "expanded"}

# ---------------------------------------------------------------------------
# Unary elementwise ops
# ---------------------------------------------------------------------------

UNARY = {
    # op: (float annotation or None, i32 ok, i32 annotation, u32 ok)
    "neg": (None, True, None, False),
    "exp": (None, True, None, True),
    "log": ("uniform 0.1..3.0", True, "int 1..20", True),
    "sqrt": ("uniform 0.0..3.0", True, "int 0..20", True),
    "rsqrt": ("uniform 0.1..3.0", True, "int 1..20", True),
    "abs": (None, True, None, False),
    "relu": (None, True, None, True),
    "sigmoid": (None, True, None, True),
    "silu": (None, False, None, False),
    "tanh": (None, True, None, True),
    "gelu": (None, False, None, False),
    "sin": (None, True, None, True),
    "cos": (None, True, None, True),
    "reciprocal": ("uniform 0.25..3.0", True, "int 1..9", True),
    "erf": (None, True, None, True),
    "logical_not": (None, True, None, False),
    "sign": (None, True, None, False),
    "softplus": ("uniform -30.0..30.0", False, None, False),
    "log1p": ("uniform -0.9..3.0", True, "int 0..20", False),
    "expm1": ("uniform -3.0..3.0", True, None, False),
    "log2": ("uniform 0.1..3.0", True, "int 1..20", False),
    "log10": ("uniform 0.1..3.0", True, "int 1..20", False),
    "floor": ("uniform -8.0..8.0", True, None, False),
    "ceil": ("uniform -8.0..8.0", True, None, False),
    "trunc": ("uniform -8.0..8.0", True, None, False),
    "round": ("uniform -8.0..8.0", True, None, False),
    "tan": ("uniform -1.2..1.2", True, "int -1..2", False),
    "asin": ("uniform -0.95..0.95", True, "int -1..2", False),
    "acos": ("uniform -0.95..0.95", True, "int -1..2", False),
    "atan": ("uniform -4.0..4.0", True, None, False),
    "sinh": ("uniform -3.0..3.0", True, "int -3..4", False),
    "cosh": ("uniform -3.0..3.0", True, "int -3..4", False),
    "asinh": ("uniform -4.0..4.0", True, None, False),
    "acosh": ("uniform 1.05..4.0", True, "int 1..6", False),
    "atanh": ("uniform -0.9..0.9", False, None, False),
    "leaky_relu": (None, False, None, False),
    "elu": ("uniform -4.0..4.0", False, None, False),
}
# Unary ops whose integer results stay integers (the others promote).
KEEP_INT = ("neg", "abs", "relu", "logical_not", "sign", "floor", "ceil", "trunc", "round")
# Unary ops ATen has no in-place form of (`<op>_`): no in-place cases.
NO_INPLACE: set[str] = {"softplus"}


def gen_unary():
    for op, (fann, i32_ok, iann, u32_ok) in UNARY.items():
        for layout, shape in (("c", [783]), ("t", [3, 50]), ("s", [3, 50]), ("e", [3, 50])):
            x = Operand("x", "f32", shape, layout, fann)
            p, l, a = assemble(x)
            add(op, f"f32_{LAYOUT_NAMES[layout]}", p, l + [f"%y = {op}({x.ref})"], ["%y"], a)
        x = Operand("x", "f32", [1], "c", fann)
        add(op, "f32_size1", x.params, [f"%y = {op}(%x)"], ["%y"], x.anns)
        x = Operand("x", "f32", [], "c", fann)
        add(op, "f32_0d", x.params, [f"%y = {op}(%x)"], ["%y"], x.anns)
        x = Operand("x", "f16", [50], "c", fann)
        add(op, "f16_50", x.params, [f"%y = {op}(%x)"], ["%y"], x.anns)
        if i32_ok:
            x = Operand("x", "i32", [3, 50], "t", iann)
            p, l, a = assemble(x)
            note = "int -> float" if op not in KEEP_INT else None
            add(op, "i32_transposed", p, l + [f"%y = {op}({x.ref})"], ["%y"], a, note)
        if u32_ok:
            add(op, "u32_50", ["%x: u32[50]"], [f"%y = {op}(%x)"], ["%y"], ["%x: int 1..11"])
        if op in NO_INPLACE:
            continue
        # in place
        ip = op + "_"
        x = Operand("x", "f32", [783], "c", fann)
        add(ip, "param", x.params, [f"%y = {ip}(%x)"], ["%x", "%y"], x.anns, "mutates the parameter")
        x = Operand("x", "f32", [3, 50], "c", fann)
        add(ip, "transposed_view_of_param", x.params,
            ["%t = transpose(%x, 0, 1)", f"%y = {ip}(%t)", "%r = select(%t, 0, 2)"],
            ["%x", "%t", "%r"], x.anns)
        x = Operand("x", "f32", [50, 3], "c", fann)
        add(ip, "step_slice", x.params,
            ["%b = clone(%x)", "%s = slice(%b, 0, 1, 48, 3)", f"%y = {ip}(%s)"], ["%b", "%s"], x.anns)
        x = Operand("x", "f16", [50], "c", fann)
        add(ip, "f16", x.params, ["%b = clone(%x)", f"%y = {ip}(%b)"], ["%b"], x.anns)
        if op in KEEP_INT:
            add(ip, "i32_column", ["%x: i32[5, 7]"],
                ["%c = select(%x, 1, -2)", f"%y = {ip}(%c)"], ["%x", "%y"], None, "i32 in place stays i32")
    # round's ties go to the even neighbour; the rounding ops at ties and
    # at integral values
    for op in ("round", "floor", "ceil", "trunc"):
        add(op, "halves", ["%x: f32[64]"], ["%h = div(%x, 2)", f"%y = {op}(%h)"], ["%y"],
            ["%x: int -16..17"])
    # log1p and expm1 near 0, where log(1 + x) and exp(x) - 1 lose digits
    for op in ("log1p", "expm1"):
        add(op, "small", ["%x: f32[200]"], [f"%y = {op}(%x)"], ["%y"], ["%x: uniform -0.001..0.001"])
    # leaky_relu's slope (past 1 too) and elu's alpha, scale and input scale
    for case, args in (("slope_0_2", "0.2"), ("slope_3", "3")):
        x = Operand("x", "f32", [3, 50], "t")
        p, l, a = assemble(x)
        add("leaky_relu", case, p, l + [f"%y = leaky_relu({x.ref}, {args})"], ["%y"], a)
    add("leaky_relu_", "slope_0_5_f16", ["%x: f16[50]"], ["%y = leaky_relu_(%x, 0.5)"], ["%x"])
    for case, args in (("alpha_half_scale_3_2", "0.5, 1.5, 2"), ("alpha2", "2.0")):
        x = Operand("x", "f32", [3, 50], "t", "uniform -4.0..4.0")
        p, l, a = assemble(x)
        add("elu", case, p, l + [f"%y = elu({x.ref}, {args})"], ["%y"], a)
    add("elu_", "selu_constants", ["%x: f32[50]"],
        ["%y = elu_(%x, 1.6732632423543772, 1.0507009873554805, 1)"], ["%x"])
    # softplus's beta and threshold (the linear region past the threshold)
    for case, args in (("beta2_threshold1", "2, 1"), ("beta_half_threshold5", "0.5, 5.0")):
        x = Operand("x", "f32", [3, 50], "t", "uniform -30.0..30.0")
        p, l, a = assemble(x)
        add("softplus", case, p, l + [f"%y = softplus({x.ref}, {args})"], ["%y"], a)
    add("softplus", "f16_beta3", ["%x: f16[50]"], ["%y = softplus(%x, 3, 4)"], ["%y"], ["%x: uniform -4.0..4.0"])
    # gelu's approximate argument
    for layout in ("c", "t"):
        x = Operand("x", "f32", [3, 50], layout)
        p, l, a = assemble(x)
        add("gelu", f"tanh_{LAYOUT_NAMES[layout]}", p, l + [f'%y = gelu({x.ref}, "tanh")'], ["%y"], a)
    add("gelu", "none_explicit", ["%x: f32[783]"], ['%y = gelu(%x, "none")'], ["%y"])
    add("gelu_", "tanh_param", ["%x: f32[783]"], ['%y = gelu_(%x, "tanh")'], ["%x"])
    add("gelu_", "tanh_transposed_f16", ["%x: f16[3, 50]"],
        ["%t = t(%x)", '%y = gelu_(%t, "tanh")'], ["%x"])
    add("logical_not", "bool", ["%x: bool[783]"], ["%y = logical_not(%x)"], ["%y"])
    add("logical_not_", "bool_step_slice", ["%x: bool[50]"],
        ["%s = slice(%x, 0, 0, none, 2)", "%y = logical_not_(%s)"], ["%x"])
    add("logical_not", "u32_via_eq", ["%x: u32[50]"], ["%e = eq(%x, 3)", "%y = logical_not(%e)"], ["%y"])
    add("abs", "nan_inf", ["%x: f32[3]"],
        ["%z = zeros([3])", "%n = div(%z, %z)", "%i = reciprocal(%z)", "%ni = neg(%i)",
         "%a = abs(%n)", "%b = abs(%ni)", "%c = exp(%ni)", "%d = log(%z)", "%e = sqrt(%ni)",
         "%f = sigmoid(%ni)", "%g = tanh(%i)", "%h = erf(%ni)", "%k = relu(%n)"],
        ["%a", "%b", "%c", "%d", "%e", "%f", "%g", "%h", "%k"], None, "nan and inf inputs made in the program")


# ---------------------------------------------------------------------------
# Binary elementwise ops
# ---------------------------------------------------------------------------

BINARY = ["add", "sub", "mul", "div", "maximum", "minimum", "pow", "eq", "ne", "lt", "le", "gt", "ge"]
COMPARE = ["eq", "ne", "lt", "le", "gt", "ge"]
HAS_SCALAR = {"add", "sub", "mul", "div", "pow", "eq", "ne", "lt", "le", "gt", "ge"}
HAS_INPLACE = {"add", "sub", "mul", "div", "pow", "eq", "ne", "lt", "le", "gt", "ge"}


def _anns(op, a="%a", b="%b"):
    if op == "div":
        return [f"{b}: uniform 0.5..2.0"]
    if op == "pow":
        return [f"{a}: uniform 0.25..2.0"]
    return []


def gen_binary():
    for op in BINARY:
        div_ann = "uniform 0.5..2.0" if op == "div" else None
        base_ann = "uniform 0.25..2.0" if op == "pow" else None
        # tensor-tensor on layouts
        for (la, lb, sa, sb, nm) in (
            ("c", "c", [783], [783], "tt_783"),
            ("c", "c", [50, 1], [1, 50], "broadcast_col_row"),
            ("t", "s", [3, 50], [3, 50], "transposed_and_step_slice"),
            ("c", "e", [3, 50], [3, 50], "expanded_other"),
            ("c", "c", [1], [783], "size1_broadcast"),
            ("c", "c", [3, 1, 5], [4, 1], "broadcast_3d"),
        ):
            a = Operand("a", "f32", sa, la, base_ann)
            b = Operand("b", "f32", sb, lb, div_ann)
            p, l, an = assemble(a, b)
            add(op, nm, p, l + [f"%y = {op}({a.ref}, {b.ref})"], ["%y"], an)
        add(op, "both_0d", ["%a: f32[]", "%b: f32[]"], [f"%y = {op}(%a, %b)"], ["%y"], _anns(op))
        add(op, "tensor_and_0d", ["%a: f32[3, 50]", "%b: f32[]"], [f"%y = {op}(%a, %b)"], ["%y"], _anns(op))
        add(op, "f16_f16", ["%a: f16[50]", "%b: f16[50]"], [f"%y = {op}(%a, %b)"], ["%y"], _anns(op))
        add(op, "f16_and_f32_0d", ["%a: f16[50]", "%b: f32[]"], [f"%y = {op}(%a, %b)"], ["%y"], _anns(op),
            "a 0-d f32 does not promote an f16 tensor")
        add(op, "f16_and_f32_1d", ["%a: f16[50]", "%b: f32[50]"], [f"%y = {op}(%a, %b)"], ["%y"], _anns(op),
            "promotes to f32")
        if op == "pow":
            add(op, "i32_i32", ["%a: i32[50]", "%b: i32[50]"], [f"%y = {op}(%a, %b)"], ["%y"], ["%b: int 0..4"])
        elif op == "div":
            add(op, "i32_i32", ["%a: i32[50]", "%b: i32[50]"], [f"%y = {op}(%a, %b)"], ["%y"], ["%b: int 1..6"],
                "true division gives f32")
        else:
            add(op, "i32_i32", ["%a: i32[3, 50]", "%b: i32[50]"], [f"%y = {op}(%a, %b)"], ["%y"])
        add(op, "i32_and_f32", ["%a: i32[50]", "%b: f32[50]"], [f"%y = {op}(%a, %b)"], ["%y"],
            ["%b: uniform 0.5..2.0"] if op in ("div", "pow") else (["%a: int 0..6"] if op == "pow" else []),
            "promotes to f32")
        add(op, "i32_and_f32_0d", ["%a: i32[50]", "%b: f32[]"], [f"%y = {op}(%a, %b)"], ["%y"],
            ["%b: uniform 0.5..2.0"] + (["%a: int 0..6"] if op == "pow" else []) if op in ("div", "pow") else [],
            "a 0-d float tensor promotes an int tensor to f32")
        if op in HAS_SCALAR:
            add(op, "scalar_int", ["%a: f32[3, 50]"], [f"%y = {op}(%a, 2)"], ["%y"],
                ["%a: uniform 0.25..2.0"] if op == "pow" else None)
            add(op, "scalar_float", ["%a: f32[783]"], [f"%y = {op}(%a, -0.75)"], ["%y"],
                ["%a: uniform 0.25..2.0"] if op == "pow" else None)
            add(op, "i32_scalar_int", ["%a: i32[50]"], [f"%y = {op}(%a, 3)"], ["%y"],
                ["%a: int -3..4"] if op == "pow" else None, "stays i32" if op not in ("div",) else "true division: f32")
            add(op, "i32_scalar_float", ["%a: i32[50]"], [f"%y = {op}(%a, 1.5)"], ["%y"],
                ["%a: int 0..6"] if op == "pow" else None, "int tensor with a float scalar gives f32")
            add(op, "f16_scalar", ["%a: f16[50]"], [f"%y = {op}(%a, 0.5)"], ["%y"],
                ["%a: uniform 0.25..2.0"] if op == "pow" else None)
            add(op, "scalar_transposed", ["%a: f32[50, 3]"], ["%t = t(%a)", f"%y = {op}(%t, 2.5)"], ["%y"],
                ["%a: uniform 0.25..2.0"] if op == "pow" else None)
        if op in ("add", "mul", "eq", "ne", "maximum", "minimum", "lt", "le", "gt", "ge"):
            if op in ("add", "mul", "eq", "ne", "maximum", "minimum"):
                add(op, "bool_bool", ["%a: bool[50]", "%b: bool[50]"], [f"%y = {op}(%a, %b)"], ["%y"])
            add(op, "bool_and_i32", ["%a: bool[50]", "%b: i32[50]"], [f"%y = {op}(%a, %b)"], ["%y"], None,
                "bool promotes to i32")
        if op in ("mul", "maximum", "minimum", "eq", "ne"):
            add(op, "u32_u32", ["%a: u32[50]", "%b: u32[50]"], [f"%y = {op}(%a, %b)"], ["%y"])
        if op == "div":
            add(op, "u32_u32", ["%a: u32[50]", "%b: u32[50]"], ["%y = div(%a, %b)"], ["%y"], ["%b: int 1..11"],
                "true division: f32")
        if op in ("maximum", "minimum", "eq", "ne", "lt", "gt", "add", "mul"):
            add(op, "nan_inf", ["%a: f32[4]"],
                ["%z = zeros([4])", "%n = div(%z, %z)", "%inf = reciprocal(%z)", "%ninf = neg(%inf)",
                 "%n0 = select(%n, 0, 0)", "%c0 = select_scatter(%a, %n0, 0, 0)",  # a[0] = nan
                 f"%y1 = {op}(%c0, %a)", f"%y2 = {op}(%inf, %ninf)", f"%y3 = {op}(%n, %n)"],
                ["%y1", "%y2", "%y3"], None, "nan and inf operands made in the program")

    # alpha
    add("add", "alpha_int", ["%a: f32[3, 50]", "%b: f32[50]"], ["%y = add(%a, %b, 2)"], ["%y"])
    add("add", "alpha_float_transposed", ["%a: f32[50, 3]", "%b: f32[3, 50]"],
        ["%t = t(%a)", "%y = add(%t, %b, -0.5)"], ["%y"])
    add("add", "scalar_with_alpha", ["%a: f32[783]"], ["%y = add(%a, 3, 0.5)"], ["%y"])
    add("add", "i32_alpha", ["%a: i32[50]", "%b: i32[50]"], ["%y = add(%a, %b, 3)"], ["%y"])
    add("sub", "alpha_float", ["%a: f32[783]", "%b: f32[783]"], ["%y = sub(%a, %b, 1.5)"], ["%y"])
    add("sub", "scalar_with_alpha", ["%a: f32[3, 50]"], ["%y = sub(%a, 2.0, -2)"], ["%y"])
    add("add_", "alpha", ["%a: f32[3, 50]", "%b: f32[50]"], ["%y = add_(%a, %b, -2)"], ["%a"])
    add("sub_", "alpha_step_slice", ["%a: f32[50]", "%b: f32[25]"],
        ["%s = slice(%a, 0, 0, none, 2)", "%y = sub_(%s, %b, 0.25)"], ["%a"])
    # div rounding modes
    for mode in ("trunc", "floor"):
        add("div", f"{mode}_f32", ["%a: f32[783]", "%b: f32[783]"], [f'%y = div(%a, %b, "{mode}")'], ["%y"],
            ["%a: uniform -20.0..20.0", "%b: uniform 0.5..3.0"])
        add("div", f"{mode}_f32_negative_divisor", ["%a: f32[3, 50]", "%b: f32[50]"],
            [f'%y = div(%a, %b, "{mode}")'], ["%y"], ["%a: uniform -20.0..20.0", "%b: uniform -3.0..-0.5"])
        add("div", f"{mode}_i32", ["%a: i32[3, 50]", "%b: i32[3, 50]"], [f'%y = div(%a, %b, "{mode}")'], ["%y"],
            ["%a: int -30..30", "%b: int 1..7"], "stays i32")
        add("div", f"{mode}_i32_negative_divisor", ["%a: i32[50]", "%b: i32[50]"],
            [f'%y = div(%a, %b, "{mode}")'], ["%y"], ["%a: int -30..30", "%b: int -7..-1"])
        add("div", f"{mode}_scalar", ["%a: f32[50, 3]"], ["%t = t(%a)", f'%y = div(%t, 0.7, "{mode}")'], ["%y"],
            ["%a: uniform -5.0..5.0"])
        add("div", f"{mode}_i32_scalar", ["%a: i32[50]"], [f'%y = div(%a, -4, "{mode}")'], ["%y"],
            ["%a: int -30..30"])
        add("div_", f"{mode}_i32_param", ["%a: i32[50]", "%b: i32[50]"], [f'%y = div_(%a, %b, "{mode}")'],
            ["%a"], ["%a: int -30..30", "%b: int 1..7"], "rounded int division can stay in place in i32")
    add("div", "none_mode_explicit", ["%a: f32[783]", "%b: f32[783]"], ["%y = div(%a, %b, none)"], ["%y"],
        ["%b: uniform 0.5..2.0"])
    add("div", "i32_by_zero_float", ["%a: i32[5]"], ["%z = zeros([5])", "%y = div(%a, %z)"], ["%y"],
        ["%a: int -2..3"], "x/0 gives inf, -inf or nan")
    # pow overloads
    add("pow", "scalar_base", ["%e: f32[783]"], ["%y = pow(2.0, %e)"], ["%y"])
    add("pow", "scalar_int_base_f32_exp", ["%e: f32[3, 50]"], ["%t = t(%e)", "%y = pow(3, %t)"], ["%y"])
    add("pow", "scalar_int_base_i32_exp", ["%e: i32[50]"], ["%y = pow(2, %e)"], ["%y"], ["%e: int 0..10"])
    add("pow", "exp_0_5", ["%a: f32[783]"], ["%y = pow(%a, 0.5)"], ["%y"], ["%a: uniform 0.0..4.0"])
    add("pow", "exp_minus_1", ["%a: f32[50]"], ["%y = pow(%a, -1)"], ["%y"], ["%a: uniform 0.25..2.0"])
    add("pow", "exp_3_negative_base", ["%a: f32[50]"], ["%y = pow(%a, 3)"], ["%y"])
    add("pow", "exp_0", ["%a: f32[50]"], ["%y = pow(%a, 0)"], ["%y"])
    add("pow", "negative_base_fractional_exp", ["%a: f32[5]"], ["%y = pow(%a, 0.5)"], ["%y"],
        ["%a: uniform -2.0..-0.5"], "nan")
    add("pow", "tensor_exponent_broadcast", ["%a: f32[50, 1]", "%e: f32[3]"], ["%y = pow(%a, %e)"], ["%y"],
        ["%a: uniform 0.25..2.0"])
    add("pow_", "scalar_on_view", ["%a: f32[3, 50]"], ["%r = select(%a, 0, 1)", "%y = pow_(%r, 2)"], ["%a"])
    add("pow_", "tensor_exponent", ["%a: f32[783]", "%e: f32[783]"], ["%y = pow_(%a, %e)"], ["%a"],
        ["%a: uniform 0.25..2.0"])
    add("pow_", "i32_scalar", ["%a: i32[50]"], ["%y = pow_(%a, 2)"], ["%a"])
    # maximum / minimum mixed
    add("maximum", "i32_and_f32_transposed", ["%a: i32[3, 50]", "%b: f32[50, 3]"],
        ["%t = t(%b)", "%y = maximum(%a, %t)"], ["%y"])
    add("minimum", "f16_and_i32", ["%a: f16[50]", "%b: i32[50]"], ["%y = minimum(%a, %b)"], ["%y"])
    # in-place binary forms
    for op in sorted(HAS_INPLACE):
        ip = op + "_"
        an = ["%b: uniform 0.5..2.0"] if op == "div" else (["%a: uniform 0.25..2.0"] if op == "pow" else [])
        add(ip, "param_same_shape", ["%a: f32[783]", "%b: f32[783]"], [f"%y = {ip}(%a, %b)"], ["%a", "%y"], an)
        add(ip, "broadcast_other_into_transposed_view", ["%a: f32[3, 50]", "%b: f32[3]"],
            ["%c = clone(%a)", "%t = t(%c)", f"%y = {ip}(%t, %b)"], ["%c", "%t"],
            ["%b: uniform 0.5..2.0"] if op == "div" else (["%a: uniform 0.25..2.0"] if op == "pow" else []))
        add(ip, "scalar_on_step_slice", ["%a: f32[50, 3]"],
            ["%s = slice(%a, 0, 1, none, 4)", f"%y = {ip}(%s, 2)"], ["%a"],
            ["%a: uniform 0.25..2.0"] if op == "pow" else None)
        add(ip, "f32_self_i32_other", ["%a: f32[50]", "%b: i32[50]"], [f"%y = {ip}(%a, %b)"], ["%a"],
            ["%b: int 1..6"] if op == "div" else (["%a: uniform 0.25..2.0", "%b: int 0..4"] if op == "pow" else []),
            "result f32 fits self")
        add(ip, "f16_self_f32_other", ["%a: f16[50]", "%b: f32[50]"], [f"%y = {ip}(%a, %b)"], ["%a"],
            an, "computed in f32, stored as f16")
        if op not in ("div",):
            add(ip, "i32_self_i32_other", ["%a: i32[3, 50]", "%b: i32[50]"], [f"%y = {ip}(%a, %b)"], ["%a"],
                ["%b: int 0..4"] if op == "pow" else None)
        add(ip, "0d_self", ["%a: f32[]", "%b: f32[]"], [f"%y = {ip}(%a, %b)"], ["%a"], an)
        add(ip, "self_is_other", ["%a: f32[3, 5]"], ["%c = clone(%a)", f"%y = {ip}(%c, %c)"], ["%c"],
            ["%a: uniform 0.25..2.0"] if op in ("pow", "div") else None, "self aliases other exactly")
    for op in COMPARE:
        add(op + "_", "i32_self_scalar", ["%a: i32[50]"], [f"%y = {op}_(%a, 0)"], ["%a"], None,
            "i32 self: 1 / 0")


# ---------------------------------------------------------------------------
# where, clamp
# ---------------------------------------------------------------------------

def gen_where_clamp():
    add("where", "tensor_tensor", ["%c: bool[783]", "%a: f32[783]", "%b: f32[783]"],
        ["%y = where(%c, %a, %b)"], ["%y"])
    add("where", "broadcast_cond", ["%c: bool[50, 1]", "%a: f32[1, 50]", "%b: f32[50, 50]"],
        ["%y = where(%c, %a, %b)"], ["%y"])
    add("where", "transposed_cond_step_self", ["%c: bool[50, 3]", "%a: f32[3, 101]", "%b: f32[3, 1]"],
        ["%ct = t(%c)", "%as = slice(%a, 1, 1, none, 2)", "%y = where(%ct, %as, %b)"], ["%y"])
    add("where", "scalar_self", ["%c: bool[3, 50]", "%b: f32[3, 50]"], ["%y = where(%c, 0.5, %b)"], ["%y"])
    add("where", "scalar_other", ["%c: bool[3, 50]", "%a: f32[3, 50]"], ["%y = where(%c, %a, -inf)"], ["%y"])
    add("where", "scalar_scalar_float", ["%c: bool[783]"], ["%y = where(%c, 1.0, -1.0)"], ["%y"])
    add("where", "scalar_scalar_int", ["%c: bool[50]"], ["%y = where(%c, 3, -2)"], ["%y"],
        None, "int64 in eager, written as i32")
    add("where", "i32_and_f32", ["%c: bool[50]", "%a: i32[50]", "%b: f32[50]"], ["%y = where(%c, %a, %b)"], ["%y"])
    add("where", "i32_i32", ["%c: bool[50]", "%a: i32[50]", "%b: i32[50]"], ["%y = where(%c, %a, %b)"], ["%y"])
    add("where", "i32_self_float_scalar", ["%c: bool[50]", "%a: i32[50]"], ["%y = where(%c, %a, 0.5)"], ["%y"])
    add("where", "f16", ["%c: bool[50]", "%a: f16[50]", "%b: f16[50]"], ["%y = where(%c, %a, %b)"], ["%y"])
    add("where", "0d_cond", ["%c: bool[]", "%a: f32[3, 50]", "%b: f32[3, 50]"], ["%y = where(%c, %a, %b)"], ["%y"])
    add("where", "cond_from_compare_expanded", ["%x: f32[50]", "%a: f32[1, 50]"],
        ["%c = gt(%x, 0.0)", "%ae = expand(%a, [3, 50])", "%y = where(%c, %ae, 0.0)"], ["%y"])
    add("where", "u32", ["%c: bool[50]", "%a: u32[50]", "%b: u32[50]"], ["%y = where(%c, %a, %b)"], ["%y"])
    add("where", "bool_values", ["%c: bool[50]", "%a: bool[50]", "%b: bool[50]"], ["%y = where(%c, %a, %b)"], ["%y"])

    add("clamp", "min_max_float", ["%x: f32[783]"], ["%y = clamp(%x, -0.5, 0.75)"], ["%y"])
    add("clamp", "min_only", ["%x: f32[3, 50]"], ["%t = t(%x)", "%y = clamp(%t, 0.0)"], ["%y"])
    add("clamp", "max_only_none_min", ["%x: f32[3, 101]"],
        ["%s = slice(%x, 1, 1, none, 2)", "%y = clamp(%s, none, 1.0)"], ["%y"])
    add("clamp", "min_greater_than_max", ["%x: f32[50]"], ["%y = clamp(%x, 1.0, -1.0)"], ["%y"],
        None, "everything becomes max")
    add("clamp", "tensor_bounds", ["%x: f32[3, 50]", "%lo: f32[50]", "%hi: f32[3, 1]"],
        ["%y = clamp(%x, %lo, %hi)"], ["%y"], ["%lo: uniform -2.0..0.0", "%hi: uniform 0.0..2.0"])
    add("clamp", "tensor_min_none_max", ["%x: f32[783]", "%lo: f32[783]"], ["%y = clamp(%x, %lo, none)"], ["%y"])
    add("clamp", "tensor_none_min_max", ["%x: f32[50]", "%hi: f32[]"], ["%y = clamp(%x, none, %hi)"], ["%y"])
    add("clamp", "i32_int_bounds", ["%x: i32[50]"], ["%y = clamp(%x, -2, 3)"], ["%y"], None, "stays i32")
    add("clamp", "i32_float_bound", ["%x: i32[50]"], ["%y = clamp(%x, 0.5, 3)"], ["%y"], None, "f32 result")
    add("clamp", "f16", ["%x: f16[50]"], ["%y = clamp(%x, -1, 1)"], ["%y"])
    add("clamp", "nan_input", ["%x: f32[4]"],
        ["%z = zeros([4])", "%n = div(%z, %z)", "%a = add(%x, %n)", "%y = clamp(%a, -1.0, 1.0)"], ["%y"],
        None, "nan stays nan")
    add("clamp", "0d", ["%x: f32[]"], ["%y = clamp(%x, -1.0, 1.0)"], ["%y"])
    add("clamp", "u32", ["%x: u32[50]"], ["%y = clamp(%x, 2, 7)"], ["%y"])
    add("clamp_", "param", ["%x: f32[783]"], ["%y = clamp_(%x, -1.0, 1.0)"], ["%x"])
    add("clamp_", "transposed_view", ["%x: f32[3, 50]"], ["%t = t(%x)", "%y = clamp_(%t, none, 0.0)"], ["%x"])
    add("clamp_", "tensor_bounds_on_row", ["%x: f32[3, 50]", "%lo: f32[50]"],
        ["%c = clone(%x)", "%r = select(%c, 0, -1)", "%y = clamp_(%r, %lo)"], ["%c"])
    add("clamp_", "i32", ["%x: i32[50]"], ["%y = clamp_(%x, 0, 2)"], ["%x"])


# ---------------------------------------------------------------------------
# Views and their _copy forms
# ---------------------------------------------------------------------------

VIEW_CASES = [
    # (op, case, param decls, view call (result %v), writable)
    ("view", "1d_to_2d", ["%x: f32[783]"], "view(%x, [27, 29])", True),
    ("view", "flatten_minus1", ["%x: f32[3, 50]"], "view(%x, [-1])", True),
    ("view", "split_dim", ["%x: f32[6, 4]"], "view(%x, [2, 3, 4])", True),
    ("view", "0d_to_1", ["%x: f32[]"], "view(%x, [1])", True),
    ("view", "size1_to_0d", ["%x: f32[1]"], "view(%x, [])", True),
    ("view", "of_row_slice", ["%x: f32[6, 10]"], "view(%s, [2, 2, 10])", True, ["%s = slice(%x, 0, 1, 5)"]),
    ("view", "merge_inner_of_transposed", ["%x: f32[2, 3, 4]"], "view(%p, [4, 6])", True,
     ["%p = permute(%x, [2, 0, 1])"]),
    ("reshape", "contiguous_is_view", ["%x: f32[783]"], "reshape(%x, [3, -1])", True),
    ("reshape", "transposed_is_copy", ["%x: f32[3, 50]"], "reshape(%t, [150])", True, ["%t = t(%x)"]),
    ("reshape", "step_slice_is_copy", ["%x: f32[3, 101]"], "reshape(%s, [5, 30])", True,
     ["%s = slice(%x, 1, 1, none, 2)"]),
    ("reshape", "0d", ["%x: f32[]"], "reshape(%x, [1, 1])", True),
    ("reshape", "expanded_is_copy", ["%x: f32[1, 50]"], "reshape(%e, [150])", True, ["%e = expand(%x, [3, 50])"]),
    ("slice", "dim0_step2", ["%x: f32[50, 3]"], "slice(%x, 0, 0, none, 2)", True),
    ("slice", "negative_dim_none_start", ["%x: f32[3, 50]"], "slice(%x, -1, none, 20)", True),
    ("slice", "negative_start_end", ["%x: f32[783]"], "slice(%x, 0, -100, -3, 7)", True),
    ("slice", "end_past_size", ["%x: f32[50]"], "slice(%x, 0, 10, 1000)", True),
    ("slice", "default_args", ["%x: f32[3, 50]"], "slice(%x)", True),
    ("slice", "step_larger_than_size", ["%x: f32[3, 50]"], "slice(%x, 1, 3, none, 60)", True),
    ("slice", "of_transposed", ["%x: f32[3, 50]"], "slice(%t, 0, 5, 45, 5)", True, ["%t = t(%x)"]),
    ("slice", "empty", ["%x: f32[50]"], "slice(%x, 0, 30, 10)", True),
    ("select", "dim0", ["%x: f32[3, 50]"], "select(%x, 0, 1)", True),
    ("select", "negative_dim_index", ["%x: f32[3, 50]"], "select(%x, -1, -1)", True),
    ("select", "to_0d", ["%x: f32[783]"], "select(%x, 0, 782)", True),
    ("select", "middle_of_3d", ["%x: f32[2, 5, 3]"], "select(%x, 1, 3)", True),
    ("transpose", "2d", ["%x: f32[3, 50]"], "transpose(%x, 0, 1)", True),
    ("transpose", "negative_dims_3d", ["%x: f32[2, 3, 4]"], "transpose(%x, -1, -3)", True),
    ("transpose", "same_dim", ["%x: f32[3, 50]"], "transpose(%x, 1, 1)", True),
    ("t", "2d", ["%x: f32[3, 50]"], "t(%x)", True),
    ("t", "1d", ["%x: f32[783]"], "t(%x)", True),
    ("t", "0d", ["%x: f32[]"], "t(%x)", True),
    ("permute", "3d", ["%x: f32[2, 3, 4]"], "permute(%x, [2, 0, 1])", True),
    ("permute", "negative_dims", ["%x: f32[2, 3, 4]"], "permute(%x, [-1, 0, -2])", True),
    ("permute", "identity", ["%x: f32[3, 50]"], "permute(%x, [0, 1])", True),
    ("expand", "row_to_matrix", ["%x: f32[1, 50]"], "expand(%x, [3, 50])", False),
    ("expand", "new_leading_dims", ["%x: f32[50]"], "expand(%x, [2, 3, 50])", False),
    ("expand", "minus1_keeps_dim", ["%x: f32[3, 1]"], "expand(%x, [-1, 50])", False),
    ("expand", "0d", ["%x: f32[]"], "expand(%x, [783])", False),
    ("expand", "of_transposed", ["%x: f32[1, 3]"], "expand(%t, [3, 4])", False, ["%t = t(%x)"]),
    ("expand", "same_shape", ["%x: f32[3, 50]"], "expand(%x, [3, 50])", True),
    ("diagonal", "square", ["%x: f32[50, 50]"], "diagonal(%x)", True),
    ("diagonal", "positive_offset", ["%x: f32[3, 50]"], "diagonal(%x, 2)", True),
    ("diagonal", "negative_offset", ["%x: f32[50, 3]"], "diagonal(%x, -10)", True),
    ("diagonal", "3d_dims", ["%x: f32[2, 3, 4]"], "diagonal(%x, 1, 2, 0)", True),
    ("diagonal", "negative_dims", ["%x: f32[4, 2, 4]"], "diagonal(%x, 0, -1, -3)", True),
    ("diagonal", "of_transposed", ["%x: f32[3, 5]"], "diagonal(%t, 1)", True, ["%t = t(%x)"]),
    ("diagonal", "offset_out_of_range_empty", ["%x: f32[3, 3]"], "diagonal(%x, 5)", True),
    ("as_strided", "window_2d", ["%x: f32[783]"], "as_strided(%x, [10, 20], [30, 1], 7)", True),
    ("as_strided", "no_offset", ["%x: f32[3, 50]"], "as_strided(%x, [50, 3], [1, 50])", True),
    ("as_strided", "overlapping_read", ["%x: f32[50]"], "as_strided(%x, [10, 5], [4, 1], 0)", False),
    ("as_strided", "stride0_read", ["%x: f32[50]"], "as_strided(%x, [3, 5], [0, 1], 2)", False),
    ("as_strided", "of_slice_absolute_offset", ["%x: f32[6, 5]"], "as_strided(%s, [2, 3], [5, 1], 11)", True,
     ["%s = slice(%x, 0, 2, none)"]),
    ("as_strided", "of_transposed", ["%x: f32[3, 50]"], "as_strided(%t, [3, 4], [1, 3], 0)", True, ["%t = t(%x)"]),
    ("unsqueeze", "dim0", ["%x: f32[783]"], "unsqueeze(%x, 0)", True),
    ("unsqueeze", "negative_dim", ["%x: f32[3, 50]"], "unsqueeze(%x, -1)", True),
    ("unsqueeze", "middle", ["%x: f32[3, 50]"], "unsqueeze(%x, 1)", True),
    ("unsqueeze", "0d", ["%x: f32[]"], "unsqueeze(%x, 0)", True),
    ("squeeze", "all", ["%x: f32[1, 3, 1, 50]"], "squeeze(%x)", True),
    ("squeeze", "dim", ["%x: f32[3, 1, 50]"], "squeeze(%x, 1)", True),
    ("squeeze", "dim_not_size1", ["%x: f32[3, 50]"], "squeeze(%x, 0)", True),
    ("squeeze", "dims_list_negative", ["%x: f32[1, 3, 1, 50, 1]"], "squeeze(%x, [0, -1])", True),
    ("squeeze", "size1_to_0d", ["%x: f32[1]"], "squeeze(%x)", True),
    ("alias", "2d", ["%x: f32[3, 50]"], "alias(%x)", True),
    ("alias", "of_transposed", ["%x: f32[3, 50]"], "alias(%t)", True, ["%t = t(%x)"]),
    ("narrow", "dim0", ["%x: f32[50, 3]"], "narrow(%x, 0, 10, 20)", True),
    ("narrow", "negative_dim_start", ["%x: f32[3, 50]"], "narrow(%x, -1, -5, 5)", True),
    ("narrow", "length0", ["%x: f32[783]"], "narrow(%x, 0, 100, 0)", True),
    ("unfold", "size_eq_step", ["%x: f32[783]"], "unfold(%x, 0, 27, 27)", True),
    ("unfold", "overlapping", ["%x: f32[50]"], "unfold(%x, 0, 5, 2)", False),
    ("unfold", "gaps", ["%x: f32[50]"], "unfold(%x, 0, 3, 7)", True),
    ("unfold", "last_dim_2d", ["%x: f32[3, 50]"], "unfold(%x, -1, 10, 10)", True),
    ("unfold", "size1", ["%x: f32[3, 5]"], "unfold(%x, 0, 1, 1)", True),
    ("unfold", "0d", ["%x: f32[]"], "unfold(%x, 0, 1, 1)", True),
]

MULTI_VIEW_CASES = [
    # (op, case, params, call, number of results)
    ("split", "uneven", ["%x: f32[50, 3]"], "split(%x, 16)", 4),
    ("split", "sizes_last_dim", ["%x: f32[3, 50]"], "split(%x, [10, 15, 25], -1)", 3),
    ("split", "larger_than_dim", ["%x: f32[3, 50]"], "split(%x, 7)", 1),
    ("split", "of_transposed", ["%x: f32[3, 50]"], "split(%t, 1, 1)", 3, ["%t = t(%x)"]),
    ("chunk", "uneven", ["%x: f32[783]"], "chunk(%x, 4)", 4),
    ("chunk", "more_chunks_than_size", ["%x: f32[5, 3]"], "chunk(%x, 4)", 3),
    ("chunk", "last_dim", ["%x: f32[3, 50]"], "chunk(%x, 2, -1)", 2),
    ("chunk", "empty_dim", ["%x: f32[0, 3]"], "chunk(%x, 3)", 3),
    ("split_with_sizes", "last_dim", ["%x: f32[3, 50]"], "split_with_sizes(%x, [10, 15, 25], -1)", 3),
    ("split_with_sizes", "with_empty", ["%x: f32[7, 2]"], "split_with_sizes(%x, [3, 0, 4])", 3),
    ("unbind", "dim0", ["%x: f32[3, 50]"], "unbind(%x)", 3),
    ("unbind", "negative_dim", ["%x: f32[50, 3]"], "unbind(%x, -1)", 3),
    ("unbind", "of_transposed", ["%x: f32[2, 3]"], "unbind(%t, 0)", 3, ["%t = t(%x)"]),
    ("unbind", "size1", ["%x: f32[1, 783]"], "unbind(%x, 0)", 1),
]


# ATen has no `reshape_copy` or `chunk_copy` (a functional program spells
# them `view_copy` / `split_copy`), and the list form of `split` copies as
# `split_with_sizes_copy`.
NO_ATEN_COPY = {"reshape", "chunk"}


def copy_form(op: str, call: str) -> tuple[str, str]:
    cop = "split_with_sizes_copy" if op == "split" and "[" in call else op + "_copy"
    return cop, cop + call[len(op):]


def gen_views():
    for c in VIEW_CASES:
        op, case, params, call, writable = c[:5]
        pre = c[5] if len(c) > 5 else []
        # read
        add(op, case, params, pre + [f"%v = {call}"], ["%v"])
        # the _copy form with the same args
        if op not in NO_ATEN_COPY:
            cop, ccall = copy_form(op, call)
            add(cop, case, params, pre + [f"%v = {ccall}", "%z = zero_(%x)"], ["%v", "%x"],
                None, "the copy does not see the later write to %x")
        # write through the view into a parameter
        if writable:
            add(op, case + "__write_through", params,
                pre + [f"%v = {call}", "%w = add_(%v, 1.0)"], ["%x", "%v"], None, "mutates %x through the view")
        else:
            add(op, case + "__fill_through", params,
                pre + [f"%v = {call}", "%w = fill_(%v, 2.0)"], ["%x", "%v"], None,
                "fill_ may write through overlapping views (it is idempotent)")
    for c in MULTI_VIEW_CASES:
        op, case, params, call, n = c[:5]
        pre = c[5] if len(c) > 5 else []
        names = [f"%p{i}" for i in range(n)]
        add(op, case, params, pre + [f"{', '.join(names)} = {call}"], names)
        if op not in NO_ATEN_COPY:
            cop, ccall = copy_form(op, call)
            add(cop, case, params, pre + [f"{', '.join(names)} = {ccall}", "%z = zero_(%x)"],
                names + ["%x"], None, "the copies do not see the later write to %x")
        body = pre + [f"{', '.join(names)} = {call}"]
        for i, nm in enumerate(names):
            body.append(f"%w{i} = mul_({nm}, {i + 2}.0)")
        add(op, case + "__write_pieces", params, body, ["%x"] + names, None, "every piece mutated")
    # a few non-f32 views
    add("view", "i32", ["%x: i32[3, 50]"], ["%v = view(%x, [50, 3])"], ["%v"])
    add("transpose", "u32_write_through", ["%x: u32[3, 50]"],
        ["%t = transpose(%x, 0, 1)", "%r = select(%t, 0, 0)", "%f = fill_(%r, 9)"], ["%x", "%t"])
    add("select", "bool", ["%x: bool[3, 50]"], ["%v = select(%x, 0, 2)"], ["%v"])
    add("slice", "f16_write_through", ["%x: f16[50]"], ["%s = slice(%x, 0, 3, none, 3)", "%w = mul_(%s, 2.0)"],
        ["%x"])
    add("view", "chain_write_through", ["%x: f32[4, 6]"],
        ["%a = view(%x, [2, 12])", "%b = slice(%a, 1, 2, 10, 2)", "%c = t(%b)", "%d = unsqueeze(%c, 0)",
         "%e = select(%d, 2, 1)", "%w = fill_(%e, -1.0)"], ["%x", "%d"])
    add("expand", "of_0d_select_read_after_write", ["%x: f32[5]"],
        ["%s = select(%x, 0, 2)", "%e = expand(%s, [2, 3])", "%w = add_(%s, 10.0)"], ["%e", "%x"],
        None, "the expand sees the later write")


# ---------------------------------------------------------------------------
# Scatters
# ---------------------------------------------------------------------------

def gen_scatters():
    add("slice_scatter", "dim0_step", ["%x: f32[50, 3]", "%s: f32[17, 3]"], ["%y = slice_scatter(%x, %s, 0, 0, none, 3)"], ["%y", "%x"])
    add("slice_scatter", "negative_dim_none_end", ["%x: f32[3, 50]", "%s: f32[3, 10]"],
        ["%y = slice_scatter(%x, %s, -1, 40)"], ["%y"])
    add("slice_scatter", "negative_start", ["%x: f32[783]", "%s: f32[10]"], ["%y = slice_scatter(%x, %s, 0, -10)"], ["%y"])
    add("slice_scatter", "default_args_full_replace", ["%x: f32[3, 50]", "%s: f32[3, 50]"],
        ["%y = slice_scatter(%x, %s)"], ["%y"])
    add("slice_scatter", "transposed_base_and_src", ["%x: f32[3, 50]", "%s: f32[3, 10]"],
        ["%t = t(%x)", "%st = t(%s)", "%y = slice_scatter(%t, %st, 0, 5, 25, 2)"], ["%y"])
    add("slice_scatter", "i32", ["%x: i32[50]", "%s: i32[5]"], ["%y = slice_scatter(%x, %s, 0, 1, 50, 10)"], ["%y"])
    add("slice_scatter", "f16_end_past_size", ["%x: f16[50]", "%s: f16[10]"], ["%y = slice_scatter(%x, %s, 0, 40, 99)"], ["%y"])
    add("slice_scatter", "empty_src", ["%x: f32[50]"],
        ["%e = slice(%x, 0, 10, 10)", "%y = slice_scatter(%x, %e, 0, 10, 10)"], ["%y"])
    add("select_scatter", "row", ["%x: f32[3, 50]", "%s: f32[50]"], ["%y = select_scatter(%x, %s, 0, 1)"], ["%y", "%x"])
    add("select_scatter", "negative_dim_index", ["%x: f32[3, 50]", "%s: f32[3]"], ["%y = select_scatter(%x, %s, -1, -1)"], ["%y"])
    add("select_scatter", "0d_src", ["%x: f32[783]", "%s: f32[]"], ["%y = select_scatter(%x, %s, 0, 500)"], ["%y"])
    add("select_scatter", "3d_middle_transposed_src", ["%x: f32[2, 5, 3]", "%s: f32[3, 2]"],
        ["%st = t(%s)", "%y = select_scatter(%x, %st, 1, 4)"], ["%y"])
    add("select_scatter", "bool", ["%x: bool[3, 50]", "%s: bool[50]"], ["%y = select_scatter(%x, %s, 0, 0)"], ["%y"])
    add("diagonal_scatter", "square", ["%x: f32[50, 50]", "%s: f32[50]"], ["%y = diagonal_scatter(%x, %s)"], ["%y", "%x"])
    add("diagonal_scatter", "positive_offset", ["%x: f32[3, 50]", "%s: f32[3]"], ["%y = diagonal_scatter(%x, %s, 7)"], ["%y"])
    add("diagonal_scatter", "negative_offset", ["%x: f32[50, 3]", "%s: f32[3]"], ["%y = diagonal_scatter(%x, %s, -20)"], ["%y"])
    add("diagonal_scatter", "3d_dims", ["%x: f32[2, 3, 4]", "%s: f32[3, 2]"], ["%y = diagonal_scatter(%x, %s, 0, 0, 2)"], ["%y"])
    add("diagonal_scatter", "negative_dims_transposed_base", ["%x: f32[4, 5]", "%s: f32[4]"],
        ["%t = t(%x)", "%y = diagonal_scatter(%t, %s, 0, -1, -2)"], ["%y"])
    add("as_strided_scatter", "window", ["%x: f32[783]", "%s: f32[10, 20]"],
        ["%y = as_strided_scatter(%x, %s, [10, 20], [30, 1], 7)"], ["%y", "%x"])
    add("as_strided_scatter", "transposed_layout", ["%x: f32[3, 50]", "%s: f32[50, 3]"],
        ["%y = as_strided_scatter(%x, %s, [50, 3], [1, 50], 0)"], ["%y"])
    add("as_strided_scatter", "no_offset", ["%x: f32[6, 5]", "%s: f32[5]"],
        ["%y = as_strided_scatter(%x, %s, [5], [6])"], ["%y"])
    add("as_strided_scatter", "i32", ["%x: i32[4, 4]", "%s: i32[2, 2]"],
        ["%y = as_strided_scatter(%x, %s, [2, 2], [4, 1], 10)"], ["%y"])
    add("as_strided_scatter", "on_slice_absolute_offset", ["%x: f32[6, 5]", "%s: f32[3]"],
        ["%v = slice(%x, 0, 2, none)", "%y = as_strided_scatter(%v, %s, [3], [1], 11)",
         "%z = as_strided_scatter(%v, %s, [3], [1], 1)"], ["%y", "%z"],
        None, "size/stride/offset address %x's storage, as as_strided does: offset 11 is %v[0, 1];"
        " offset 1 lies outside %v, so %z equals %v")
    add("as_strided_scatter", "interleaved", ["%x: f32[10]", "%s: f32[2, 2]"],
        ["%y = as_strided_scatter(%x, %s, [2, 2], [3, 2], 0)"], ["%y"],
        None, "positions 0, 2, 3, 5: no stride spans the other's, so no closed-form inverse"
        " (a copy, then the writes)")
    add("as_strided_scatter", "nested_unit_dims", ["%x: f32[5, 8]", "%s: f32[2, 1, 3]"],
        ["%y = as_strided_scatter(%x, %s, [2, 1, 3], [17, 5, 2], 3)", "%z = mul(%y, 2.0)"],
        ["%z"])
    add("as_strided_scatter", "on_transposed_base", ["%x: f32[3, 4]", "%s: f32[2]"],
        ["%t = t(%x)", "%y = as_strided_scatter(%t, %s, [2], [1], 0)"], ["%y"],
        None, "the result keeps %t's layout: storage elements 0 and 1 are %t[0, 0] and %t[1, 0]")


# ---------------------------------------------------------------------------
# Mutation ops and their functional forms
# ---------------------------------------------------------------------------

def gen_mutations():
    for fn, ip in (("copy", "copy_"),):
        add(ip, "same_shape_param", ["%x: f32[783]", "%s: f32[783]"], [f"%y = {ip}(%x, %s)"], ["%x", "%y"])
        add(ip, "broadcast_src", ["%x: f32[3, 50]", "%s: f32[50]"], [f"%y = {ip}(%x, %s)"], ["%x"])
        add(ip, "0d_src_into_step_slice", ["%x: f32[50]", "%s: f32[]"],
            ["%v = slice(%x, 0, 1, none, 3)", f"%y = {ip}(%v, %s)"], ["%x"])
        add(ip, "transposed_src", ["%x: f32[3, 50]", "%s: f32[50, 3]"], ["%st = t(%s)", f"%y = {ip}(%x, %st)"], ["%x"])
        add(ip, "into_transposed_view", ["%x: f32[3, 50]", "%s: f32[50, 3]"], ["%t = t(%x)", f"%y = {ip}(%t, %s)"], ["%x"])
        add(ip, "f32_to_i32_truncates", ["%x: i32[50]", "%s: f32[50]"], [f"%y = {ip}(%x, %s)"], ["%x"],
            ["%s: uniform -20.0..20.0"], "float -> int conversion rounds toward zero")
        add(ip, "i32_to_f32", ["%x: f32[50]", "%s: i32[50]"], [f"%y = {ip}(%x, %s)"], ["%x"])
        add(ip, "bool_to_f32", ["%x: f32[50]", "%s: bool[50]"], [f"%y = {ip}(%x, %s)"], ["%x"])
        add(ip, "f32_to_bool", ["%x: bool[5]", "%s: f32[5]"], ["%z = zeros([3])",
            "%b = slice_scatter(%s, %z, 0, 0, 5, 2)", f"%y = {ip}(%x, %b)"], ["%x"], None, "nonzero -> true")
        add(ip, "f32_to_f16", ["%x: f16[50]", "%s: f32[50]"], [f"%y = {ip}(%x, %s)"], ["%x"])
        add(ip, "u32_from_i32", ["%x: u32[50]", "%s: i32[50]"], [f"%y = {ip}(%x, %s)"], ["%x"], ["%s: int 0..100"])
        add(ip, "row_to_row_same_base", ["%x: f32[3, 50]"],
            ["%r0 = select(%x, 0, 0)", "%r2 = select(%x, 0, 2)", f"%y = {ip}(%r2, %r0)"], ["%x"])
        add(ip, "self_copy", ["%x: f32[3, 50]"], [f"%y = {ip}(%x, %x)"], ["%x"])
        add(fn, "same_shape", ["%x: f32[783]", "%s: f32[783]"], [f"%y = {fn}(%x, %s)"], ["%y", "%x"])
        add(fn, "broadcast_src_transposed_self", ["%x: f32[3, 50]", "%s: f32[3]"],
            ["%t = t(%x)", f"%y = {fn}(%t, %s)"], ["%y", "%x"])
        add(fn, "dtype_of_self", ["%x: i32[50]", "%s: f32[50]"], [f"%y = {fn}(%x, %s)"], ["%y"],
            ["%s: uniform -9.0..9.0"], "the result has self's dtype")
        add(fn, "0d", ["%x: f32[]", "%s: f32[]"], [f"%y = {fn}(%x, %s)"], ["%y"])
        add(fn, "non_blocking_arg", ["%x: f32[3, 50]", "%s: f32[50]"], [f"%y = {fn}(%x, %s, false)"], ["%y"])

    add("fill_", "float_param", ["%x: f32[783]"], ["%y = fill_(%x, 1.25)"], ["%x", "%y"])
    add("fill_", "int_into_i32", ["%x: i32[3, 50]"], ["%y = fill_(%x, -7)"], ["%x"])
    add("fill_", "float_into_i32_truncates", ["%x: i32[50]"], ["%y = fill_(%x, 2.75)"], ["%x"])
    add("fill_", "0d_tensor_value", ["%x: f32[3, 50]", "%v: f32[]"], ["%y = fill_(%x, %v)"], ["%x"])
    add("fill_", "through_expand", ["%x: f32[50]"], ["%e = expand(%x, [3, 50])", "%y = fill_(%e, -2.0)"], ["%x", "%e"])
    add("fill_", "step_slice_of_transposed", ["%x: f32[3, 50]"],
        ["%t = t(%x)", "%s = slice(%t, 0, 0, none, 7)", "%y = fill_(%s, 0.5)"], ["%x"])
    add("fill_", "bool_true", ["%x: bool[50]"], ["%s = slice(%x, 0, 25)", "%y = fill_(%s, true)"], ["%x"])
    add("fill_", "f16_inf", ["%x: f16[50]"], ["%s = slice(%x, 0, 0, 10)", "%y = fill_(%s, -inf)"], ["%x"])
    add("fill_", "u32", ["%x: u32[50]"], ["%y = fill_(%x, 4)"], ["%x"])
    add("fill_", "0d", ["%x: f32[]"], ["%y = fill_(%x, 3)"], ["%x"])
    add("fill_", "overlapping_unfold", ["%x: f32[50]"], ["%u = unfold(%x, 0, 5, 2)", "%r = select(%u, 0, 3)", "%y = fill_(%u, 0.0)", "%z = fill_(%r, 1.0)"], ["%x"])
    add("fill", "scalar", ["%x: f32[3, 50]"], ["%y = fill(%x, 1.5)"], ["%y", "%x"])
    add("fill", "0d_tensor_value_transposed", ["%x: f32[3, 50]", "%v: f32[]"], ["%t = t(%x)", "%y = fill(%t, %v)"], ["%y"])
    add("fill", "i32_float_value", ["%x: i32[50]"], ["%y = fill(%x, -3.5)"], ["%y"])
    add("fill", "of_expanded", ["%x: f32[1, 50]"], ["%e = expand(%x, [3, 50])", "%y = fill(%e, 2.0)"], ["%y"])

    add("zero_", "param", ["%x: f32[783]"], ["%y = zero_(%x)"], ["%x", "%y"])
    add("zero_", "column_view", ["%x: f32[3, 50]"], ["%c = select(%x, 1, 7)", "%y = zero_(%c)"], ["%x"])
    add("zero_", "through_expand", ["%x: f32[1, 50]"], ["%e = expand(%x, [3, 50])", "%y = zero_(%e)"], ["%x"])
    add("zero_", "i32_step_slice", ["%x: i32[50]"], ["%s = slice(%x, 0, 2, none, 5)", "%y = zero_(%s)"], ["%x"])
    add("zero_", "bool", ["%x: bool[50]"], ["%y = zero_(%x)"], ["%x"])
    add("zero_", "f16_diagonal", ["%x: f16[5, 5]"], ["%d = diagonal(%x)", "%y = zero_(%d)"], ["%x"])
    add("zero", "f32", ["%x: f32[3, 50]"], ["%y = zero(%x)"], ["%y", "%x"])
    add("zero", "transposed_i32", ["%x: i32[3, 50]"], ["%t = t(%x)", "%y = zero(%t)"], ["%y"])
    add("zero", "0d", ["%x: f32[]"], ["%y = zero(%x)"], ["%y"])

    add("masked_fill_", "scalar", ["%x: f32[783]", "%m: bool[783]"], ["%y = masked_fill_(%x, %m, 0.5)"], ["%x"])
    add("masked_fill_", "broadcast_mask", ["%x: f32[3, 50]", "%m: bool[50]"], ["%y = masked_fill_(%x, %m, -1.0)"], ["%x"])
    add("masked_fill_", "0d_tensor_value", ["%x: f32[3, 50]", "%m: bool[3, 50]", "%v: f32[]"],
        ["%y = masked_fill_(%x, %m, %v)"], ["%x"])
    add("masked_fill_", "transposed_mask_into_view", ["%x: f32[3, 50]", "%m: bool[3, 50]"],
        ["%t = t(%x)", "%mt = t(%m)", "%y = masked_fill_(%t, %mt, -inf)"], ["%x"])
    add("masked_fill_", "i32_self", ["%x: i32[50]", "%m: bool[50]"], ["%y = masked_fill_(%x, %m, 9)"], ["%x"])
    add("masked_fill_", "f16_step_slice", ["%x: f16[50]", "%m: bool[25]"],
        ["%s = slice(%x, 0, 0, none, 2)", "%y = masked_fill_(%s, %m, 100.0)"], ["%x"])
    add("masked_fill_", "mask_from_compare", ["%x: f32[3, 50]"], ["%m = lt(%x, 0.0)", "%y = masked_fill_(%x, %m, 0.0)"], ["%x"])
    add("masked_fill_", "bool_self", ["%x: bool[50]", "%m: bool[50]"], ["%y = masked_fill_(%x, %m, false)"], ["%x"])
    add("masked_fill", "scalar", ["%x: f32[3, 50]", "%m: bool[3, 50]"], ["%y = masked_fill(%x, %m, 3.0)"], ["%y", "%x"])
    add("masked_fill", "broadcast_mask_expanded_self", ["%x: f32[1, 50]", "%m: bool[3, 1]"],
        ["%e = expand(%x, [3, 50])", "%y = masked_fill(%e, %m, -inf)"], ["%y"])
    add("masked_fill", "0d_tensor_value_i32", ["%x: i32[50]", "%m: bool[50]", "%v: i32[]"],
        ["%y = masked_fill(%x, %m, %v)"], ["%y"])
    add("masked_fill", "int_value_f32_self", ["%x: f32[783]", "%m: bool[783]"], ["%y = masked_fill(%x, %m, 7)"], ["%y"])

    add("index_put_", "rows", ["%x: f32[10, 5]", "%i: i32[3]", "%v: f32[3, 5]"],
        ["%y = index_put_(%x, [%i], %v)"], ["%x"], ["%i: perm 0..10"])
    add("index_put_", "accumulate_duplicates", ["%x: f32[10]", "%i: i32[50]", "%v: f32[50]"],
        ["%y = index_put_(%x, [%i], %v, true)"], ["%x"], ["%i: int 0..10"])
    add("index_put_", "two_index_tensors", ["%x: f32[6, 7]", "%i: i32[4]", "%j: i32[4]", "%v: f32[4]"],
        ["%y = index_put_(%x, [%i, %j], %v)"], ["%x"], ["%i: perm 0..6", "%j: perm 0..7"])
    add("index_put_", "broadcast_index_tensors", ["%x: f32[6, 7]", "%i: i32[3, 1]", "%j: i32[2]", "%v: f32[3, 2]"],
        ["%y = index_put_(%x, [%i, %j], %v)"], ["%x"], ["%i: perm 0..6", "%j: perm 0..7"])
    add("index_put_", "none_first", ["%x: f32[5, 8]", "%j: i32[3]", "%v: f32[5, 3]"],
        ["%y = index_put_(%x, [none, %j], %v)"], ["%x"], ["%j: perm 0..8"])
    add("index_put_", "none_trailing", ["%x: f32[8, 5]", "%i: i32[3]", "%v: f32[5]"],
        ["%y = index_put_(%x, [%i, none], %v)"], ["%x"], ["%i: perm 0..8"], "values broadcast over the rows")
    add("index_put_", "negative_indices", ["%x: f32[10]", "%i: i32[4]", "%v: f32[4]"],
        ["%y = index_put_(%x, [%i], %v)"], ["%x"], ["%i: perm -10..0"])
    add("index_put_", "bool_mask_index", ["%x: f32[3, 50]", "%m: bool[3, 50]", "%v: f32[]"],
        ["%y = index_put_(%x, [%m], %v)"], ["%x"])
    add("index_put_", "0d_values_broadcast", ["%x: f32[10, 3]", "%i: i32[4]", "%v: f32[]"],
        ["%y = index_put_(%x, [%i], %v, true)"], ["%x"], ["%i: int 0..10"])
    add("index_put_", "into_transposed_view", ["%x: f32[3, 10]", "%i: i32[2]", "%v: f32[2, 3]"],
        ["%t = t(%x)", "%y = index_put_(%t, [%i], %v)"], ["%x"], ["%i: perm 0..10"])
    add("index_put_", "i32_self_accumulate", ["%x: i32[10]", "%i: i32[20]", "%v: i32[20]"],
        ["%y = index_put_(%x, [%i], %v, true)"], ["%x"], ["%i: int 0..10"])
    add("index_put_", "f16_self", ["%x: f16[10, 2]", "%i: i32[3]", "%v: f16[3, 2]"],
        ["%y = index_put_(%x, [%i], %v)"], ["%x"], ["%i: perm 0..10"])
    add("index_put_", "index_from_arange", ["%x: f32[10]", "%v: f32[5]"],
        ["%i = arange(0, 10, 2)", "%y = index_put_(%x, [%i], %v)"], ["%x"], None, "an int64 index tensor")
    add("index_put", "rows", ["%x: f32[10, 5]", "%i: i32[3]", "%v: f32[3, 5]"],
        ["%y = index_put(%x, [%i], %v)"], ["%y", "%x"], ["%i: perm 0..10"])
    add("index_put", "accumulate", ["%x: f32[783]", "%i: i32[100]", "%v: f32[100]"],
        ["%y = index_put(%x, [%i], %v, true)"], ["%y"], ["%i: int 0..783"])
    add("index_put", "none_middle_3d", ["%x: f32[3, 4, 5]", "%i: i32[2]", "%k: i32[2]", "%v: f32[2, 4]"],
        ["%y = index_put(%x, [%i, none, %k], %v)"], ["%y"], ["%i: perm 0..3", "%k: perm 0..5"],
        "advanced indices separated by a slice: the indexed dim goes first")
    add("index_put", "transposed_self", ["%x: f32[5, 6]", "%i: i32[3]", "%v: f32[5]"],
        ["%t = t(%x)", "%y = index_put(%t, [%i], %v)"], ["%y"], ["%i: perm 0..6"])


# ---------------------------------------------------------------------------
# Factories and copies
# ---------------------------------------------------------------------------

def gen_factories():
    add("zeros", "f32_default", [], ["%y = zeros([3, 50])"], ["%y"])
    add("zeros", "dtypes", [], ["%a = zeros([783], f16)", "%b = zeros([1], i32)", "%c = zeros([3, 5], bool)", "%d = zeros([], f32)", "%e = zeros([2], u32)"],
        ["%a", "%b", "%c", "%d", "%e"])
    add("zeros", "then_written", ["%x: f32[50]"], ["%z = zeros([3, 50])", "%r = select(%z, 0, 1)", "%c = copy_(%r, %x)"], ["%z"])
    add("ones", "f32", [], ["%y = ones([783])"], ["%y"])
    add("ones", "dtypes", [], ["%a = ones([3, 50], f16)", "%b = ones([5], i32)", "%c = ones([2, 2], bool)", "%d = ones([], f32)", "%e = ones([3], u32)"],
        ["%a", "%b", "%c", "%d", "%e"])
    add("ones", "used_with_param", ["%x: f32[3, 50]"], ["%o = ones([50])", "%y = add(%x, %o)"], ["%y"])
    add("full", "float", [], ["%y = full([3, 50], 1.5)"], ["%y"])
    add("full", "int_infers_int64", [], ["%y = full([50], 7)"], ["%y"], None, "int64 in eager, written as i32")
    add("full", "bool_infers_bool", [], ["%y = full([5], true)"], ["%y"])
    add("full", "dtype_args", [], ["%a = full([2, 3], 1.5, i32)", "%b = full([783], -2, f32)", "%c = full([4], 0.1, f16)", "%d = full([], 3.0)", "%e = full([3], 1, bool)"],
        ["%a", "%b", "%c", "%d", "%e"])
    add("full", "inf_nan", [], ["%a = full([3], inf)", "%b = full([3], -inf)", "%c = full([3], nan)"], ["%a", "%b", "%c"])
    add("arange", "end_only", [], ["%y = arange(50)"], ["%y"], None, "int64 in eager, written as i32")
    add("arange", "start_end", [], ["%y = arange(-5, 778)"], ["%y"])
    add("arange", "float_step", [], ["%y = arange(0.0, 1.0, 0.125)"], ["%y"])
    add("arange", "negative_step", [], ["%y = arange(10, -10, -3)"], ["%y"])
    add("arange", "float_end", [], ["%y = arange(5.5)"], ["%y"])
    add("arange", "dtype_f32", [], ["%y = arange(0, 50, 1, f32)"], ["%y"])
    add("arange", "dtype_i32", [], ["%y = arange(3, 30, 4, i32)"], ["%y"])
    add("arange", "dtype_f16", [], ["%y = arange(0, 8, 1, f16)"], ["%y"])
    add("arange", "end_dtype", [], ["%y = arange(6, f32)"], ["%y"])
    add("arange", "start_end_dtype_kwarg_order", [], ["%y = arange(2, 9, 1, i32)"], ["%y"])
    add("arange", "reshaped_and_used", ["%x: f32[3, 4]"], ["%a = arange(0, 12, 1, f32)", "%v = view(%a, [3, 4])", "%y = mul(%x, %v)"], ["%y"])
    for fn in ("zeros_like", "ones_like"):
        add(fn, "f32", ["%x: f32[3, 50]"], [f"%y = {fn}(%x)"], ["%y"])
        add(fn, "transposed", ["%x: f32[3, 50]"], ["%t = t(%x)", f"%y = {fn}(%t)"], ["%y"])
        add(fn, "i32", ["%x: i32[783]"], [f"%y = {fn}(%x)"], ["%y"])
        add(fn, "dtype_arg", ["%x: f32[50]"], [f"%y = {fn}(%x, i32)"], ["%y"])
        add(fn, "bool_0d", ["%x: bool[]"], [f"%y = {fn}(%x)"], ["%y"])
        add(fn, "expanded", ["%x: f32[1, 50]"], ["%e = expand(%x, [3, 50])", f"%y = {fn}(%e)", "%w = add_(%y, 1.0)"], ["%y"])
    add("full_like", "float", ["%x: f32[3, 50]"], ["%y = full_like(%x, 2.5)"], ["%y"])
    add("full_like", "int_into_f32_keeps_f32", ["%x: f32[50]"], ["%y = full_like(%x, 3)"], ["%y"])
    add("full_like", "dtype_arg", ["%x: f32[50]"], ["%y = full_like(%x, 3, i32)"], ["%y"])
    add("full_like", "float_into_i32_truncates", ["%x: i32[50]"], ["%y = full_like(%x, 2.9)"], ["%y"])
    add("full_like", "f16_inf_step_slice", ["%x: f16[101]"], ["%s = slice(%x, 0, 1, none, 2)", "%y = full_like(%s, -inf)"], ["%y"])
    add("full_like", "bool", ["%x: bool[5]"], ["%y = full_like(%x, true)"], ["%y"])
    add("clone", "contiguous", ["%x: f32[783]"], ["%y = clone(%x)", "%w = add_(%y, 1.0)"], ["%y", "%x"], None, "the clone is independent")
    add("clone", "transposed", ["%x: f32[3, 50]"], ["%t = t(%x)", "%y = clone(%t)"], ["%y"])
    add("clone", "expanded", ["%x: f32[50]"], ["%e = expand(%x, [3, 50])", "%y = clone(%e)", "%w = add_(%y, %x)"], ["%y"])
    add("clone", "step_slice_i32", ["%x: i32[101]"], ["%s = slice(%x, 0, 1, none, 2)", "%y = clone(%s)"], ["%y"])
    add("clone", "u32_bool_f16", ["%a: u32[3]", "%b: bool[3]", "%c: f16[3]"], ["%x = clone(%a)", "%y = clone(%b)", "%z = clone(%c)"], ["%x", "%y", "%z"])
    add("clone", "0d", ["%x: f32[]"], ["%y = clone(%x)"], ["%y"])
    add("contiguous", "already", ["%x: f32[783]"], ["%y = contiguous(%x)", "%w = add_(%y, 1.0)"], ["%x"], None, "returns self: the write reaches %x")
    add("contiguous", "transposed_is_copy", ["%x: f32[3, 50]"], ["%t = t(%x)", "%y = contiguous(%t)", "%w = add_(%y, 1.0)"], ["%x", "%y"])
    add("contiguous", "step_slice", ["%x: f32[3, 101]"], ["%s = slice(%x, 1, 1, none, 2)", "%y = contiguous(%s)"], ["%y"])
    add("contiguous", "expanded", ["%x: f32[3, 1]"], ["%e = expand(%x, [3, 50])", "%y = contiguous(%e)"], ["%y"])
    add("contiguous", "narrow_rows_is_view", ["%x: f32[6, 5]"], ["%n = narrow(%x, 0, 2, 3)", "%y = contiguous(%n)", "%w = mul_(%y, 0.0)"], ["%x"],
        None, "a row block is already contiguous: the write reaches %x")


# ---------------------------------------------------------------------------
# Reductions
# ---------------------------------------------------------------------------

def gen_reductions():
    add("sum", "all_783", ["%x: f32[783]"], ["%y = sum(%x)"], ["%y"])
    add("sum", "dim_list", ["%x: f32[3, 50]"], ["%y = sum(%x, [1])"], ["%y"])
    add("sum", "single_int_dim_negative", ["%x: f32[3, 50]"], ["%y = sum(%x, -2)"], ["%y"])
    add("sum", "keepdim", ["%x: f32[2, 3, 50]"], ["%y = sum(%x, [0, 2], true)"], ["%y"])
    add("sum", "empty_dim_list_all", ["%x: f32[3, 50]"], ["%y = sum(%x, [])"], ["%y"])
    add("sum", "none_dim", ["%x: f32[3, 50]"], ["%y = sum(%x, none, true)"], ["%y"])
    add("sum", "transposed", ["%x: f32[3, 50]"], ["%t = t(%x)", "%y = sum(%t, [1])"], ["%y"])
    add("sum", "step_slice", ["%x: f32[3, 101]"], ["%s = slice(%x, 1, 1, none, 2)", "%y = sum(%s, [-1], true)"], ["%y"])
    add("sum", "expanded", ["%x: f32[1, 50]"], ["%e = expand(%x, [3, 50])", "%y = sum(%e, [0])"], ["%y"])
    add("sum", "i32_gives_int64", ["%x: i32[3, 50]"], ["%y = sum(%x, [1])"], ["%y"], None, "int64 in eager, written as i32")
    add("sum", "i32_dtype_i32", ["%x: i32[783]"], ["%y = sum(%x, [0], false, i32)"], ["%y"])
    add("sum", "i32_dtype_f32_no_dim", ["%x: i32[50]"], ["%y = sum(%x, f32)"], ["%y"])
    add("sum", "bool_counts", ["%x: bool[3, 50]"], ["%y = sum(%x, [1])"], ["%y"])
    add("sum", "f16", ["%x: f16[50]"], ["%y = sum(%x)"], ["%y"])
    add("sum", "f16_dtype_f32", ["%x: f16[3, 50]"], ["%y = sum(%x, [1], false, f32)"], ["%y"])
    add("sum", "0d", ["%x: f32[]"], ["%y = sum(%x)"], ["%y"])
    add("sum", "size1_dim", ["%x: f32[1, 783]"], ["%y = sum(%x, [0])"], ["%y"])
    add("sum", "u32", ["%x: u32[50]"], ["%y = sum(%x)"], ["%y"], None, "int64 in eager, written as i32")
    add("mean", "all", ["%x: f32[783]"], ["%y = mean(%x)"], ["%y"])
    add("mean", "dims_keepdim", ["%x: f32[2, 3, 50]"], ["%y = mean(%x, [-1, 0], true)"], ["%y"])
    add("mean", "transposed", ["%x: f32[3, 50]"], ["%t = t(%x)", "%y = mean(%t, [0])"], ["%y"])
    add("mean", "i32_with_dtype", ["%x: i32[3, 50]"], ["%y = mean(%x, [1], false, f32)"], ["%y"])
    add("mean", "f16", ["%x: f16[3, 50]"], ["%y = mean(%x, [1])"], ["%y"])
    add("mean", "f16_dtype_f32_no_dim", ["%x: f16[50]"], ["%y = mean(%x, f32)"], ["%y"])
    add("mean", "0d", ["%x: f32[]"], ["%y = mean(%x)"], ["%y"])
    add("mean", "single_int_dim", ["%x: f32[50, 3]"], ["%y = mean(%x, 1)"], ["%y"])
    for op in ("amax", "amin"):
        add(op, "all_default", ["%x: f32[783]"], [f"%y = {op}(%x)"], ["%y"])
        add(op, "dim_list", ["%x: f32[3, 50]"], [f"%y = {op}(%x, [1])"], ["%y"])
        add(op, "keepdim_negative", ["%x: f32[2, 3, 50]"], [f"%y = {op}(%x, [-1, -3], true)"], ["%y"])
        add(op, "empty_list_all", ["%x: f32[3, 50]"], [f"%y = {op}(%x, [])"], ["%y"])
        add(op, "transposed", ["%x: f32[3, 50]"], ["%t = t(%x)", f"%y = {op}(%t, [1])"], ["%y"])
        add(op, "i32", ["%x: i32[3, 50]"], [f"%y = {op}(%x, [0])"], ["%y"])
        add(op, "f16", ["%x: f16[50]"], [f"%y = {op}(%x, [0], true)"], ["%y"])
        add(op, "bool", ["%x: bool[3, 5]"], [f"%y = {op}(%x, [1])"], ["%y"])
        add(op, "nan_propagates", ["%x: f32[3, 4]"],
            ["%z = zeros([4])", "%n = div(%z, %z)", "%r = select_scatter(%x, %n, 0, 1)", f"%y = {op}(%r, [1])"], ["%y"])
        add(op, "0d", ["%x: f32[]"], [f"%y = {op}(%x)"], ["%y"])
        add(op, "single_int_dim", ["%x: f32[50, 3]"], [f"%y = {op}(%x, 0)"], ["%y"])
    for op in ("softmax", "log_softmax"):
        add(op, "last_dim", ["%x: f32[3, 50]"], [f"%y = {op}(%x, -1)"], ["%y"])
        add(op, "dim0_783", ["%x: f32[783]"], [f"%y = {op}(%x, 0)"], ["%y"])
        add(op, "transposed", ["%x: f32[3, 50]"], ["%t = t(%x)", f"%y = {op}(%t, 1)"], ["%y"])
        add(op, "middle_dim_3d", ["%x: f32[2, 50, 3]"], [f"%y = {op}(%x, 1)"], ["%y"])
        add(op, "large_values", ["%x: f32[3, 50]"], ["%s = mul(%x, 50.0)", f"%y = {op}(%s, 1)"], ["%y"], None, "needs the max subtraction")
        add(op, "masked_minus_inf", ["%x: f32[3, 50]", "%m: bool[3, 50]"], ["%a = masked_fill(%x, %m, -inf)", f"%y = {op}(%a, -1)"], ["%y"],
            ["%m: bool 0.3"])
        add(op, "f16", ["%x: f16[3, 50]"], [f"%y = {op}(%x, 1)"], ["%y"])
        add(op, "f16_dtype_f32", ["%x: f16[3, 50]"], [f"%y = {op}(%x, 1, f32)"], ["%y"])
        add(op, "i32_dtype_f32", ["%x: i32[50]"], [f"%y = {op}(%x, 0, f32)"], ["%y"])
        add(op, "size1_dim", ["%x: f32[50, 1]"], [f"%y = {op}(%x, 1)"], ["%y"])
        add(op, "0d", ["%x: f32[]"], [f"%y = {op}(%x, 0)"], ["%y"])
        add(op, "step_slice", ["%x: f32[3, 101]"], ["%s = slice(%x, 1, 1, none, 2)", f"%y = {op}(%s, 1)"], ["%y"])
        uop = "_" + op
        add(uop, "last_dim", ["%x: f32[3, 50]"], [f"%y = {uop}(%x, -1, false)"], ["%y"])
        add(uop, "dim0_783", ["%x: f32[783]"], [f"%y = {uop}(%x, 0, false)"], ["%y"])
        add(uop, "transposed", ["%x: f32[3, 50]"], ["%t = t(%x)", f"%y = {uop}(%t, 0, false)"], ["%y"])
        add(uop, "f16", ["%x: f16[3, 50]"], [f"%y = {uop}(%x, 1, false)"], ["%y"])
        add(uop, "3d_negative_dim", ["%x: f32[2, 3, 50]"], [f"%y = {uop}(%x, -2, false)"], ["%y"])


# ---------------------------------------------------------------------------
# Linear algebra and layers
# ---------------------------------------------------------------------------

def gen_linalg():
    add("mm", "3x50_50x1", ["%a: f32[3, 50]", "%b: f32[50, 1]"], ["%y = mm(%a, %b)"], ["%y"])
    add("mm", "1x783_783x1", ["%a: f32[1, 783]", "%b: f32[783, 1]"], ["%y = mm(%a, %b)"], ["%y"])
    add("mm", "transposed_operands", ["%a: f32[50, 3]", "%b: f32[7, 50]"], ["%at = t(%a)", "%bt = t(%b)", "%y = mm(%at, %bt)"], ["%y"])
    add("mm", "step_slice_operand", ["%a: f32[3, 101]", "%b: f32[50, 4]"], ["%s = slice(%a, 1, 1, none, 2)", "%y = mm(%s, %b)"], ["%y"])
    add("mm", "expanded_operand", ["%a: f32[1, 50]", "%b: f32[50, 3]"], ["%e = expand(%a, [4, 50])", "%y = mm(%e, %b)"], ["%y"])
    add("mm", "50x50", ["%a: f32[50, 50]", "%b: f32[50, 50]"], ["%y = mm(%a, %b)"], ["%y"])
    add("mm", "f16", ["%a: f16[3, 50]", "%b: f16[50, 5]"], ["%y = mm(%a, %b)"], ["%y"])
    add("mm", "i32", ["%a: i32[3, 5]", "%b: i32[5, 4]"], ["%y = mm(%a, %b)"], ["%y"])
    add("mm", "inner_dim_1", ["%a: f32[50, 1]", "%b: f32[1, 50]"], ["%y = mm(%a, %b)"], ["%y"])
    add("bmm", "basic", ["%a: f32[2, 3, 50]", "%b: f32[2, 50, 5]"], ["%y = bmm(%a, %b)"], ["%y"])
    add("bmm", "transposed_batches", ["%a: f32[3, 2, 4]", "%b: f32[2, 5, 4]"],
        ["%at = transpose(%a, 0, 1)", "%bt = transpose(%b, 1, 2)", "%y = bmm(%at, %bt)"], ["%y"])
    add("bmm", "batch1", ["%a: f32[1, 7, 3]", "%b: f32[1, 3, 7]"], ["%y = bmm(%a, %b)"], ["%y"])
    add("bmm", "expanded_batch", ["%a: f32[4, 3, 5]", "%b: f32[5, 2]"], ["%u = unsqueeze(%b, 0)", "%e = expand(%u, [4, 5, 2])", "%y = bmm(%a, %e)"], ["%y"])
    add("bmm", "f16", ["%a: f16[2, 3, 4]", "%b: f16[2, 4, 3]"], ["%y = bmm(%a, %b)"], ["%y"])
    add("matmul", "1d_1d", ["%a: f32[783]", "%b: f32[783]"], ["%y = matmul(%a, %b)"], ["%y"], None, "a 0-d dot product")
    add("matmul", "1d_2d", ["%a: f32[50]", "%b: f32[50, 3]"], ["%y = matmul(%a, %b)"], ["%y"])
    add("matmul", "2d_1d", ["%a: f32[3, 50]", "%b: f32[50]"], ["%y = matmul(%a, %b)"], ["%y"])
    add("matmul", "2d_2d_transposed", ["%a: f32[50, 3]", "%b: f32[50, 4]"], ["%at = t(%a)", "%y = matmul(%at, %b)"], ["%y"])
    add("matmul", "3d_2d", ["%a: f32[2, 3, 50]", "%b: f32[50, 4]"], ["%y = matmul(%a, %b)"], ["%y"])
    add("matmul", "2d_3d", ["%a: f32[3, 5]", "%b: f32[2, 5, 4]"], ["%y = matmul(%a, %b)"], ["%y"])
    add("matmul", "batch_broadcast", ["%a: f32[2, 1, 3, 4]", "%b: f32[5, 4, 2]"], ["%y = matmul(%a, %b)"], ["%y"])
    add("matmul", "1d_3d", ["%a: f32[5]", "%b: f32[2, 5, 3]"], ["%y = matmul(%a, %b)"], ["%y"])
    add("matmul", "3d_1d", ["%a: f32[2, 3, 5]", "%b: f32[5]"], ["%y = matmul(%a, %b)"], ["%y"])
    add("matmul", "4d_4d_permuted", ["%a: f32[2, 4, 3, 5]", "%b: f32[2, 3, 5, 4]"],
        ["%ap = permute(%a, [0, 2, 1, 3])", "%y = matmul(%ap, %b)"], ["%y"])
    add("matmul", "f16", ["%a: f16[3, 8]", "%b: f16[8]"], ["%y = matmul(%a, %b)"], ["%y"])
    add("addmm", "default_beta_alpha", ["%c: f32[3, 5]", "%a: f32[3, 50]", "%b: f32[50, 5]"], ["%y = addmm(%c, %a, %b)"], ["%y"])
    add("addmm", "bias_row_broadcast", ["%c: f32[5]", "%a: f32[3, 50]", "%b: f32[50, 5]"], ["%y = addmm(%c, %a, %b)"], ["%y"])
    add("addmm", "bias_column_broadcast", ["%c: f32[3, 1]", "%a: f32[3, 50]", "%b: f32[50, 5]"], ["%y = addmm(%c, %a, %b)"], ["%y"])
    add("addmm", "beta_alpha", ["%c: f32[3, 5]", "%a: f32[3, 50]", "%b: f32[50, 5]"], ["%y = addmm(%c, %a, %b, 0.5, -2.0)"], ["%y"])
    add("addmm", "int_beta_alpha", ["%c: f32[5]", "%a: f32[3, 4]", "%b: f32[4, 5]"], ["%y = addmm(%c, %a, %b, 2, 3)"], ["%y"])
    add("addmm", "beta0_ignores_nan_bias", ["%a: f32[3, 4]", "%b: f32[4, 5]"],
        ["%z = zeros([5])", "%c = div(%z, %z)", "%y = addmm(%c, %a, %b, 0)"], ["%y"], None, "beta = 0: the nan bias is not read")
    add("addmm", "transposed_operands", ["%c: f32[5, 3]", "%a: f32[50, 3]", "%b: f32[5, 50]"],
        ["%ct = t(%c)", "%at = t(%a)", "%bt = t(%b)", "%y = addmm(%ct, %at, %bt)"], ["%y"])
    add("addmm", "f16", ["%c: f16[4]", "%a: f16[3, 8]", "%b: f16[8, 4]"], ["%y = addmm(%c, %a, %b)"], ["%y"])
    add("linear", "with_bias", ["%x: f32[3, 50]", "%w: f32[5, 50]", "%b: f32[5]"], ["%y = linear(%x, %w, %b)"], ["%y"])
    add("linear", "no_bias", ["%x: f32[3, 50]", "%w: f32[5, 50]"], ["%y = linear(%x, %w)"], ["%y"])
    add("linear", "none_bias", ["%x: f32[3, 50]", "%w: f32[5, 50]"], ["%y = linear(%x, %w, none)"], ["%y"])
    add("linear", "3d_input", ["%x: f32[2, 3, 8]", "%w: f32[4, 8]", "%b: f32[4]"], ["%y = linear(%x, %w, %b)"], ["%y"])
    add("linear", "1d_input", ["%x: f32[50]", "%w: f32[3, 50]", "%b: f32[3]"], ["%y = linear(%x, %w, %b)"], ["%y"])
    add("linear", "transposed_input_and_weight", ["%x: f32[50, 3]", "%w: f32[50, 5]", "%b: f32[5]"],
        ["%xt = t(%x)", "%wt = t(%w)", "%y = linear(%xt, %wt, %b)"], ["%y"])
    add("linear", "f16", ["%x: f16[3, 8]", "%w: f16[4, 8]", "%b: f16[4]"], ["%y = linear(%x, %w, %b)"], ["%y"])
    add("linear", "0d_bias", ["%x: f32[3, 8]", "%w: f32[4, 8]", "%b: f32[]"], ["%y = linear(%x, %w, %b)"], ["%y"])
    add("layer_norm", "weight_bias", ["%x: f32[3, 50]", "%w: f32[50]", "%b: f32[50]"], ["%y = layer_norm(%x, [50], %w, %b)"], ["%y"])
    add("layer_norm", "no_weight", ["%x: f32[3, 50]"], ["%y = layer_norm(%x, [50])"], ["%y"])
    add("layer_norm", "none_weight_bias_eps", ["%x: f32[783]"], ["%y = layer_norm(%x, [783], none, none, 0.001)"], ["%y"])
    add("layer_norm", "weight_only", ["%x: f32[3, 50]", "%w: f32[50]"], ["%y = layer_norm(%x, [50], %w)"], ["%y"])
    add("layer_norm", "bias_only", ["%x: f32[3, 50]", "%b: f32[50]"], ["%y = layer_norm(%x, [50], none, %b)"], ["%y"])
    add("layer_norm", "two_dims", ["%x: f32[2, 3, 50]", "%w: f32[3, 50]", "%b: f32[3, 50]"], ["%y = layer_norm(%x, [3, 50], %w, %b, 1e-5)"], ["%y"])
    add("layer_norm", "transposed_input", ["%x: f32[50, 3]", "%w: f32[50]"], ["%t = t(%x)", "%y = layer_norm(%t, [50], %w)"], ["%y"])
    add("layer_norm", "constant_rows", ["%x: f32[3, 1]"], ["%e = expand(%x, [3, 50])", "%y = layer_norm(%e, [50])"], ["%y"], None,
        "zero variance: the output is 0")
    add("layer_norm", "f16", ["%x: f16[3, 50]", "%w: f16[50]", "%b: f16[50]"], ["%y = layer_norm(%x, [50], %w, %b)"], ["%y"])
    add("layer_norm", "size1", ["%x: f32[3, 1]"], ["%y = layer_norm(%x, [1])"], ["%y"])
    add("layer_norm", "cudnn_enable_arg", ["%x: f32[3, 8]"], ["%y = layer_norm(%x, [8], none, none, 1e-5, false)"], ["%y"])
    add("embedding", "1d_ids", ["%w: f32[50, 3]", "%i: i32[20]"], ["%y = embedding(%w, %i)"], ["%y"], ["%i: int 0..50"])
    add("embedding", "2d_ids", ["%w: f32[10, 8]", "%i: i32[3, 4]"], ["%y = embedding(%w, %i)"], ["%y"], ["%i: int 0..10"])
    add("embedding", "0d_id", ["%w: f32[10, 8]", "%i: i32[]"], ["%y = embedding(%w, %i)"], ["%y"], ["%i: int 0..10"])
    add("embedding", "padding_idx_forward_unchanged", ["%w: f32[10, 4]", "%i: i32[6]"], ["%y = embedding(%w, %i, 0)"], ["%y"], ["%i: int 0..3"])
    add("embedding", "transposed_table", ["%w: f32[4, 10]", "%i: i32[5]"], ["%wt = t(%w)", "%y = embedding(%wt, %i)"], ["%y"], ["%i: int 0..10"])
    add("embedding", "ids_from_arange", ["%w: f32[10, 4]"], ["%i = arange(9, -1, -3)", "%y = embedding(%w, %i)"], ["%y"])
    add("embedding", "f16_table", ["%w: f16[10, 4]", "%i: i32[5]"], ["%y = embedding(%w, %i)"], ["%y"], ["%i: int 0..10"])
    add("embedding", "i32_table", ["%w: i32[10, 4]", "%i: i32[5]"], ["%y = embedding(%w, %i)"], ["%y"], ["%i: int 0..10"])
    add("index_select", "dim0", ["%x: f32[50, 3]", "%i: i32[7]"], ["%y = index_select(%x, 0, %i)"], ["%y"], ["%i: int 0..50"])
    add("index_select", "negative_dim", ["%x: f32[3, 50]", "%i: i32[10]"], ["%y = index_select(%x, -1, %i)"], ["%y"], ["%i: int 0..50"])
    add("index_select", "repeats_783", ["%x: f32[783]", "%i: i32[100]"], ["%y = index_select(%x, 0, %i)"], ["%y"], ["%i: int 0..783"])
    add("index_select", "0d_index", ["%x: f32[5, 3]", "%i: i32[]"], ["%y = index_select(%x, 0, %i)"], ["%y"], ["%i: int 0..5"])
    add("index_select", "transposed_input", ["%x: f32[3, 50]", "%i: i32[4]"], ["%t = t(%x)", "%y = index_select(%t, 1, %i)"], ["%y"], ["%i: int 0..3"])
    add("index_select", "middle_dim_3d", ["%x: f32[2, 5, 3]", "%i: i32[2]"], ["%y = index_select(%x, 1, %i)"], ["%y"], ["%i: int 0..5"])
    add("index_select", "i32_values", ["%x: i32[10]", "%i: i32[4]"], ["%y = index_select(%x, 0, %i)"], ["%y"], ["%i: int 0..10"])
    add("index_select", "f16_values", ["%x: f16[10, 2]", "%i: i32[4]"], ["%y = index_select(%x, 0, %i)"], ["%y"], ["%i: int 0..10"])
    add("index_select", "bool_values", ["%x: bool[10]", "%i: i32[4]"], ["%y = index_select(%x, 0, %i)"], ["%y"], ["%i: int 0..10"])
    add("index_select", "index_from_arange", ["%x: f32[10, 3]"], ["%i = arange(0, 10, 3)", "%y = index_select(%x, 0, %i)"], ["%y"])


def gen_backward_ops():
    """The backward ops transforms emit: (grad, x) elementwise."""
    ops = {
        "threshold_backward": ", 0.25",
        "gelu_backward": "",
        "silu_backward": "",
        "sigmoid_backward": "",
        "tanh_backward": "",
    }
    for op, extra in ops.items():
        add(op, "f32", ["%g: f32[783]", "%x: f32[783]"], [f"%y = {op}(%g, %x{extra})"], ["%y"])
        # (PyTorch's CPU gelu_backward fails on broadcast operands.)
        x = "%x: f32[3, 50]" if op == "gelu_backward" else "%x: f32[3, 1]"
        add(op, "transposed_broadcast", ["%g: f32[50, 3]", x],
            ["%t = t(%g)", f"%y = {op}(%t, %x{extra})"], ["%y"])
        add(op, "f16", ["%g: f16[50]", "%x: f16[50]"], [f"%y = {op}(%g, %x{extra})"], ["%y"])
    add("gelu_backward", "tanh", ["%g: f32[3, 50]", "%x: f32[3, 50]"], ['%y = gelu_backward(%g, %x, "tanh")'], ["%y"])
    add("threshold_backward", "at_threshold", ["%g: f32[4]"],
        ["%x = arange(-1.0, 1.0, 0.5)", "%y = threshold_backward(%g, %x, 0)"], ["%y"], None,
        "x equal to the threshold gives 0")


def generate():
    gen_backward_ops()
    gen_unary()
    gen_binary()
    gen_where_clamp()
    gen_views()
    gen_scatters()
    gen_mutations()
    gen_factories()
    gen_reductions()
    gen_linalg()
    gen_decoder_ops()
    gen_composites()
    gen_int8()
    gen_core()
    return CASES


# ---------------------------------------------------------------------------
# Ops a decoder block needs: logical and/or, remainder, floor_divide, tril,
# triu, cat, stack, _to_copy
# ---------------------------------------------------------------------------


def gen_decoder_ops():
    for op in ("logical_and", "logical_or"):
        add(op, "f32_f32", ["%a: f32[783]", "%b: f32[783]"], [f"%y = {op}(%a, %b)"], ["%y"],
            ["%a: int -1..2", "%b: int -1..2"], "nonzero is true")
        add(op, "bool_broadcast", ["%a: bool[50, 1]", "%b: bool[1, 50]"], [f"%y = {op}(%a, %b)"], ["%y"])
        add(op, "i32_transposed", ["%a: i32[50, 3]", "%b: i32[3, 50]"],
            ["%t = t(%a)", f"%y = {op}(%t, %b)"], ["%y"], ["%a: int 0..2", "%b: int 0..2"])
        add(op + "_", "bool_in_place", ["%a: bool[50]", "%b: bool[50]"],
            ["%c = clone(%a)", f"%y = {op}_(%c, %b)"], ["%c"])
    for op in ("remainder", "floor_divide"):
        add(op, "f32_f32", ["%a: f32[783]", "%b: f32[783]"], [f"%y = {op}(%a, %b)"], ["%y"],
            ["%a: uniform -5.0..5.0", "%b: uniform 0.5..2.0"])
        add(op, "negative_divisor_broadcast", ["%a: f32[3, 50]", "%b: f32[50]"],
            ["%n = neg(%b)", f"%y = {op}(%a, %n)"], ["%y"], ["%a: uniform -5.0..5.0", "%b: uniform 0.5..2.0"])
        add(op, "i32_scalar", ["%a: i32[50]"], [f"%y = {op}(%a, 3)"], ["%y"], ["%a: int -9..9"])
        add(op, "i32_i32", ["%a: i32[3, 50]", "%b: i32[50]"], ["%n = neg(%b)", f"%y = {op}(%a, %n)"], ["%y"],
            ["%a: int -9..9", "%b: int 1..4"])
        add(op, "f32_scalar_transposed", ["%a: f32[50, 3]"], ["%t = t(%a)", f"%y = {op}(%t, 0.75)"], ["%y"],
            ["%a: uniform -5.0..5.0"])
        add(op + "_", "param", ["%a: f32[783]"], [f"%y = {op}_(%a, 1.5)"], ["%a"], ["%a: uniform -5.0..5.0"])
    for op in ("tril", "triu"):
        for k in (0, 2, -1):
            add(op, f"diagonal_{k}".replace("-", "m"), ["%x: f32[5, 7]"], [f"%y = {op}(%x, {k})"], ["%y"])
        add(op, "batched_transposed", ["%x: f32[2, 7, 5]"], ["%t = transpose(%x, 1, 2)", f"%y = {op}(%t, 1)"],
            ["%y"])
        add(op, "i32", ["%x: i32[6, 6]"], [f"%y = {op}(%x)"], ["%y"])
        add(op, "bool", ["%x: bool[4, 9]"], [f"%y = {op}(%x, -2)"], ["%y"])
        add(op + "_", "view_of_param", ["%x: f32[3, 6, 6]"], ["%s = select(%x, 0, 1)", f"%y = {op}_(%s)"],
            ["%x"], None, "mutates one matrix of the parameter")
    add("cat", "dim0", ["%a: f32[3, 50]", "%b: f32[2, 50]"], ["%y = cat([%a, %b])"], ["%y"])
    add("cat", "last_dim_three", ["%a: f32[3, 5]", "%b: f32[3, 1]", "%c: f32[3, 17]"],
        ["%y = cat([%a, %b, %c], -1)"], ["%y"])
    add("cat", "transposed_and_mixed_dtypes", ["%a: f32[50, 3]", "%b: i32[3, 7]"],
        ["%t = t(%a)", "%y = cat([%t, %b], 1)"], ["%y"], None, "i32 promotes to f32")
    add("cat", "skips_empty_1d", ["%a: f32[4, 3]", "%e: f32[0]"], ["%y = cat([%e, %a, %e], 0)"], ["%y"])
    add("cat", "rotary_halves", ["%x: f32[2, 5, 8]"],
        ["%a = slice(%x, -1, 0, 4)", "%b = slice(%x, -1, 4, 8)", "%n = neg(%b)", "%y = cat([%n, %a], -1)"],
        ["%y"], None, "rotate_half of rotary embeddings")
    add("stack", "dim0", ["%a: f32[3, 50]", "%b: f32[3, 50]"], ["%y = stack([%a, %b])"], ["%y"])
    add("stack", "last_dim_transposed", ["%a: f32[50, 3]", "%b: f32[3, 50]"],
        ["%t = t(%a)", "%y = stack([%t, %b, %t], -1)"], ["%y"])
    add("stack", "mixed_dtypes", ["%a: i32[7]", "%b: f16[7]"], ["%y = stack([%a, %b], 0)"], ["%y"])
    sd = "scaled_dot_product_attention"
    add(sd, "plain", ["%q: f32[2, 3, 5, 8]", "%k: f32[2, 3, 7, 8]", "%v: f32[2, 3, 7, 4]"],
        [f"%y = {sd}(%q, %k, %v)"], ["%y"])
    add(sd, "causal_broadcast_value", ["%q: f32[2, 3, 17, 8]", "%k: f32[2, 3, 17, 8]", "%v: f32[2, 1, 17, 5]"],
        [f"%y = {sd}(%q, %k, %v, none, 0.0, true)"], ["%y"])
    add(sd, "bool_mask_and_scale", ["%q: f32[3, 5, 16]", "%k: f32[3, 33, 16]", "%v: f32[3, 33, 16]", "%m: bool[5, 33]"],
        ["%t = fill_(%m, true)", f"%y = {sd}(%q, %k, %v, %m, 0.0, false, 0.5)"], ["%y"], None,
        "every key allowed (rows with none give NaN)")
    add(sd, "float_mask_transposed_heads", ["%x: f32[1, 9, 2, 8]", "%m: f32[9, 9]"],
        ["%h = transpose(%x, 1, 2)", f"%y = {sd}(%h, %h, %h, %m)"], ["%y"])
    add(sd, "one_query", ["%q: f32[4, 1, 32]", "%k: f32[4, 20, 32]", "%v: f32[4, 20, 32]"],
        [f"%y = {sd}(%q, %k, %v)"], ["%y"], None, "a decoding step")
    add("index_add", "repeated_rows", ["%x: f32[6, 50]", "%i: i32[9]", "%s: f32[9, 50]"],
        ["%y = index_add(%x, 0, %i, %s)"], ["%y"], ["%i: int 0..6"], "repeated indices accumulate in order")
    add("index_add", "last_dim_alpha_transposed", ["%x: f32[50, 3]", "%i: i32[4]", "%s: f32[3, 4]"],
        ["%t = t(%x)", "%y = index_add(%t, -1, %i, %s, 0.5)"], ["%y"], ["%i: int 0..50"])
    add("index_add", "i32", ["%x: i32[5, 4]", "%i: i32[3]", "%s: i32[3, 4]"],
        ["%y = index_add(%x, 0, %i, %s, 2)"], ["%y"], ["%i: int 0..5"])
    add("index_add_", "slice_of_param", ["%x: f32[8, 6]", "%i: i32[5]", "%s: f32[4, 5]"],
        ["%v = slice(%x, 0, 2, 6)", "%y = index_add_(%v, 1, %i, %s)"], ["%x"], ["%i: int 0..6"],
        "mutates the parameter through the slice")
    add("cumsum", "last_dim", ["%x: f32[3, 783]"], ["%y = cumsum(%x, -1)"], ["%y"])
    add("cumsum", "middle_dim_transposed", ["%x: f32[4, 5, 6]"], ["%t = transpose(%x, 0, 2)", "%y = cumsum(%t, 1)"],
        ["%y"])
    add("cumsum", "f16", ["%x: f16[50]"], ["%y = cumsum(%x, 0)"], ["%y"])
    add("cumsum", "0d", ["%x: f32[]"], ["%y = cumsum(%x, 0)"], ["%y"])
    for op in ("var", "std"):
        add(op, "all", ["%x: f32[783]"], [f"%y = {op}(%x)"], ["%y"])
        add(op, "dim_keepdim_correction0", ["%x: f32[3, 50]"], [f"%y = {op}(%x, [1], 0, true)"], ["%y"])
        add(op, "two_dims_transposed", ["%x: f32[4, 6, 5]"], ["%t = transpose(%x, 0, 2)", f"%y = {op}(%t, [0, 2])"],
            ["%y"])
        add(op, "f16", ["%x: f16[7, 9]"], [f"%y = {op}(%x, [-1])"], ["%y"])
    add("flip", "two_dims", ["%x: f32[3, 50]"], ["%y = flip(%x, [0, -1])"], ["%y"])
    add("flip", "transposed_i32", ["%x: i32[3, 5, 7]"], ["%t = transpose(%x, 0, 2)", "%y = flip(%t, [1])"], ["%y"])
    add("flip", "no_dims", ["%x: f32[783]"], ["%y = flip(%x, [])"], ["%y"])
    add("repeat", "leading_dims", ["%x: f32[3, 5]"], ["%y = repeat(%x, [2, 1, 3])"], ["%y"])
    add("repeat", "transposed_bool", ["%x: bool[3, 5]"], ["%t = t(%x)", "%y = repeat(%t, [2, 2])"], ["%y"])
    add("constant_pad_nd", "both_sides", ["%x: f32[3, 5]"], ["%y = constant_pad_nd(%x, [1, 2, 3, 0], 0.5)"], ["%y"])
    add("constant_pad_nd", "negative_crops", ["%x: f32[4, 9]"], ["%y = constant_pad_nd(%x, [-2, 1])"], ["%y"])
    add("constant_pad_nd", "i32_transposed", ["%x: i32[5, 3]"], ["%t = t(%x)", "%y = constant_pad_nd(%t, [2, 2], 7)"],
        ["%y"])
    add("baddbmm", "default_beta_alpha", ["%s: f32[2, 3, 5]", "%a: f32[2, 3, 4]", "%b: f32[2, 4, 5]"],
        ["%y = baddbmm(%s, %a, %b)"], ["%y"])
    add("baddbmm", "broadcast_addend_scaled", ["%s: f32[5]", "%a: f32[3, 17, 33]", "%b: f32[3, 33, 5]"],
        ["%y = baddbmm(%s, %a, %b, 0.5, -2.0)"], ["%y"])
    add("baddbmm", "beta0_transposed", ["%s: f32[2, 6, 6]", "%a: f32[2, 7, 6]"],
        ["%t = transpose(%a, 1, 2)", "%y = baddbmm(%s, %t, %a, 0, 1)"], ["%y"])
    # Data-dependent selection (i64 indices, as eager requires).
    add("index", "rows_i64", ["%x: f32[6, 50]", "%i: i64[4]"], ["%y = index(%x, [%i])"], ["%y"], ["%i: int -6..6"],
        "negative indices wrap")
    add("index", "middle_dim_2d_index", ["%x: f32[3, 7, 5]", "%i: i64[2, 4]"], ["%y = index(%x, [none, %i])"], ["%y"],
        ["%i: int 0..7"])
    add("index", "two_separated_indices_transposed", ["%x: f32[4, 5, 6]", "%i: i64[3]", "%j: i64[2, 1]"],
        ["%t = transpose(%x, 0, 1)", "%y = index(%t, [%i, none, %j])"], ["%y"], ["%i: int 0..5", "%j: int 0..6"],
        "the index block goes first")
    add("index", "adjacent_broadcast_i32", ["%x: i32[4, 5, 6]", "%i: i64[3, 1]", "%j: i64[2]"],
        ["%y = index(%x, [none, %i, %j])"], ["%y"], ["%i: int 0..5", "%j: int 0..6"])
    add("gather", "dim1", ["%x: f32[4, 50]", "%i: i64[4, 7]"], ["%y = gather(%x, 1, %i)"], ["%y"], ["%i: int 0..50"])
    add("gather", "dim0_smaller_index_transposed", ["%x: f32[5, 6]", "%i: i64[3, 2]"],
        ["%t = t(%x)", "%y = gather(%t, 0, %i)"], ["%y"], ["%i: int 0..6"])
    add("gather", "i64_values_0d", ["%x: i64[]", "%i: i64[]"], ["%y = gather(%x, 0, %i)"], ["%y"], ["%i: int 0..1"])
    add("take_along_dim", "dim1", ["%x: f32[3, 50]", "%i: i64[3, 9]"], ["%y = take_along_dim(%x, %i, 1)"], ["%y"],
        ["%i: int 0..50"])
    add("take_along_dim", "broadcast", ["%x: f32[4, 1, 5]", "%i: i64[2, 3, 5]"], ["%y = take_along_dim(%x, %i, 0)"],
        ["%y"], ["%i: int 0..4"])
    add("take_along_dim", "flattened", ["%x: f32[3, 5]", "%i: i64[7]"], ["%y = take_along_dim(%x, %i)"], ["%y"],
        ["%i: int 0..15"])
    add("scatter", "src_dim1", ["%x: f32[3, 50]", "%i: i64[3, 4]", "%s: f32[3, 6]"], ["%y = scatter(%x, 1, %i, %s)"],
        ["%y"], ["%i: perm 0..50"])
    add("scatter", "value_dim0", ["%x: f32[6, 5]", "%i: i64[2, 3]"], ["%y = scatter(%x, 0, %i, 2.5)"], ["%y"],
        ["%i: perm 0..6"])
    add("scatter_", "param_transposed", ["%x: f32[5, 8]", "%i: i64[1, 3]", "%s: f32[2, 3]"],
        ["%t = t(%x)", "%y = scatter_(%t, 1, %i, %s)"], ["%x"], ["%i: perm 0..5"], "mutates the parameter through t")
    add("scatter_add", "duplicates_accumulate", ["%x: f32[5, 4]", "%i: i64[7, 4]", "%s: f32[7, 4]"],
        ["%y = scatter_add(%x, 0, %i, %s)"], ["%y"], ["%i: int 0..5"])
    add("scatter_add_", "i64_histogram", ["%i: i64[50]"],
        ["%h = zeros([10], i64)", "%o = ones([50], i64)", "%y = scatter_add_(%h, 0, %i, %o)"], ["%h"],
        ["%i: int 0..10"], "counts are i64")
    add("index_copy", "rows", ["%x: f32[6, 5]", "%i: i64[3]", "%s: f32[3, 5]"], ["%y = index_copy(%x, 0, %i, %s)"],
        ["%y"], ["%i: perm 0..6"])
    add("index_copy_", "kv_cache_param", ["%c: f32[2, 16, 8]", "%i: i64[3]", "%s: f32[2, 3, 8]"],
        ["%y = index_copy_(%c, 1, %i, %s)"], ["%c"], ["%i: perm 0..16"], "a cache updated in place")
    add("argmax", "dim1", ["%x: f32[3, 783]"], ["%y = argmax(%x, 1)"], ["%y"])
    add("argmax", "all", ["%x: f32[50, 7]"], ["%y = argmax(%x)"], ["%y"])
    add("argmax", "i32_ties_keepdim", ["%x: i32[5, 6]"], ["%y = argmax(%x, 0, true)"], ["%y"], None,
        "the first of equal maxima")
    add("argmin", "transposed", ["%x: f32[4, 50]"], ["%t = t(%x)", "%y = argmin(%t, 1)"], ["%y"])
    add("max", "dim", ["%x: f32[3, 50]"], ["%v, %i = max(%x, 1)"], ["%v", "%i"])
    add("max", "all_i64", ["%x: i64[7, 3]"], ["%y = max(%x)"], ["%y"])
    add("min", "dim_keepdim_transposed", ["%x: f32[6, 4]"], ["%t = t(%x)", "%v, %i = min(%t, 0, true)"],
        ["%v", "%i"])
    add("sort", "last_dim", ["%x: f32[3, 50]"], ["%v, %i = sort(%x)"], ["%v", "%i"])
    add("sort", "descending_dim0", ["%x: f32[20, 3]"], ["%v, %i = sort(%x, 0, true)"], ["%v", "%i"])
    add("sort", "i64_distinct", ["%x: i64[40]"], ["%v, %i = sort(%x)"], ["%v", "%i"], ["%x: perm -20..20"])
    add("topk", "k5", ["%x: f32[3, 50]"], ["%v, %i = topk(%x, 5)"], ["%v", "%i"])
    add("topk", "smallest_dim0", ["%x: f32[20, 4]"], ["%v, %i = topk(%x, 3, 0, false)"], ["%v", "%i"])
    for src, dst, ann in (("f32", "i32", "uniform -5.0..5.0"), ("i32", "f32", None), ("f32", "f16", None),
                          ("f32", "bool", "int -1..2"), ("bool", "f32", None),
                          ("i8", "f32", "int -128..128"), ("f32", "i8", "uniform -127.9..127.9"),
                          ("i32", "i8", "int -1000..1000"), ("i8", "bool", "int -2..2")):
        add("_to_copy", f"{src}_to_{dst}", [f"%x: {src}[3, 50]"], ["%t = t(%x)", f"%y = _to_copy(%t, {dst})"],
            ["%y"], [f"%x: {ann}"] if ann else None)


def gen_int8():
    """int8 tensors (a byte each, four to a word on the GPU): wrapping
    arithmetic, promotion, reductions, and the dequantized product of
    int8 weights with a scale per output channel (`kiln export
    --weights-dtype i8`)."""
    add("add", "i8_wraps", ["%a: i8[7, 9]", "%b: i8[7, 9]"], ["%y = add(%a, %b)"], ["%y"],
        ["%a: int -128..128", "%b: int -128..128"], "int8 sums wrap")
    add("mul", "i8_scalar_wraps", ["%a: i8[5, 11]"], ["%t = t(%a)", "%y = mul(%t, 3)"], ["%y"],
        ["%a: int -128..128"])
    add("add", "i8_i32_promotes", ["%a: i8[6, 5]", "%b: i32[6, 5]"], ["%y = add(%a, %b)"], ["%y"],
        ["%a: int -128..128", "%b: int -1000..1000"])
    add("sum", "i8_to_i64", ["%a: i8[9, 13]"], ["%y = sum(%a, [1])"], ["%y"], ["%a: int -128..128"])
    add("amax", "i8", ["%a: i8[9, 13]"], ["%y = amax(%a, [0])"], ["%y"], ["%a: int -128..128"])
    add("mul", "i8_dequantized_linear", ["%x: f32[5, 24]", "%q: i8[12, 24]", "%s: f32[12, 1]", "%b: f32[12]"],
        ["%f = _to_copy(%q, f32)", "%w = mul(%f, %s)", "%y = linear(%x, %w, %b)"], ["%y"],
        ["%q: int -127..128", "%s: uniform 0.001..0.02"], "int8 weights, a scale per output channel")


def gen_composites():
    """Composite ops (decomposed into table ops): convolution, pooling,
    normalization, the hard activations, rolls and differences."""
    c = "conv2d"
    add(c, "basic_bias", ["%x: f32[2, 3, 7, 6]", "%w: f32[4, 3, 3, 3]", "%b: f32[4]"], [f"%y = {c}(%x, %w, %b)"], ["%y"])
    add(c, "stride_padding", ["%x: f32[1, 3, 9, 8]", "%w: f32[5, 3, 3, 2]"], [f"%y = {c}(%x, %w, none, [2, 3], [1, 2])"], ["%y"])
    add(c, "dilation_groups", ["%x: f32[2, 4, 9, 9]", "%w: f32[6, 2, 3, 3]", "%b: f32[6]"], [f"%y = {c}(%x, %w, %b, 1, 2, 2, 2)"], ["%y"])
    add(c, "depthwise", ["%x: f32[1, 6, 8, 7]", "%w: f32[6, 1, 3, 3]"], [f"%y = {c}(%x, %w, none, 1, 1, 1, 6)"], ["%y"])
    add(c, "pointwise_1x1", ["%x: f32[2, 8, 5, 5]", "%w: f32[3, 8, 1, 1]", "%b: f32[3]"], [f"%y = {c}(%x, %w, %b)"], ["%y"])
    add(c, "padding_same_even_kernel", ["%x: f32[1, 2, 6, 7]", "%w: f32[3, 2, 4, 2]"], [f'%y = {c}(%x, %w, none, 1, "same", [1, 2])'], ["%y"])
    add(c, "padding_valid", ["%x: f32[1, 2, 6, 7]", "%w: f32[3, 2, 3, 3]"], [f'%y = {c}(%x, %w, none, 1, "valid")'], ["%y"])
    add(c, "unbatched", ["%x: f32[3, 6, 5]", "%w: f32[2, 3, 3, 3]", "%b: f32[2]"], [f"%y = {c}(%x, %w, %b, 1, 1)"], ["%y"])
    add(c, "transposed_input", ["%x: f32[2, 3, 6, 7]", "%w: f32[4, 3, 3, 3]"], ["%t = transpose(%x, 2, 3)", f"%y = {c}(%t, %w)"], ["%y"])
    add(c, "f16", ["%x: f16[1, 3, 6, 6]", "%w: f16[2, 3, 3, 3]", "%b: f16[2]"], [f"%y = {c}(%x, %w, %b, 1, 1)"], ["%y"])
    add("conv1d", "stride_dilation", ["%x: f32[2, 3, 20]", "%w: f32[4, 3, 5]", "%b: f32[4]"], ["%y = conv1d(%x, %w, %b, 2, 3, 2)"], ["%y"])
    add("conv1d", "groups_same", ["%x: f32[1, 4, 11]", "%w: f32[4, 2, 3]"], ['%y = conv1d(%x, %w, none, 1, "same", 1, 2)'], ["%y"])
    add("conv3d", "basic", ["%x: f32[1, 2, 5, 6, 4]", "%w: f32[3, 2, 2, 3, 2]", "%b: f32[3]"], ["%y = conv3d(%x, %w, %b, 1, [1, 0, 1])"], ["%y"])
    t = "conv_transpose2d"
    add(t, "stride2_output_padding", ["%x: f32[2, 4, 5, 4]", "%w: f32[4, 3, 3, 3]", "%b: f32[3]"], [f"%y = {t}(%x, %w, %b, 2, 1, 1)"], ["%y"])
    add(t, "groups_dilation", ["%x: f32[1, 4, 4, 5]", "%w: f32[4, 2, 2, 3]"], [f"%y = {t}(%x, %w, none, [1, 2], 0, 0, 2, [2, 1])"], ["%y"])
    add("conv_transpose1d", "stride3_padding", ["%x: f32[2, 3, 7]", "%w: f32[3, 2, 4]"], ["%y = conv_transpose1d(%x, %w, none, 3, 2)"], ["%y"])
    add("convolution", "explicit", ["%x: f32[1, 3, 8, 8]", "%w: f32[4, 3, 3, 3]", "%b: f32[4]"],
        ["%y = convolution(%x, %w, %b, [2, 1], [1, 1], [1, 2], false, [0, 0], 1)"], ["%y"])
    add("convolution", "transposed", ["%x: f32[1, 4, 5, 5]", "%w: f32[4, 2, 3, 3]"],
        ["%y = convolution(%x, %w, none, [2, 2], [1, 1], [1, 1], true, [1, 0], 1)"], ["%y"])
    m = "max_pool2d"
    add(m, "kernel3_stride2_pad1", ["%x: f32[2, 3, 9, 8]"], [f"%y = {m}(%x, 3, 2, 1)"], ["%y"])
    add(m, "ceil_mode_dilation", ["%x: f32[1, 2, 10, 9]"], [f"%y = {m}(%x, [3, 2], [2, 2], [1, 0], [2, 1], true)"], ["%y"])
    add(m, "unbatched_default_stride", ["%x: f32[3, 8, 6]"], [f"%y = {m}(%x, 2)"], ["%y"])
    add(m, "f16", ["%x: f16[1, 2, 6, 6]"], [f"%y = {m}(%x, 2)"], ["%y"])
    add("max_pool1d", "basic", ["%x: f32[2, 3, 11]"], ["%y = max_pool1d(%x, 3, 2, 1)"], ["%y"])
    a = "avg_pool2d"
    add(a, "include_pad", ["%x: f32[2, 3, 7, 8]"], [f"%y = {a}(%x, 3, 2, 1)"], ["%y"])
    add(a, "exclude_pad_ceil", ["%x: f32[1, 2, 7, 6]"], [f"%y = {a}(%x, 3, 2, 1, true, false)"], ["%y"])
    add(a, "ceil_include_pad", ["%x: f32[1, 2, 8, 8]"], [f"%y = {a}(%x, 3, 2, 1, true)"], ["%y"])
    add(a, "divisor_override", ["%x: f32[1, 2, 6, 6]"], [f"%y = {a}(%x, 2, 2, 0, false, true, 3)"], ["%y"])
    add("avg_pool1d", "basic", ["%x: f32[2, 3, 10]"], ["%y = avg_pool1d(%x, 4, 3, 2, false, false)"], ["%y"])
    p = "adaptive_avg_pool2d"
    add(p, "to_1x1", ["%x: f32[2, 5, 7, 6]"], [f"%y = {p}(%x, [1, 1])"], ["%y"])
    add(p, "equal_windows", ["%x: f32[1, 3, 8, 6]"], [f"%y = {p}(%x, [4, 3])"], ["%y"])
    add(p, "unequal_windows", ["%x: f32[2, 3, 7, 5]"], [f"%y = {p}(%x, [3, 2])"], ["%y"])
    add("adaptive_avg_pool1d", "unequal", ["%x: f32[2, 3, 10]"], ["%y = adaptive_avg_pool1d(%x, 4)"], ["%y"])
    b = "batch_norm"
    add(b, "eval", ["%x: f32[2, 3, 4, 5]", "%w: f32[3]", "%b: f32[3]", "%m: f32[3]", "%v: f32[3]"],
        [f"%y = {b}(%x, %w, %b, %m, %v, false, 0.1, 1e-5, true)"], ["%y"], ["%v: uniform 0.5..2.0"])
    add(b, "eval_no_affine_2d", ["%x: f32[4, 3]", "%m: f32[3]", "%v: f32[3]"],
        [f"%y = {b}(%x, none, none, %m, %v, false, 0.1, 0.001, true)"], ["%y"], ["%v: uniform 0.5..2.0"])
    add(b, "training_batch_stats", ["%x: f32[3, 2, 5]", "%w: f32[2]", "%b: f32[2]"],
        [f"%y = {b}(%x, %w, %b, none, none, true, 0.1, 1e-5, true)"], ["%y"])
    add("_native_batch_norm_legit_no_training", "three_results", ["%x: f32[2, 3, 4]", "%w: f32[3]", "%b: f32[3]", "%m: f32[3]", "%v: f32[3]"],
        ["%y, %s, %r = _native_batch_norm_legit_no_training(%x, %w, %b, %m, %v, 0.1, 1e-5)"], ["%y", "%s", "%r"], ["%v: uniform 0.5..2.0"])
    add("group_norm", "affine", ["%x: f32[2, 6, 3, 4]", "%w: f32[6]", "%b: f32[6]"], ["%y = group_norm(%x, 3, %w, %b)"], ["%y"])
    add("group_norm", "plain_eps", ["%x: f32[3, 4, 5]"], ["%y = group_norm(%x, 2, none, none, 0.01)"], ["%y"])
    add("rms_norm", "weight", ["%x: f32[3, 50]", "%w: f32[50]"], ["%y = rms_norm(%x, [50], %w)"], ["%y"])
    add("rms_norm", "two_dims_eps", ["%x: f32[2, 3, 8]"], ["%y = rms_norm(%x, [3, 8], none, 0.001)"], ["%y"])
    for op in ["hardswish", "hardsigmoid", "relu6", "mish"]:
        add(op, "f32", ["%x: f32[3, 50]"], [f"%y = {op}(%x)"], ["%y"], ["%x: uniform -8.0..8.0"])
        add(op + "_", "transposed", ["%x: f32[50, 3]"], ["%c = clone(%x)", "%t = t(%c)", f"%y = {op}_(%t)"], ["%y", "%c"], ["%x: uniform -8.0..8.0"])
    add("hardswish", "f16", ["%x: f16[50]"], ["%y = hardswish(%x)"], ["%y"], ["%x: uniform -8.0..8.0"])
    add("hardtanh", "bounds", ["%x: f32[3, 50]"], ["%y = hardtanh(%x, -0.5, 2)"], ["%y"], ["%x: uniform -4.0..4.0"])
    add("hardtanh_", "default_bounds", ["%x: f32[50]"], ["%c = clone(%x)", "%y = hardtanh_(%c)"], ["%c"])
    add("logsumexp", "dim_keepdim", ["%x: f32[3, 50]"], ["%y = logsumexp(%x, [1], true)", "%z = logsumexp(%x, 0)"], ["%y", "%z"])
    add("logsumexp", "infinities", ["%x: f32[3]"], ["%m = full([2, 3], -inf)", "%y = logsumexp(%m, [1])"], ["%y"], None,
        "all -inf: the result is -inf, not nan")
    add("roll", "dims", ["%x: f32[4, 5, 3]"], ["%y = roll(%x, [2, -7], [0, 1])"], ["%y"])
    add("roll", "flattened", ["%x: f32[3, 4]"], ["%y = roll(%x, 5)"], ["%y"])
    add("diff", "twice_last_dim", ["%x: f32[3, 7]"], ["%y = diff(%x, 2)"], ["%y"])
    add("diff", "prepend_append", ["%x: f32[4, 3]", "%p: f32[1, 3]", "%q: f32[2, 3]"], ["%y = diff(%x, 1, 0, %p, %q)"], ["%y"])
    add("diff", "bool", ["%x: bool[9]"], ["%y = diff(%x)"], ["%y"])
    # Metadata changed in place: later names of the tensor see the view.
    mv = [
        ("transpose_", "negative_dims", "%x: f32[3, 4, 5]", "transpose_(%c, -1, 0)"),
        ("t_", "matrix", "%x: f32[3, 5]", "t_(%c)"),
        ("swapdims_", "middle", "%x: f32[3, 4, 5]", "swapdims_(%c, 1, 2)"),
        ("swapaxes_", "first_last", "%x: f32[3, 4, 5]", "swapaxes_(%c, 0, 2)"),
        ("unsqueeze_", "last", "%x: f32[3, 5]", "unsqueeze_(%c, -1)"),
        ("squeeze_", "all", "%x: f32[3, 1, 5, 1]", "squeeze_(%c)"),
        ("squeeze_", "dim", "%x: f32[3, 1, 5]", "squeeze_(%c, 1)"),
        ("squeeze_", "dims", "%x: f32[1, 3, 1, 5]", "squeeze_(%c, [0, 2])"),
        ("as_strided_", "rows_with_gaps", "%x: f32[12]", "as_strided_(%c, [3, 3], [4, 1], 1)"),
        ("resize_", "shrink", "%x: f32[3, 5]", "resize_(%c, [2, 4])"),
    ]
    for op, case, param, call in mv:
        add(op, case, [param], ["%c = clone(%x)", f"%v = {call}", "%y = mul_(%c, 2)", "%z = add(%c, 1)"], ["%z", "%v"])
    add("resize_", "grow_then_write", ["%x: f32[2, 3]", "%w: f32[2]"],
        ["%c = clone(%x)", "%v = resize_(%c, [4, 2])", "%r = slice(%c, 0, 3, 4)", "%s = copy_(%r, %w)"], ["%c"], None,
        "rows 3.. are new (eager leaves them uninitialized): written before read")
    for mode in ["reflect", "replicate", "circular"]:
        add("pad", mode, ["%x: f32[2, 3, 5, 6]"], [f'%y = pad(%x, [2, 1, 0, 3], "{mode}")'], ["%y"])
    add("pad", "constant_value", ["%x: f32[3, 4]"], ['%y = pad(%x, [1, 2], "constant", 0.5)'], ["%y"])
    add("pad", "constant_crop", ["%x: f32[3, 4]"], ["%y = pad(%x, [-1, 2, 1, -1])"], ["%y"])
    add("pad", "reflect_3d_transposed", ["%x: f32[2, 4, 3, 5]"], ["%t = transpose(%x, 2, 3)", '%y = pad(%t, [1, 1, 2, 2, 1, 0], "reflect")'], ["%y"])
    for op, sp in [("reflection_pad", 1), ("reflection_pad", 2), ("reflection_pad", 3),
                   ("replication_pad", 1), ("replication_pad", 2), ("replication_pad", 3)]:
        shape = [2, 3, 4, 5, 6][: sp + 2]
        p = [1, 2, 2, 0, 0, 1][: 2 * sp]
        add(f"{op}{sp}d", "batched", [f"%x: f32{shp(shape)}"], [f"%y = {op}{sp}d(%x, {shp(p)})"], ["%y"])
    add("reflection_pad2d", "unbatched", ["%x: f32[3, 4, 5]"], ["%y = reflection_pad2d(%x, [3, 3, 1, 2])"], ["%y"])
    # Upsampling: ATen's source indices and weights, per dimension.
    u = "upsample_nearest2d"
    add(u, "twice", ["%x: f32[2, 3, 4, 5]"], [f"%y = {u}(%x, [8, 10])"], ["%y"])
    add(u, "fractional_down", ["%x: f32[1, 2, 5, 7]"], [f"%y = {u}(%x, [7, 4])"], ["%y"])
    add(u, "scales_given", ["%x: f32[1, 2, 4, 4]"], [f"%y = {u}(%x, [6, 6], 1.5, 1.5)"], ["%y"])
    add(u, "f16", ["%x: f16[1, 2, 3, 3]"], [f"%y = {u}(%x, [5, 4])"], ["%y"])
    add("upsample_nearest1d", "basic", ["%x: f32[2, 3, 5]"], ["%y = upsample_nearest1d(%x, [12])"], ["%y"])
    add("upsample_nearest3d", "basic", ["%x: f32[1, 2, 3, 4, 2]"], ["%y = upsample_nearest3d(%x, [5, 6, 4])"], ["%y"])
    add("_upsample_nearest_exact2d", "basic", ["%x: f32[1, 2, 5, 6]"], ["%y = _upsample_nearest_exact2d(%x, [8, 9])"], ["%y"])
    add("_upsample_nearest_exact1d", "down", ["%x: f32[2, 2, 9]"], ["%y = _upsample_nearest_exact1d(%x, [4])"], ["%y"])
    add("_upsample_nearest_exact3d", "basic", ["%x: f32[1, 1, 2, 3, 4]"], ["%y = _upsample_nearest_exact3d(%x, [3, 5, 6])"], ["%y"])
    b = "upsample_bilinear2d"
    add(b, "half_pixel", ["%x: f32[2, 3, 5, 4]"], [f"%y = {b}(%x, [9, 7], false)"], ["%y"])
    add(b, "align_corners", ["%x: f32[1, 2, 4, 5]"], [f"%y = {b}(%x, [7, 8], true)"], ["%y"])
    add(b, "scales_given", ["%x: f32[1, 2, 4, 4]"], [f"%y = {b}(%x, [6, 6], false, 1.5, 1.5)"], ["%y"])
    add(b, "down", ["%x: f32[1, 2, 9, 8]"], [f"%y = {b}(%x, [4, 3], false)"], ["%y"])
    add(b, "f16", ["%x: f16[1, 2, 4, 4]"], [f"%y = {b}(%x, [8, 8], false)"], ["%y"])
    add("upsample_linear1d", "half_pixel", ["%x: f32[2, 3, 6]"], ["%y = upsample_linear1d(%x, [13], false)"], ["%y"])
    add("upsample_linear1d", "align_one_output", ["%x: f32[1, 2, 6]"], ["%y = upsample_linear1d(%x, [1], true)"], ["%y"])
    add("upsample_trilinear3d", "basic", ["%x: f32[1, 2, 3, 4, 3]"], ["%y = upsample_trilinear3d(%x, [5, 6, 4], false)"], ["%y"])
    add("max_pool2d_with_indices", "padding_stride", ["%x: f32[2, 3, 9, 8]"], ["%y, %i = max_pool2d_with_indices(%x, 3, 2, 1)"], ["%y", "%i"])
    add("max_pool2d_with_indices", "ceil_dilation_unbatched", ["%x: f32[2, 10, 9]"], ["%y, %i = max_pool2d_with_indices(%x, [3, 2], [2, 2], [1, 0], [2, 1], true)"], ["%y", "%i"])
    add("max_pool1d_with_indices", "basic", ["%x: f32[2, 3, 11]"], ["%y, %i = max_pool1d_with_indices(%x, 3, 2, 1)"], ["%y", "%i"])
    add("max_pool3d_with_indices", "basic", ["%x: f32[1, 2, 5, 4, 6]"], ["%y, %i = max_pool3d_with_indices(%x, 2, [1, 2, 2])"], ["%y", "%i"])
    for op in ["bitwise_and", "bitwise_or", "bitwise_xor"]:
        add(op, "i32", ["%a: i32[3, 50]", "%b: i32[3, 50]"], [f"%y = {op}(%a, %b)"], ["%y"], ["%a: int -100..100", "%b: int -100..100"])
        add(op, "i64_scalar", ["%a: i64[50]"], [f"%y = {op}(%a, 12)"], ["%y"], ["%a: int -1000..1000"])
        add(op, "u32_broadcast_transposed", ["%a: u32[50, 3]", "%b: u32[3]"], ["%t = t(%a)", "%c = unsqueeze(%b, 1)", f"%y = {op}(%t, %c)"], ["%y"])
        add(op, "bool", ["%a: bool[3, 50]", "%b: bool[3, 50]"], [f"%y = {op}(%a, %b)"], ["%y"])
        add(op + "_", "i32_in_place", ["%a: i32[50]", "%b: i32[50]"], ["%c = clone(%a)", f"%y = {op}_(%c, %b)"], ["%c"], ["%a: int -100..100", "%b: int -100..100"])
    add("bitwise_not", "i32", ["%a: i32[3, 50]"], ["%y = bitwise_not(%a)"], ["%y"], ["%a: int -100..100"])
    add("bitwise_not", "i64", ["%a: i64[50]"], ["%y = bitwise_not(%a)"], ["%y"], ["%a: int -1000..1000"])
    add("bitwise_not", "bool", ["%a: bool[50]"], ["%y = bitwise_not(%a)"], ["%y"])
    add("bitwise_not_", "bool_in_place", ["%a: bool[50]"], ["%c = clone(%a)", "%y = bitwise_not_(%c)"], ["%c"])
    add("conv_transpose3d", "stride2", ["%x: f32[1, 2, 3, 2, 3]", "%w: f32[2, 3, 2, 2, 2]", "%b: f32[3]"],
        ["%y = conv_transpose3d(%x, %w, %b, 2)"], ["%y"])
    add("max_pool3d", "padding", ["%x: f32[1, 2, 5, 4, 6]"], ["%y = max_pool3d(%x, 3, 2, 1)"], ["%y"])
    add("avg_pool3d", "ceil", ["%x: f32[1, 2, 5, 4, 6]"], ["%y = avg_pool3d(%x, 2, 2, 0, true)"], ["%y"])
    add("_adaptive_avg_pool2d", "unequal", ["%x: f32[1, 2, 5, 7]"], ["%y = _adaptive_avg_pool2d(%x, [2, 3])"], ["%y"])
    add("adaptive_avg_pool3d", "mixed", ["%x: f32[1, 2, 4, 5, 6]"], ["%y = adaptive_avg_pool3d(%x, [2, 3, 6])"], ["%y"])


# ---------------------------------------------------------------------------
# The core ATen ops added for issue 74: float-class tests, fmod, atan2,
# logical_xor, prod, any / all, var / std's `.dim`, the native norms,
# native_dropout in evaluation mode, scalar_tensor, empty
# ---------------------------------------------------------------------------

SPECIALS = ["%z = zeros([4])", "%n = div(%z, %z)", "%i = reciprocal(%z)", "%ni = neg(%i)",
            "%s = cat([%x, %n, %i, %ni])"]


def gen_core():
    for op in ("isnan", "isinf", "isposinf", "isneginf", "isfinite"):
        add(op, "specials_f32", ["%x: f32[3, 4]"], SPECIALS[:4] + ["%f = reshape(%x, [12])", "%s = cat([%f, %n, %i, %ni])",
            f"%y = {op}(%s)"], ["%y"], None, "nan, inf and -inf made in the program")
        add(op, "f16_transposed", ["%x: f16[3, 5]"], ["%t = t(%x)", f"%y = {op}(%t)"], ["%y"])
        add(op, "i32", ["%x: i32[7]"], [f"%y = {op}(%x)"], ["%y"], ["%x: int -5..5"])
    for case, params, body, anns in (
        ("tt_broadcast", ["%a: f32[3, 50]", "%b: f32[50]"], ["%y = fmod(%a, %b)"], ["%a: uniform -9.0..9.0", "%b: uniform 0.5..3.0"]),
        ("negative_divisor", ["%a: f32[50]", "%b: f32[50]"], ["%y = fmod(%a, %b)"], ["%a: uniform -9.0..9.0", "%b: uniform -3.0..-0.5"]),
        ("scalar", ["%a: f32[3, 50]"], ["%t = t(%a)", "%y = fmod(%t, 1.5)"], ["%a: uniform -9.0..9.0"]),
        ("i32", ["%a: i32[50]", "%b: i32[50]"], ["%y = fmod(%a, %b)"], ["%a: int -50..50", "%b: int 1..9"]),
        ("i64_negative_scalar", ["%a: i64[50]"], ["%y = fmod(%a, -7)"], ["%a: int -50..50"]),
        ("f16", ["%a: f16[50]"], ["%y = fmod(%a, 0.75)"], ["%a: uniform -4.0..4.0"]),
    ):
        add("fmod", case, params, body, ["%y"], anns)
    add("fmod_", "in_place_slice", ["%a: f32[4, 6]"], ["%c = clone(%a)", "%s = slice(%c, 1, 0, none, 2)", "%y = fmod_(%s, 0.7)"],
        ["%c"], ["%a: uniform -5.0..5.0"])
    add("atan2", "quadrants", ["%a: f32[3, 50]", "%b: f32[3, 50]"], ["%y = atan2(%a, %b)"], ["%y"],
        ["%a: uniform -3.0..3.0", "%b: uniform -3.0..3.0"])
    add("atan2", "broadcast_transposed", ["%a: f32[50, 3]", "%b: f32[50]"], ["%t = t(%a)", "%y = atan2(%t, %b)"], ["%y"])
    add("atan2", "i32_to_float", ["%a: i32[50]", "%b: i32[50]"], ["%y = atan2(%a, %b)"], ["%y"], ["%a: int -5..5", "%b: int -5..5"])
    add("atan2", "f16", ["%a: f16[50]", "%b: f16[50]"], ["%y = atan2(%a, %b)"], ["%y"])
    add("atan2_", "in_place", ["%a: f32[50]", "%b: f32[50]"], ["%c = clone(%a)", "%y = atan2_(%c, %b)"], ["%c"])
    add("logical_xor", "f32_i32", ["%a: f32[3, 5]", "%b: i32[5]"], ["%y = logical_xor(%a, %b)"], ["%y"],
        ["%a: int -1..2", "%b: int -1..2"])
    add("logical_xor", "bool", ["%a: bool[50]", "%b: bool[50]"], ["%y = logical_xor(%a, %b)"], ["%y"])
    add("logical_xor_", "in_place_bool", ["%a: bool[50]", "%b: bool[50]"], ["%c = clone(%a)", "%y = logical_xor_(%c, %b)"], ["%c"])
    # prod: all, one dim, zeros, integers (i64 results), f16
    add("prod", "all", ["%x: f32[40]"], ["%y = prod(%x)"], ["%y"], ["%x: uniform 0.5..1.5"])
    add("prod", "dim_keepdim", ["%x: f32[3, 5, 4]"], ["%y = prod(%x, 1, true)"], ["%y"])
    add("prod", "dim_transposed", ["%x: f32[5, 3]"], ["%t = t(%x)", "%y = prod(%t, -1)"], ["%y"])
    add("prod", "with_zeros", ["%x: f32[4, 6]"], ["%y = prod(%x, 0)"], ["%y"], ["%x: int -2..3"])
    add("prod", "i32_gives_int64", ["%x: i32[3, 6]"], ["%y = prod(%x, 1)"], ["%y"], ["%x: int -4..5"])
    add("prod", "bool_all", ["%x: bool[8]"], ["%y = prod(%x)"], ["%y"])
    add("prod", "f16_dtype_f32", ["%x: f16[3, 5]"], ["%y = prod(%x, 1, false, f32)"], ["%y"], ["%x: uniform 0.5..1.5"])
    add("prod", "0d", ["%x: f32[]"], ["%y = prod(%x)"], ["%y"])
    for op in ("any", "all"):
        add(op, "all_f32", ["%x: f32[3, 4]"], [f"%y = {op}(%x)"], ["%y"], ["%x: int 0..2"])
        add(op, "dim_bool", ["%x: bool[3, 4]"], [f"%y = {op}(%x, 1)"], ["%y"])
        add(op, "dims_keepdim_i32", ["%x: i32[2, 3, 4]"], [f"%y = {op}(%x, [0, 2], true)"], ["%y"], ["%x: int 0..2"])
        add(op, "dims_none", ["%x: f32[2, 3]"], [f"%y = {op}(%x, none)"], ["%y"], ["%x: int 0..2"])
    for op in ("var", "std"):
        add(op, "dim_unbiased", ["%x: f32[3, 50]"], [f"%y = {op}(%x, [1])"], ["%y"])
        add(op, "dim_biased_keepdim", ["%x: f32[2, 3, 5]"], [f"%y = {op}(%x, [0, 2], false, true)"], ["%y"])
    add("native_layer_norm", "three_results", ["%x: f32[2, 3, 8]", "%w: f32[3, 8]", "%b: f32[3, 8]"],
        ["%y, %m, %r = native_layer_norm(%x, [3, 8], %w, %b, 1e-5)"], ["%y", "%m", "%r"])
    add("native_layer_norm", "no_affine", ["%x: f32[4, 6]"], ["%y, %m, %r = native_layer_norm(%x, [6], none, none, 0.001)"],
        ["%y", "%m", "%r"])
    add("native_group_norm", "three_results", ["%x: f32[2, 6, 3, 4]", "%w: f32[6]", "%b: f32[6]"],
        ["%y, %m, %r = native_group_norm(%x, %w, %b, 2, 6, 12, 3, 1e-5)"], ["%y", "%m", "%r"])
    n = "_native_batch_norm_legit"
    add(n, "training_no_stats", ["%x: f32[3, 2, 5]", "%w: f32[2]", "%b: f32[2]"],
        [f"%y, %m, %r = {n}(%x, %w, %b, true, 0.1, 1e-5)"], ["%y", "%m", "%r"])
    add(n, "eval_running_stats", ["%x: f32[2, 3, 4]", "%w: f32[3]", "%b: f32[3]", "%m: f32[3]", "%v: f32[3]"],
        [f"%y, %s, %r = {n}(%x, %w, %b, %m, %v, false, 0.1, 1e-5)"], ["%y", "%s", "%r"], ["%v: uniform 0.5..2.0"])
    add("native_dropout", "eval", ["%x: f32[3, 5]"], ["%y, %m = native_dropout(%x, 0.5, false)"], ["%y", "%m"])
    add("native_dropout", "p_one", ["%x: f32[3, 5]"], ["%y, %m = native_dropout(%x, 1.0, true)"], ["%y", "%m"])
    add("scalar_tensor", "float", ["%x: f32[3]"], ["%s = scalar_tensor(2.5)", "%y = mul(%x, %s)"], ["%y"])
    add("scalar_tensor", "int_dtype", ["%x: i32[3]"], ["%s = scalar_tensor(4, i32)", "%y = add(%x, %s)"], ["%y"])
    add("empty", "then_filled", ["%x: f32[2, 3]"], ["%e = empty([2, 3])", "%f = copy_(%e, %x)", "%y = add(%e, 1)"], ["%y"],
        None, "eager leaves empty's values unspecified: written before read")
    add("empty_strided", "then_filled", ["%x: f32[2, 3]"], ["%e = empty_strided([2, 3], [3, 1])", "%f = fill_(%e, 2)", "%y = mul(%e, %x)"],
        ["%y"], None, "written before read")
    add("masked_scatter", "broadcast_mask", ["%x: f32[3, 4]", "%m: bool[4]", "%s: f32[20]"],
        ["%y = masked_scatter(%x, %m, %s)"], ["%y"])
    add("masked_scatter", "transposed_i32", ["%x: i32[4, 3]", "%m: bool[3, 4]", "%s: i32[2, 7]"],
        ["%t = t(%x)", "%y = masked_scatter(%t, %m, %s)"], ["%y"], ["%m: bool 0.4"])
    add("masked_scatter_", "in_place", ["%x: f32[2, 5]", "%m: bool[2, 5]", "%s: f32[10]"],
        ["%c = clone(%x)", "%y = masked_scatter_(%c, %m, %s)"], ["%c"])
    sr = "scatter_reduce"
    for red in ("sum", "prod", "mean", "amax", "amin"):
        for inc in ("true", "false"):
            add(sr, f"{red}_include_self_{inc}", ["%x: f32[4, 5]", "%i: i64[3, 5]", "%s: f32[3, 6]"],
                [f'%y = {sr}(%x, 0, %i, %s, "{red}", {inc})'], ["%y"], ["%i: int 0..4"])
    add(sr, "amax_dim1_narrow_index", ["%x: f32[3, 6]", "%i: i64[2, 4]", "%s: f32[3, 5]"],
        ['%y = scatter_reduce(%x, 1, %i, %s, "amax", false)'], ["%y"], ["%i: int 0..6"])
    add(sr, "mean_i32", ["%x: i32[5]", "%i: i64[7]", "%s: i32[7]"],
        ['%y = scatter_reduce(%x, 0, %i, %s, "mean")'], ["%y"], ["%i: int 0..5", "%x: int -9..9", "%s: int -9..9"])
    add(sr + "_", "prod_in_place", ["%x: f32[4, 3]", "%i: i64[4, 3]", "%s: f32[4, 3]"],
        ["%c = clone(%x)", '%y = scatter_reduce_(%c, 1, %i, %s, "prod")'], ["%c"], ["%i: int 0..3"])
    for pp in ("2.0", "1.0", "0.0", "inf", "3.0"):
        nm = pp.replace(".0", "").replace("inf", "inf")
        add("_cdist_forward", f"p{nm}", ["%a: f32[2, 5, 3]", "%b: f32[2, 4, 3]"],
            [f"%y = _cdist_forward(%a, %b, {pp}, none)"], ["%y"], ["%a: int -2..3", "%b: int -2..3"] if pp == "0.0" else None)
    add("cdist", "default_p", ["%a: f32[6, 4]", "%b: f32[3, 4]"], ["%y = cdist(%a, %b)"], ["%y"])
    add("_pdist_forward", "p2", ["%a: f32[6, 4]"], ["%y = _pdist_forward(%a)"], ["%y"])
    add("_pdist_forward", "p1_two_rows", ["%a: f32[2, 3]"], ["%y = _pdist_forward(%a, 1.0)"], ["%y"])
    add("pdist", "p3", ["%a: f32[5, 2]"], ["%y = pdist(%a, 3.0)"], ["%y"])
    add("round", "decimals_2", ["%x: f32[3, 50]"], ["%y = round(%x, 2)"], ["%y"])
    add("round", "decimals_minus_1", ["%x: f32[50]"], ["%s = mul(%x, 100)", "%y = round(%s, -1)"], ["%y"])
    add("round_", "decimals_1_in_place", ["%x: f32[50]"], ["%c = clone(%x)", "%y = round_(%c, 1)"], ["%c"])
    add("scaled_dot_product_attention", "fully_masked_row",
        ["%q: f32[1, 2, 4, 8]", "%k: f32[1, 2, 5, 8]", "%v: f32[1, 2, 5, 8]", "%m: bool[4, 5]"],
        ["%z = zeros([5], bool)", "%mm = select_scatter(%m, %z, 0, 1)",
         "%y = scaled_dot_product_attention(%q, %k, %v, %mm)"], ["%y"], None,
        "eager's safe softmax: zeros for the row no key is allowed in")
    gsm = "grid_sampler_2d"
    for mode, mname in ((0, "bilinear"), (1, "nearest"), (2, "bicubic")):
        for pad, pname in ((0, "zeros"), (1, "border"), (2, "reflection")):
            for align in ("false", "true"):
                add(gsm, f"{mname}_{pname}_align_{align}", ["%x: f32[2, 3, 5, 6]", "%g: f32[2, 4, 7, 2]"],
                    [f"%y = {gsm}(%x, %g, {mode}, {pad}, {align})"], ["%y"], ["%g: uniform -1.3..1.3"])
    add("grid_sampler", "bilinear_f16", ["%x: f16[1, 2, 4, 4]", "%g: f16[1, 3, 3, 2]"],
        ["%y = grid_sampler(%x, %g, 0, 0, false)"], ["%y"], ["%g: uniform -1.0..1.0"])
    add("affine_grid_generator", "align_false", ["%t: f32[2, 2, 3]"], ["%y = affine_grid_generator(%t, [2, 3, 4, 5], false)"], ["%y"])
    add("affine_grid_generator", "align_true_then_sample", ["%t: f32[1, 2, 3]", "%x: f32[1, 2, 5, 4]"],
        ["%g = affine_grid_generator(%t, [1, 2, 6, 3], true)", f"%y = {gsm}(%x, %g, 0, 1, true)"], ["%y"])
    # What real families put in the training IR beyond the core set.
    for op in ("clamp_min", "clamp_max"):
        add(op, "scalar", ["%x: f32[3, 50]"], [f"%y = {op}(%x, 0.25)"], ["%y"])
        add(op, "tensor_broadcast", ["%x: f32[3, 50]", "%b: f32[50]"], [f"%y = {op}(%x, %b)"], ["%y"])
        add(op + "_", "in_place_i32", ["%x: i32[20]"], ["%c = clone(%x)", f"%y = {op}_(%c, 1)"], ["%c"])
    add("rsub", "tensor_alpha", ["%x: f32[3, 50]", "%o: f32[50]"], ["%y = rsub(%x, %o, 2)"], ["%y"])
    add("rsub", "scalar", ["%x: f32[3, 50]"], ["%y = rsub(%x, 1)"], ["%y"])
    for op in ("selu", "celu", "log_sigmoid"):
        add(op, "f32", ["%x: f32[3, 50]"], [f"%y = {op}(%x)"], ["%y"], ["%x: uniform -6.0..6.0"])
    add("celu", "alpha_half", ["%x: f32[50]"], ["%y = celu(%x, 0.5)"], ["%y"], ["%x: uniform -6.0..6.0"])
    add("selu_", "in_place", ["%x: f32[50]"], ["%c = clone(%x)", "%y = selu_(%c)"], ["%c"])
    add("glu", "last_dim", ["%x: f32[3, 8]"], ["%y = glu(%x)"], ["%y"])
    add("glu", "dim0", ["%x: f32[6, 5]"], ["%y = glu(%x, 0)"], ["%y"])
    add("prelu", "channels", ["%x: f32[2, 3, 4, 5]", "%w: f32[3]"], ["%y = prelu(%x, %w)"], ["%y"])
    add("prelu", "one_weight", ["%x: f32[4, 6]", "%w: f32[1]"], ["%y = prelu(%x, %w)"], ["%y"])
    add("_prelu_kernel", "broadcast_weight", ["%x: f32[2, 3, 4]", "%w: f32[3, 1]"], ["%y = _prelu_kernel(%x, %w)"], ["%y"])
    add("pixel_shuffle", "factor2", ["%x: f32[2, 8, 3, 4]"], ["%y = pixel_shuffle(%x, 2)"], ["%y"])
    add("pixel_unshuffle", "factor3_unbatched", ["%x: f32[2, 6, 9]"], ["%y = pixel_unshuffle(%x, 3)"], ["%y"])
    add("one_hot", "classes5", ["%x: i64[2, 4]"], ["%y = one_hot(%x, 5)"], ["%y"], ["%x: int 0..5"])
    add("repeat_interleave", "dim1", ["%x: f32[2, 3]"], ["%y = repeat_interleave(%x, 3, 1)"], ["%y"])
    add("repeat_interleave", "flattened", ["%x: i32[2, 2]"], ["%y = repeat_interleave(%x, 2, none)"], ["%y"])
    add("argsort", "descending", ["%x: f32[3, 7]"], ["%y = argsort(%x, 1, true)"], ["%y"])
    add("argsort", "dim0", ["%x: f32[6, 4]"], ["%y = argsort(%x, 0)"], ["%y"])
    add("cumprod", "last_dim", ["%x: f32[3, 6]"], ["%y = cumprod(%x, 1)"], ["%y"], ["%x: uniform 0.5..1.5"])
    add("cumprod", "dim0_zeros", ["%x: f32[5, 3]"], ["%y = cumprod(%x, 0)"], ["%y"], ["%x: int -2..3"])
    add("cumprod", "i32_to_int64", ["%x: i32[6]"], ["%y = cumprod(%x, 0)"], ["%y"], ["%x: int -3..4"])
    add("cumprod_", "in_place", ["%x: f32[4, 5]"], ["%c = clone(%x)", "%y = cumprod_(%c, 1)"], ["%c"])
    add("meshgrid", "ij", ["%a: f32[3]", "%b: f32[4]", "%c: f32[2]"], ["%x, %y, %z = meshgrid([%a, %b, %c])"], ["%x", "%y", "%z"])
    add("meshgrid", "xy", ["%a: f32[3]", "%b: f32[4]"], ['%x, %y = meshgrid([%a, %b], "xy")'], ["%x", "%y"])
    add("instance_norm", "input_stats", ["%x: f32[2, 3, 4, 5]", "%w: f32[3]", "%b: f32[3]"],
        ["%y = instance_norm(%x, %w, %b, none, none, true, 0.1, 1e-5, false)"], ["%y"])
    add("instance_norm", "running_stats", ["%x: f32[2, 3, 6]", "%m: f32[3]", "%v: f32[3]"],
        ["%y = instance_norm(%x, none, none, %m, %v, false, 0.1, 1e-5, false)"], ["%y"], ["%v: uniform 0.5..2.0"])
    add("_weight_norm_interface", "dim0", ["%v: f32[4, 3, 2]", "%g: f32[4, 1, 1]"], ["%w, %n = _weight_norm_interface(%v, %g, 0)"], ["%w", "%n"])
    add("_weight_norm", "last_dim", ["%v: f32[4, 3]", "%g: f32[1, 3]"], ["%w = _weight_norm(%v, %g, 1)"], ["%w"])
    for ordv, nm in (("2", "2"), ("1", "1"), ("inf", "inf"), ("-inf", "minus_inf"), ("0", "0"), ("3.5", "3_5")):
        add("linalg_vector_norm", f"ord_{nm}", ["%x: f32[3, 6]"], [f"%y = linalg_vector_norm(%x, {ordv}, [1])"], ["%y"],
            ["%x: int -2..3"] if nm == "0" else None)
    add("linalg_vector_norm", "all_keepdim", ["%x: f32[2, 3, 4]"], ["%y = linalg_vector_norm(%x, 2, none, true)"], ["%y"])
    # Math composites (issue 74's OpInfo sweep).
    add("logaddexp", "with_infinities", ["%a: f32[3, 5]", "%b: f32[5]"],
        ["%i = full([5], -inf)", "%c = cat([%b, %i])", "%d = narrow(%c, 0, 3, 5)", "%y = logaddexp(%a, %d)",
         "%z = logaddexp(%i, %i)"], ["%y", "%z"], ["%a: uniform -30.0..30.0"])
    add("logaddexp2", "broadcast", ["%a: f32[3, 5]", "%b: f32[5]"], ["%y = logaddexp2(%a, %b)"], ["%y"])
    add("addcmul", "value", ["%s: f32[3, 4]", "%a: f32[3, 4]", "%b: f32[4]"], ["%y = addcmul(%s, %a, %b, 0.5)"], ["%y"])
    add("addcdiv", "default", ["%s: f32[3, 4]", "%a: f32[3, 4]", "%b: f32[3, 4]"], ["%y = addcdiv(%s, %a, %b)"], ["%y"],
        ["%b: uniform 0.5..2.0"])
    add("addcmul_", "in_place", ["%s: f32[4]", "%a: f32[4]", "%b: f32[4]"], ["%c = clone(%s)", "%y = addcmul_(%c, %a, %b, 2)"], ["%c"])
    for op in ("fmax", "fmin"):
        add(op, "nans", ["%a: f32[6]", "%b: f32[6]"],
            ["%z = zeros([2])", "%n = div(%z, %z)", "%c = narrow(%a, 0, 0, 4)", "%an = cat([%c, %n])",
             "%d = narrow(%b, 0, 0, 3)", "%e = narrow(%n, 0, 0, 1)", "%f = narrow(%b, 0, 4, 2)", "%bn = cat([%d, %e, %f])",
             f"%y = {op}(%an, %bn)"], ["%y"])
    add("heaviside", "zeros_in_input", ["%x: f32[8]", "%v: f32[8]"], ["%y = heaviside(%x, %v)"], ["%y"], ["%x: int -2..3"])
    add("isclose", "tolerances", ["%a: f32[20]", "%b: f32[20]"], ["%c = add(%a, %b)", "%y = isclose(%a, %c, 0.1, 0.5)"], ["%y"],
        ["%b: uniform -0.3..0.3"])
    add("ldexp", "ints", ["%x: f32[6]", "%e: i32[6]"], ["%y = ldexp(%x, %e)"], ["%y"], ["%e: int -3..4"])
    add("addmv", "beta_alpha", ["%s: f32[3]", "%m: f32[3, 4]", "%v: f32[4]"], ["%y = addmv(%s, %m, %v, 0.5, 2)"], ["%y"])
    add("addr", "default", ["%s: f32[3, 4]", "%a: f32[3]", "%b: f32[4]"], ["%y = addr(%s, %a, %b)"], ["%y"])
    add("addbmm", "beta0", ["%s: f32[3, 5]", "%a: f32[2, 3, 4]", "%b: f32[2, 4, 5]"], ["%y = addbmm(%s, %a, %b, 0)"], ["%y"])
    add("var_mean", "dim_correction0", ["%x: f32[3, 6]"], ["%v, %m = var_mean(%x, [1], 0, true)"], ["%v", "%m"])
    add("std_mean", "all", ["%x: f32[3, 6]"], ["%v, %m = std_mean(%x)"], ["%v", "%m"])
    add("aminmax", "dim", ["%x: f32[3, 6]"], ["%a, %b = aminmax(%x, 1)"], ["%a", "%b"])
    add("aminmax", "all", ["%x: i32[3, 6]"], ["%a, %b = aminmax(%x)"], ["%a", "%b"])
    add("kthvalue", "dim0_keepdim", ["%x: f32[5, 3]"], ["%v, %i = kthvalue(%x, 2, 0, true)"], ["%v", "%i"])
    for op in ("cummax", "cummin"):
        add(op, "ties", ["%x: f32[3, 7]"], [f"%v, %i = {op}(%x, 1)"], ["%v", "%i"], ["%x: int -2..3"])
        add(op, "dim0_i32", ["%x: i32[6, 2]"], [f"%v, %i = {op}(%x, 0)"], ["%v", "%i"])
    add("_softmax_backward_data", "last", ["%g: f32[3, 5]", "%x: f32[3, 5]"],
        ["%y = softmax(%x, 1)", "%d = _softmax_backward_data(%g, %y, 1, f32)"], ["%d"])
    add("_log_softmax_backward_data", "dim0", ["%g: f32[4, 3]", "%x: f32[4, 3]"],
        ["%y = log_softmax(%x, 0)", "%d = _log_softmax_backward_data(%g, %y, 0, f32)"], ["%d"])
    add("nll_loss", "weight_ignore", ["%x: f32[5, 4]", "%t: i64[5]", "%w: f32[4]"],
        ["%l = log_softmax(%x, 1)", "%y = nll_loss(%l, %t, %w, 1, 2)"], ["%y"], ["%t: int 0..4", "%w: uniform 0.5..2.0"])
    add("nll_loss", "none_2d", ["%x: f32[2, 3, 4, 5]", "%t: i64[2, 4, 5]"],
        ["%y = nll_loss2d(%x, %t, none, 0)"], ["%y"], ["%t: int 0..3"])
    add("nll_loss_forward", "sum", ["%x: f32[6, 3]", "%t: i64[6]"], ["%y, %w = nll_loss_forward(%x, %t, none, 2, -100)"],
        ["%y", "%w"], ["%t: int 0..3"])
    add("cross_entropy_loss", "indices_smoothing", ["%x: f32[5, 4]", "%t: i64[5]"],
        ["%y = cross_entropy_loss(%x, %t, none, 1, -100, 0.1)"], ["%y"], ["%t: int 0..4"])
    add("cross_entropy_loss", "probabilities_weight", ["%x: f32[3, 4, 2]", "%p: f32[3, 4, 2]", "%w: f32[4]"],
        ["%q = softmax(%p, 1)", "%y = cross_entropy_loss(%x, %q, %w, 2)"], ["%y"])
    add("linspace", "steps7", ["%x: f32[7]"], ["%l = linspace(-1.5, 2, 7)", "%y = add(%x, %l)"], ["%y"])
    add("linspace", "one_step_i32", ["%x: i32[1]"], ["%l = linspace(3, 9, 1, i32)", "%y = add(%x, %l)"], ["%y"])
    add("logspace", "base2", ["%x: f32[5]"], ["%l = logspace(-2, 2, 5, 2.0)", "%y = mul(%x, %l)"], ["%y"])
    add("broadcast_tensors", "three", ["%a: f32[3, 1]", "%b: f32[4]", "%c: f32[1, 1]"], ["%x, %y, %z = broadcast_tensors([%a, %b, %c])"],
        ["%x", "%y", "%z"])
    add("diag", "vector_offset", ["%x: f32[4]"], ["%y = diag(%x, 1)"], ["%y"])
    add("diag", "matrix_below", ["%x: f32[4, 5]"], ["%y = diag(%x, -1)"], ["%y"])
    add("diag_embed", "batched_offset", ["%x: f32[2, 3]"], ["%y = diag_embed(%x, -1)"], ["%y"])
    add("diag_embed", "dims", ["%x: f32[2, 3]"], ["%y = diag_embed(%x, 0, 0, 2)"], ["%y"])
    add("linalg_cross", "broadcast", ["%a: f32[4, 3]", "%b: f32[1, 3]"], ["%y = linalg_cross(%a, %b)"], ["%y"])
    add("cross", "dim0", ["%a: f32[3, 4]", "%b: f32[3, 4]"], ["%y = cross(%a, %b, 0)"], ["%y"])
    add("cosine_similarity", "dim1", ["%a: f32[4, 6]", "%b: f32[4, 6]"], ["%y = cosine_similarity(%a, %b)"], ["%y"])
    add("pairwise_distance", "p1_keepdim", ["%a: f32[4, 6]", "%b: f32[4, 6]"], ["%y = pairwise_distance(%a, %b, 1, 1e-6, true)"], ["%y"])
    add("max_unpool2d", "from_pool", ["%x: f32[2, 3, 6, 8]"],
        ["%y, %i = max_pool2d_with_indices(%x, 2)", "%u = max_unpool2d(%y, %i, [6, 8])"], ["%u"])
    add("index_reduce", "prod_exclude_self", ["%x: f32[5, 3]", "%i: i64[4]", "%s: f32[4, 3]"],
        ['%y = index_reduce(%x, 0, %i, %s, "prod", false)'], ["%y"], ["%i: int 0..5"])
    add("index_reduce", "amax_dim1", ["%x: f32[3, 5]", "%i: i64[4]", "%s: f32[3, 4]"],
        ['%y = index_reduce(%x, 1, %i, %s, "amax")'], ["%y"], ["%i: int 0..5"])
    es = "einsum"
    add(es, "matmul", ["%a: f32[3, 4]", "%b: f32[4, 5]"], [f'%y = {es}("ij,jk->ik", [%a, %b])'], ["%y"])
    add(es, "attention_scores", ["%q: f32[2, 3, 4, 8]", "%k: f32[2, 3, 5, 8]"], [f'%y = {es}("bhqd,bhkd->bhqk", [%q, %k])'], ["%y"])
    add(es, "implicit_output_outer", ["%a: f32[3]", "%b: f32[4]"], [f'%y = {es}("i,j", [%a, %b])'], ["%y"])
    add(es, "trace_and_diagonal", ["%a: f32[4, 4]"], [f'%t = {es}("ii", [%a])', f'%d = {es}("ii->i", [%a])'], ["%t", "%d"])
    add(es, "ellipsis_batch", ["%a: f32[2, 3, 4, 5]", "%b: f32[5, 6]"], [f'%y = {es}("...ij,jk->...ik", [%a, %b])'], ["%y"])
    add(es, "three_operands", ["%a: f32[3, 4]", "%b: f32[4, 5]", "%c: f32[5, 2]"], [f'%y = {es}("ij,jk,kl->il", [%a, %b, %c])'], ["%y"])
    add(es, "sum_and_transpose", ["%a: f32[3, 4, 5]"], [f'%y = {es}("ijk->kj", [%a])'], ["%y"])
    add(es, "bilinear", ["%a: f32[2, 3]", "%w: f32[4, 3, 5]", "%b: f32[2, 5]"], [f'%y = {es}("bi,oij,bj->bo", [%a, %w, %b])'], ["%y"])
    add("im2col", "dilation_padding_stride", ["%x: f32[2, 3, 7, 6]"], ["%y = im2col(%x, [3, 2], [2, 1], [1, 0], [2, 1])"], ["%y"])
    add("col2im", "overlapping", ["%c: f32[2, 12, 20]"], ["%y = col2im(%c, [5, 6], [2, 2], [1, 1], [0, 0], [1, 1])"], ["%y"])
    add("col2im", "strided_padded_unbatched", ["%c: f32[8, 16]"], ["%y = col2im(%c, [6, 7], [2, 2], [1, 2], [1, 1], [2, 2])"], ["%y"])
    add("threshold", "f32", ["%x: f32[3, 50]"], ["%y = threshold(%x, 0.5, -1)"], ["%y"])
    add("threshold_", "in_place", ["%x: f32[50]"], ["%c = clone(%x)", "%y = threshold_(%c, 0, 0)"], ["%c"])
    add("softshrink", "lambd", ["%x: f32[3, 50]"], ["%y = softshrink(%x, 0.7)"], ["%y"])
    add("hardshrink", "default", ["%x: f32[3, 50]"], ["%y = hardshrink(%x)"], ["%y"])
    add("sinc", "with_zero", ["%x: f32[50]"], ["%z = zeros([1])", "%c = cat([%x, %z])", "%y = sinc(%c)"], ["%y"])
    add("sinc_", "in_place", ["%x: f32[50]"], ["%c = clone(%x)", "%y = sinc_(%c)"], ["%c"])
    add("exp2", "f32_and_int", ["%x: f32[50]", "%i: i32[6]"], ["%y = exp2(%x)", "%z = exp2(%i)"], ["%y", "%z"], ["%i: int -3..4"])
    add("exp2_", "in_place", ["%x: f32[50]"], ["%c = clone(%x)", "%y = exp2_(%c)"], ["%c"])
    add("copysign", "zeros_and_scalar", ["%x: f32[6]", "%o: f32[6]"],
        ["%z = zeros([2])", "%nz = neg(%z)", "%oc = cat([%o, %z, %nz])", "%xc = cat([%x, %x])", "%xs = narrow(%xc, 0, 0, 10)",
         "%y = copysign(%xs, %oc)", "%w = copysign(%x, -1.5)"], ["%y", "%w"])
    add("copysign_", "in_place", ["%x: f32[6]", "%o: f32[6]"], ["%c = clone(%x)", "%y = copysign_(%c, %o)"], ["%c"])
    add("rot90", "k1_default", ["%x: f32[3, 4]"], ["%y = rot90(%x)"], ["%y"])
    add("rot90", "k3_dims", ["%x: f32[2, 3, 4]"], ["%y = rot90(%x, 3, [2, 0])"], ["%y"])
    add("rot90", "k2_negative", ["%x: f32[2, 3]"], ["%y = rot90(%x, -2)"], ["%y"])
    add("sum_to_size", "leading_and_ones", ["%x: f32[2, 3, 4]"], ["%y = sum_to_size(%x, [3, 1])"], ["%y"])
    # In-place forms and the overloads' other names.
    add("celu_", "in_place", ["%x: f32[50]"], ["%c = clone(%x)", "%y = celu_(%c, 2.0)"], ["%c"])
    add("addcdiv_", "in_place", ["%s: f32[4]", "%a: f32[4]", "%b: f32[4]"], ["%c = clone(%s)", "%y = addcdiv_(%c, %a, %b, 0.5)"], ["%c"],
        ["%b: uniform 0.5..2.0"])
    add("heaviside_", "in_place", ["%x: f32[8]", "%v: f32[8]"], ["%c = clone(%x)", "%y = heaviside_(%c, %v)"], ["%c"], ["%x: int -2..3"])
    add("addmv_", "in_place", ["%s: f32[3]", "%m: f32[3, 4]", "%v: f32[4]"], ["%c = clone(%s)", "%y = addmv_(%c, %m, %v)"], ["%c"])
    add("addr_", "in_place", ["%s: f32[3, 4]", "%a: f32[3]", "%b: f32[4]"], ["%c = clone(%s)", "%y = addr_(%c, %a, %b, 2, 0.5)"], ["%c"])
    add("addbmm_", "in_place", ["%s: f32[3, 5]", "%a: f32[2, 3, 4]", "%b: f32[2, 4, 5]"], ["%c = clone(%s)", "%y = addbmm_(%c, %a, %b)"], ["%c"])
    add("index_reduce_", "mean_in_place", ["%x: f32[5, 3]", "%i: i64[4]", "%s: f32[4, 3]"],
        ["%c = clone(%x)", '%y = index_reduce_(%c, 0, %i, %s, "mean")'], ["%c"], ["%i: int 0..5"])
    add("nll_loss_nd", "3d", ["%x: f32[2, 3, 4]", "%t: i64[2, 4]"], ["%y = nll_loss_nd(%x, %t)"], ["%y"], ["%t: int 0..3"])
    add("nll_loss2d_forward", "mean", ["%x: f32[2, 3, 4, 2]", "%t: i64[2, 4, 2]"],
        ["%y, %w = nll_loss2d_forward(%x, %t, none, 1, -100)"], ["%y", "%w"], ["%t: int 0..3"])
    add("max_unpool3d", "from_pool", ["%x: f32[1, 2, 4, 4, 6]"],
        ["%y, %i = max_pool3d_with_indices(%x, 2)", "%u = max_unpool3d(%y, %i, [4, 4, 6], [2, 2, 2], [0, 0, 0])"], ["%u"])
    # Backward ops of joint graphs, at the forward op's own arguments.
    cb = "convolution_backward"
    add(cb, "stride_padding_bias", ["%x: f32[2, 3, 7, 6]", "%w: f32[4, 3, 3, 3]", "%g: f32[2, 4, 4, 6]"],
        [f"%gi, %gw, %gb = {cb}(%g, %x, %w, [4], [2, 1], [1, 1], [1, 1], false, [0, 0], 1, [true, true, true])"],
        ["%gi", "%gw", "%gb"])
    add(cb, "groups_dilation", ["%x: f32[1, 4, 8, 8]", "%w: f32[6, 2, 3, 3]", "%g: f32[1, 6, 8, 8]"],
        [f"%gi, %gw, %gb = {cb}(%g, %x, %w, none, [1, 1], [2, 2], [2, 2], false, [0, 0], 2, [true, true, false])"],
        ["%gi", "%gw"])
    add(cb, "transposed", ["%x: f32[1, 4, 5, 5]", "%w: f32[4, 2, 3, 3]", "%g: f32[1, 2, 10, 10]"],
        [f"%gi, %gw, %gb = {cb}(%g, %x, %w, [2], [2, 2], [1, 1], [1, 1], true, [1, 1], 1, [true, true, true])"],
        ["%gi", "%gw", "%gb"])
    add("avg_pool2d_backward", "include_pad", ["%x: f32[2, 3, 7, 8]", "%g: f32[2, 3, 4, 4]"],
        ["%y = avg_pool2d_backward(%g, %x, [3, 3], [2, 2], [1, 1], false, true, none)"], ["%y"])
    add("avg_pool2d_backward", "ceil_exclude_pad", ["%x: f32[1, 2, 7, 6]", "%g: f32[1, 2, 4, 4]"],
        ["%y = avg_pool2d_backward(%g, %x, [3, 3], [2, 2], [1, 1], true, false, none)"], ["%y"])
    add("_adaptive_avg_pool2d_backward", "unequal", ["%x: f32[2, 3, 7, 5]", "%g: f32[2, 3, 3, 2]"],
        ["%y = _adaptive_avg_pool2d_backward(%g, %x)"], ["%y"])
    add("max_pool2d_with_indices_backward", "padding_stride", ["%x: f32[2, 3, 9, 8]", "%g: f32[2, 3, 5, 4]"],
        ["%y, %i = max_pool2d_with_indices(%x, 3, 2, 1)",
         "%d = max_pool2d_with_indices_backward(%g, %x, [3, 3], [2, 2], [1, 1], [1, 1], false, %i)"], ["%d"])
    add("max_pool2d_with_indices_backward", "overlapping_unbatched", ["%x: f32[3, 6, 7]", "%g: f32[3, 5, 6]"],
        ["%y, %i = max_pool2d_with_indices(%x, 2, 1)",
         "%d = max_pool2d_with_indices_backward(%g, %x, [2, 2], [1, 1], [0, 0], [1, 1], false, %i)"], ["%d"])
    e = "embedding_dense_backward"
    add(e, "padding_idx", ["%g: f32[2, 5, 4]", "%i: i64[2, 5]"], [f"%y = {e}(%g, %i, 6, 2, false)"], ["%y"], ["%i: int 0..6"])
    add(e, "scale_grad_by_freq", ["%g: f32[7, 3]", "%i: i64[7]"], [f"%y = {e}(%g, %i, 5, -1, true)"], ["%y"], ["%i: int 0..5"])
    add("native_layer_norm_backward", "affine", ["%x: f32[2, 3, 8]", "%w: f32[3, 8]", "%b: f32[3, 8]", "%g: f32[2, 3, 8]"],
        ["%y, %m, %r = native_layer_norm(%x, [3, 8], %w, %b, 1e-5)",
         "%gi, %gw, %gb = native_layer_norm_backward(%g, %x, [3, 8], %m, %r, %w, %b, [true, true, true])"],
        ["%gi", "%gw", "%gb"])
    add("native_layer_norm_backward", "no_affine", ["%x: f32[4, 6]", "%g: f32[4, 6]"],
        ["%y, %m, %r = native_layer_norm(%x, [6], none, none, 0.001)",
         "%gi, %gw, %gb = native_layer_norm_backward(%g, %x, [6], %m, %r, none, none, [true, false, false])"],
        ["%gi"])
    add("native_group_norm_backward", "affine", ["%x: f32[2, 6, 3, 4]", "%w: f32[6]", "%b: f32[6]", "%g: f32[2, 6, 3, 4]"],
        ["%y, %m, %r = native_group_norm(%x, %w, %b, 2, 6, 12, 3, 1e-5)",
         "%gi, %gw, %gb = native_group_norm_backward(%g, %x, %m, %r, %w, 2, 6, 12, 3, [true, true, true])"],
        ["%gi", "%gw", "%gb"])
    add("_adaptive_avg_pool3d", "mixed", ["%x: f32[1, 2, 4, 5, 6]"], ["%y = _adaptive_avg_pool3d(%x, [2, 3, 4])"], ["%y"])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("ops", nargs="*", help="only these ops' programs (folder names under tests/programs/ops/)")
    ap.add_argument("--list", action="store_true", help="print the case names only")
    ap.add_argument("--check", action="store_true", help="compare with the files on disk, write nothing")
    a = ap.parse_args(argv)
    cases = generate()
    known = {k.split("/")[0] for k in cases}
    unknown = [o for o in a.ops if o not in known]
    if unknown:
        print(f"no cases for {', '.join(unknown)}: add them to {Path(__file__).name}", file=sys.stderr)
        return 2
    chosen = set(a.ops) or known
    cases = {k: v for k, v in cases.items() if k.split("/")[0] in chosen}
    if a.list:
        for k in cases:
            print(k)
        return 0
    header = "# generated by tests/torch_ref/gen_op_programs.py: edit the cases there\n"
    wanted = set()
    changed = []
    for key, text in cases.items():
        path = OUT / f"{key}.txt"
        wanted.add(path)
        body = header + text
        if not path.exists() or path.read_text() != body:
            changed.append(path)
            if not a.check:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(body)
    # Programs of the chosen ops that this script does not write: reported,
    # never deleted (hand-written or stale: the author decides).
    unknown_files = [
        f for f in sorted(OUT.rglob("*.txt"))
        if f.relative_to(OUT).parts[0] in chosen and f not in wanted
    ]
    rel = lambda f: f.relative_to(REPO).as_posix()  # noqa: E731
    for f in unknown_files:
        print(f"not generated here (remove it or add its case): {rel(f)}")
    if a.check:
        for f in changed:
            print(f"differs from what the cases give: {rel(f)}")
        print(f"checked {len(cases)} programs for {len(chosen)} ops: {len(changed)} differ, "
              f"{len(unknown_files)} not generated here")
        return 1 if changed or unknown_files else 0
    print(f"{len(cases)} programs for {len(chosen)} ops in {OUT.relative_to(REPO)}/: "
          f"{len(changed)} written, {len(unknown_files)} not generated here")
    return 0


if __name__ == "__main__":
    sys.exit(main())
