//! Row kernels (`chain::chain_rows`): an invocation per block of rows
//! computes each value of the kernel over its block in order, holding the
//! block in a function-scope array that later values read instead of
//! memory, storing the values something outside reads.

use super::matmul::Operand;
use super::{bug, u, Gen, KernelCode, R};
use crate::chain::{link, Link};
use crate::schedule::Fused;
use crate::wgsl::{self, cast, ty};
use kiln_functionalize::graph::{Def, ValueId};
use kiln_functionalize::meta::numel;
use kiln_functionalize::DType;

impl Gen<'_> {
    /// The row kernel computing `grp` in `rows` blocks.
    pub fn row_chain(&mut self, grp: &[ValueId], rows: usize) -> R<KernelCode> {
        let g = self.g;
        // Each invocation stores whole blocks, in order: whole packed
        // words (`chain::rows_of` keeps packed blocks whole words).
        self.owns_words = true;
        self.body
            .stmt(format!("if (gid >= {}) {{ return; }}", u(rows)));
        // Loop bounds times a 1 the shader compiler cannot see: constant
        // bounds of nested loops get unrolled whole (lavapipe's LLVM took
        // minutes over a ViT's row kernels).
        self.body.stmt("let cn: u32 = min(nwg.x, 1u);".into());
        for (i, &v) in grp.iter().enumerate() {
            let (l, _) = link(g, self.s, v).ok_or_else(|| bug("a row kernel value of no kind"))?;
            let m = self.meta(v);
            let width = m.numel() / rows;
            let arr = format!("rk{i}");
            self.body
                .stmt(format!("var {arr}: array<{}, {width}>;", ty(m.dtype)));
            let base = self.body.bind("u32", format!("gid * {}", u(width)));
            self.resident.insert(v, (arr, base.clone()));
            self.filling = Some(v);
            match l {
                Link::Map => self.chain_map(v, &base, width)?,
                Link::Product(n) => self.chain_product(n, v, width)?,
                Link::Softmax(n) => {
                    let node = &g.nodes[n];
                    let input = *node.args[0].tensors()[0];
                    let log = matches!(
                        node.op.def().lowering,
                        kiln_functionalize::ops::Lowering::Softmax { log: true }
                    );
                    let len = *self.meta(input).sizes.last().unwrap_or(&1);
                    self.with_tail(n, v, |s, r| {
                        s.chain_lines(width / len.max(1), len, |s, lb| {
                            s.softmax_line(input, r, log, lb, len, 1)
                        })
                    })?;
                }
                Link::Reduce(n) => {
                    let r = g.nodes[n].results[0];
                    let lines = self.meta(r).numel() / rows;
                    let margs: Vec<_> = g.nodes[n]
                        .args
                        .iter()
                        .map(|a| a.map(&mut |x| g.meta(*x)))
                        .collect();
                    let over_rows = matches!(self.s.fused.get(&v), Some(Fused::Rows { .. }));
                    if over_rows {
                        self.rows = Some((r, v));
                    }
                    let tail = if over_rows { r } else { v };
                    let out = self.with_tail(n, tail, |s, r| {
                        s.body.stmt(format!(
                            "for (var co = 0u; co < {} * cn; co = co + 1u) {{",
                            u(lines)
                        ));
                        let saved = std::mem::take(&mut s.memo);
                        let oi = s.body.bind("u32", format!("gid * {} + co", u(lines)));
                        s.reduce_at(n, r, &margs, &oi)?;
                        s.body.stmt("}".into());
                        s.memo = saved;
                        Ok(())
                    });
                    self.rows = None;
                    out?;
                }
                Link::LayerNorm(n) => {
                    let (_, len, ..) = self.layer_norm_args(n)?;
                    self.with_tail(n, v, |s, r| {
                        s.chain_lines(width / len.max(1), len, |s, lb| s.layer_norm_row(n, r, lb))
                    })?;
                }
            }
            self.filling = None;
            self.memo.clear();
        }
        // Stores last: a value may be stored over an input dying here
        // (`lower::reuse_dying_inputs`), which every value reads first.
        for &v in grp {
            if self.registers.contains(&v) {
                continue;
            }
            let (arr, base) = self.resident[&v].clone();
            let width = self.meta(v).numel() / rows;
            self.body.stmt(format!(
                "for (var cj = 0u; cj < {} * cn; cj = cj + 1u) {{",
                u(width)
            ));
            let mut at = self.body.bind("u32", format!("{base} + cj"));
            // Held in its product's order: stored through the copies.
            for &p in self.s.permuted.get(&v).into_iter().flatten() {
                at = self.permuted_index(p, &at)?;
            }
            self.store_plain(v, &at, &format!("{arr}[cj]"))?;
            self.body.stmt("}".into());
        }
        self.resident.clear();
        let label = grp
            .iter()
            .map(|&v| {
                let name = g.values[v].name.clone().unwrap_or_default();
                match g.node_of(v) {
                    Some(n) => format!("{}#{name}", g.nodes[n].op.name()),
                    None => name.to_string(),
                }
            })
            .collect::<Vec<_>>()
            .join(" > ");
        Ok(self.finish(
            format!("rows: {label}"),
            wgsl::grid(rows, self.workgroup),
            [self.workgroup, 1, 1],
        ))
    }

    /// Runs `f` with the kernel's result `r` of node `n`, its elementwise
    /// tail `v` stored in its place where `v` is no `r` (`Fused::Epilogue`).
    fn with_tail(
        &mut self,
        n: kiln_functionalize::graph::NodeId,
        v: ValueId,
        f: impl FnOnce(&mut Self, ValueId) -> R<()>,
    ) -> R<()> {
        let r = self.g.nodes[n].results[0];
        if r != v {
            self.epilogue = Some((r, v));
        }
        let out = f(self, r);
        self.epilogue = None;
        out
    }

    /// `f` for each of the `lines` lines of `len` elements in this
    /// invocation's block, given the first element's index.
    fn chain_lines(
        &mut self,
        lines: usize,
        len: usize,
        f: impl FnOnce(&mut Self, &str) -> R<()>,
    ) -> R<()> {
        self.body.stmt(format!(
            "for (var cl = 0u; cl < {} * cn; cl = cl + 1u) {{",
            u(lines)
        ));
        let saved = std::mem::take(&mut self.memo);
        let lb = self
            .body
            .bind("u32", format!("(gid * {} + cl) * {}", u(lines), u(len)));
        f(self, &lb)?;
        self.body.stmt("}".into());
        self.memo = saved;
        Ok(())
    }

    /// Elementwise value `v` over the block of `width` from `base`.
    fn chain_map(&mut self, v: ValueId, base: &str, width: usize) -> R<()> {
        let Def::Node(n, k) = self.g.values[v].def else {
            return Err(bug("a row kernel value without a node"));
        };
        self.body.stmt(format!(
            "for (var cj = 0u; cj < {} * cn; cj = cj + 1u) {{",
            u(width)
        ));
        let saved = std::mem::take(&mut self.memo);
        let at = self.body.bind("u32", format!("{base} + cj"));
        let x = self.node_at(n, k, &at)?;
        self.store_plain(v, &at, &x)?;
        self.body.stmt("}".into());
        self.memo = saved;
        Ok(())
    }

    /// Product node `n` over this invocation's block of output rows
    /// (`width` elements), its result or tail `v` stored: each output a
    /// dot product of a row of the left operand (a block of it) with a
    /// column of the weight.
    fn chain_product(
        &mut self,
        n: kiln_functionalize::graph::NodeId,
        v: ValueId,
        width: usize,
    ) -> R<()> {
        let g = self.g;
        let p = self.product(n)?;
        // A twin (`Schedule::twins`): same left operand and shapes, its
        // own weight, accumulated alongside; the tail reads its result.
        let twin = match self.s.twins.get(&n) {
            Some(&n1) => Some((g.nodes[n1].results[0], self.product(n1)?)),
            None => None,
        };
        let r = g.nodes[n].results[0];
        let om = g.meta(r).clone();
        let acc_dt = DType::F32;
        let at = ty(acc_dt);
        let rows = width / p.mm.max(1);
        self.with_tail(n, v, |s, r| {
            s.body.stmt(format!(
                "for (var ci = 0u; ci < {} * cn; ci = ci + 1u) {{",
                u(rows)
            ));
            let saved = std::mem::take(&mut s.memo);
            let fr = s.body.bind("u32", format!("gid * {} + ci", u(rows)));
            let bz = s.body.bind("u32", format!("{fr} / {}", u(p.nn)));
            let row = s.body.bind("u32", format!("{fr} % {}", u(p.nn)));
            let bm = s.unravel(&bz, &p.batch);
            let aoff = s.ravel(&bm, &p.a.batch, 0);
            let boff = s.ravel(&bm, &p.b.batch, 0);
            let boff1 = twin.as_ref().map(|(_, p1)| s.ravel(&bm, &p1.b.batch, 0));
            let left_at = |s: &mut Gen, k: &str| -> R<String> {
                let ia = s.body.bind(
                    "u32",
                    format!("{aoff} + {row} * {} + {k} * {}", u(p.a.rs), u(p.a.cs)),
                );
                let xa = s.value_at(p.a.v, &ia)?;
                Ok(cast(&xa, g.meta(p.a.v).dtype, acc_dt))
            };
            // A left operand outside the kernel's registers (read through
            // a head merge, a transpose) is loaded once a row into an
            // array, not once per output column with its index math.
            let in_registers = s.resident.contains_key(&s.held(p.a.v));
            let staged = if p.kk <= crate::fusion::CHAIN_MAX_WIDTH && !in_registers {
                let arr = format!("array<{at}, {}>", p.kk);
                let la = s.body.var(&arr, format!("{arr}()"));
                s.body.stmt(format!(
                    "for (var ck = 0u; ck < {} * cn; ck = ck + 1u) {{",
                    u(p.kk)
                ));
                let outer = std::mem::take(&mut s.memo);
                let xa = left_at(s, "ck")?;
                s.body.stmt(format!("{la}[ck] = {xa};"));
                s.body.stmt("}".into());
                s.memo = outer;
                Some(la)
            } else {
                None
            };
            s.body.stmt(format!(
                "for (var cj = 0u; cj < {} * cn; cj = cj + 1u) {{",
                u(p.mm)
            ));
            let inner = std::mem::take(&mut s.memo);
            let acc = s.body.var(at, "0.0".into());
            let acc1 = twin.as_ref().map(|_| s.body.var(at, "0.0".into()));
            s.body.stmt(format!(
                "for (var ck = 0u; ck < {} * cn; ck = ck + 1u) {{",
                u(p.kk)
            ));
            let dot = std::mem::take(&mut s.memo);
            let xa = match &staged {
                Some(la) => format!("{la}[ck]"),
                None => left_at(s, "ck")?,
            };
            let xb = s.right_at(&p.b, &boff, acc_dt)?;
            s.body.stmt(format!("{acc} = {acc} + {xa} * {xb};"));
            if let (Some((_, p1)), Some(off), Some(acc1)) = (&twin, &boff1, &acc1) {
                let xb = s.right_at(&p1.b, off, acc_dt)?;
                s.body.stmt(format!("{acc1} = {acc1} + {xa} * {xb};"));
            }
            s.body.stmt("}".into());
            s.memo = dot;
            let oi = s.body.bind("u32", format!("{fr} * {} + cj", u(p.mm)));
            if let (Some((x, p1)), Some(acc1)) = (&twin, &acc1) {
                let res1 = s.with_addend(acc1, p1.extra, &p.batch, p.nn, p.mm, &oi, acc_dt)?;
                let res1 = s.body.bind(ty(om.dtype), cast(&res1, acc_dt, om.dtype));
                s.memo.insert((*x, oi.clone()), res1);
            }
            let res = s.with_addend(&acc, p.extra, &p.batch, p.nn, p.mm, &oi, acc_dt)?;
            let res = cast(&res, acc_dt, om.dtype);
            s.store_to(r, &oi, &res)?;
            s.body.stmt("}".into());
            s.memo = inner;
            s.body.stmt("}".into());
            s.memo = saved;
            debug_assert!(numel(&p.batch).max(1) * p.nn * p.mm == om.numel());
            Ok(())
        })
    }

    /// Element (`ck`, `cj`) of right operand `b` (its batch at `off`), as
    /// the accumulator's type `acc_dt`.
    fn right_at(&mut self, b: &Operand, off: &str, acc_dt: DType) -> R<String> {
        let ib = self.body.bind(
            "u32",
            format!("{off} + ck * {} + cj * {}", u(b.rs), u(b.cs)),
        );
        let x = self.value_at(b.v, &ib)?;
        Ok(cast(&x, self.g.meta(b.v).dtype, acc_dt))
    }
}
