"""Self-tests of the reference runner: python3 -m unittest tests/torch_ref/test_kiln_torch.py"""

import math
import sys
import unittest
from pathlib import Path

import torch

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, str(Path(__file__).resolve().parent))
import kiln_torch as kt  # noqa: E402


def run(text, **inputs):
    prog = kt.parse_program(text)
    outs, params = kt.run_program(prog, inputs)
    return kt.output_dict(outs, params)


class ParseTests(unittest.TestCase):
    def test_literals(self):
        p = kt.parse_program(
            '# c\ngraph g(%a: f32[2, 2], %b: bool[]) {  # trailing\n'
            '  %x = foo(%a, -1, 1.0, 1e-5, inf, -inf, nan, true, false, none, "t#h", [2, -1], [%a, none], f16, u32)\n'
            '  bar(%x)\n'
            '  return ()\n}\n'
        )
        self.assertEqual([p_.shape for p_ in p.params], [[2, 2], []])
        self.assertEqual(p.params[1].dtype, torch.bool)
        args = p.stmts[0].args
        self.assertEqual(args[1:4], [-1, 1.0, 1e-5])
        self.assertIsInstance(args[1], int)
        self.assertEqual(args[4], math.inf)
        self.assertEqual(args[5], -math.inf)
        self.assertTrue(math.isnan(args[6]))
        self.assertEqual(args[7:11], [True, False, None, "t#h"])
        self.assertEqual(args[11], [2, -1])
        self.assertEqual(args[12][1], None)
        self.assertEqual(args[13], kt.DType(torch.float16))
        self.assertEqual(args[14], kt.DType(torch.uint32))
        self.assertEqual(p.stmts[1].results, [])
        self.assertEqual(p.returns, [])

    def test_parse_error_has_line_and_column(self):
        with self.assertRaises(kt.ParseError) as cm:
            kt.parse_program("graph g(%a: f32[2]) {\n  %b = add(%a, 1\n  return %b\n}\n")
        self.assertEqual((cm.exception.line, cm.exception.col), (3, 3))

    def test_undefined_and_redefined(self):
        with self.assertRaises(kt.ParseError):
            kt.parse_program("graph g(%a: f32[2]) {\n  return %c\n}")
        with self.assertRaises(kt.ParseError):
            kt.parse_program("graph g(%a: f32[2]) {\n  %a = neg(%a)\n  return %a\n}")


class RunTests(unittest.TestCase):
    def test_overloads_and_aliasing(self):
        a = torch.arange(4.0).view(2, 2)
        out = run(
            "graph g(%a: f32[2, 2]) {\n"
            "  %b = add(%a, 1)\n"            # add.Scalar
            "  %c = view(%b, [-1])\n"
            "  %d = add_(%c, %c)\n"          # add_.Tensor through a view
            "  %e = pow(2.0, %a)\n"          # pow.Scalar
            "  %s = sum(%a, [1], true)\n"
            "  return (%b, %e, %s)\n}\n",
            a=a,
        )
        self.assertTrue(torch.equal(out["output.0"], (a + 1) * 2))
        self.assertTrue(torch.equal(out["output.1"], 2.0 ** a))
        self.assertEqual(list(out["output.2"].shape), [2, 1])

    def test_int64_written_as_int32(self):
        out = run("graph g(%a: i32[3]) {\n  %s = sum(%a)\n  %r = arange(0, 4)\n  return (%s, %r)\n}\n",
                  a=torch.tensor([1, 2, 3], dtype=torch.int32))
        self.assertEqual(out["output.0"].dtype, torch.int32)
        self.assertEqual(out["output.0"].item(), 6)
        self.assertEqual(out["output.1"].dtype, torch.int32)

    def test_mutated_parameter_is_written(self):
        out = run("graph g(%a: f32[2, 3]) {\n  %t = t(%a)\n  %r = select(%t, 0, 1)\n  %z = zero_(%r)\n  return %t\n}\n",
                  a=torch.ones(2, 3))
        self.assertTrue(torch.equal(out["a"], torch.tensor([[1.0, 0, 1], [1, 0, 1]])))
        self.assertTrue(out["output.0"].is_contiguous())

    def test_non_aten_ops_are_refused(self):
        # A functionalized program must be runnable by PyTorch itself: no
        # `<view>_copy` that ATen lacks.
        with self.assertRaises(kt.KilnError):
            run("graph g(%a: f32[2, 3]) {\n  %r = reshape_copy(%a, [3, 2])\n  return %r\n}\n", a=torch.ones(2, 3))

    def test_kwarg_only_given_positionally(self):
        x = torch.randn(5)
        out = run('graph g(%x: f32[5]) {\n  %y = gelu(%x, "tanh")\n  %d = div(%x, 2, "floor")\n  return (%y, %d)\n}\n', x=x)
        self.assertTrue(torch.allclose(out["output.0"], torch.nn.functional.gelu(x, approximate="tanh")))
        self.assertTrue(torch.equal(out["output.1"], torch.div(x, 2, rounding_mode="floor")))

    def test_errors(self):
        with self.assertRaises(kt.KilnError):
            run("graph g(%a: f32[2]) {\n  %b = frobnicate(%a)\n  return %b\n}\n", a=torch.ones(2))
        with self.assertRaises(kt.KilnError):
            run("graph g(%a: i32[2]) {\n  %b = add_(%a, 1.5)\n  return %b\n}\n", a=torch.ones(2, dtype=torch.int32))
        with self.assertRaises(kt.KilnError):
            run("graph g(%a: f32[2]) {\n  return %a\n}\n", a=torch.ones(3))
        with self.assertRaises(kt.KilnError):
            run("graph g(%a: f32[3]) {\n  %p, %q = unbind(%a)\n  return %p\n}\n", a=torch.ones(3))


if __name__ == "__main__":
    unittest.main()
