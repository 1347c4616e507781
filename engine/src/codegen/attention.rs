//! Attention as one kernel: `O = softmax(f(Q K)) V` with `f` elementwise
//! (scale, mask), `Fused::Attention`. Each invocation owns one query row;
//! the workgroup (rows of one batch entry) walks the keys in tiles staged
//! through workgroup memory, with an online softmax (running maximum and
//! sum, accumulator rescaled per tile), so neither the scores nor the
//! probabilities reach memory.

use super::matmul::Product;
use super::*;

/// Keys per tile.
const KEYS: usize = 16;

/// Query rows per workgroup: the rows of one batch entry, up to the
/// device's workgroup size.
fn rows_per_workgroup(rows: usize, workgroup: u32) -> usize {
    rows.next_power_of_two().clamp(8, workgroup.max(8) as usize)
}

impl Gen<'_> {
    pub(super) fn attention(
        &mut self,
        scores: NodeId,
        softmax: NodeId,
        product: NodeId,
        label: String,
    ) -> R<KernelCode> {
        let g = self.g;
        let qk = self.product(scores)?;
        let pv = self.product(product)?;
        let s_val = g.nodes[scores].results[0];
        let x_val = **g.nodes[softmax].args[0]
            .tensors()
            .first()
            .ok_or_else(|| bug("softmax without input"))?;
        let o = g.nodes[product].results[0];
        let (sq, dk, sk, dv) = (qk.nn, qk.kk, qk.mm, pv.mm);
        if qk.extra.is_some() || pv.extra.is_some() || qk.batch != pv.batch || pv.kk != sk {
            return Err(bug("attention products do not chain"));
        }
        let Product { a: q, b: k, .. } = qk;
        let v = pv.b;
        let batch = pv.batch;
        let nb = numel(&batch).max(1);
        let w = rows_per_workgroup(sq, self.workgroup);
        let ninf = literal(f64::NEG_INFINITY, DType::F32);
        self.shared
            .push(format!("var<workgroup> ks: array<f32, {}>;", KEYS * dk));
        self.shared
            .push(format!("var<workgroup> vs: array<f32, {}>;", KEYS * dv));
        self.body.stmt("let bz = wid.y;".into());
        self.body.stmt(format!("let i = wid.x * {} + lid.x;", u(w)));
        self.body.stmt(format!("let ic = min(i, {});", u(sq - 1)));
        let bm = self.unravel("bz", &batch);
        let qoff = self.ravel(&bm, &q.batch, 0);
        let koff = self.ravel(&bm, &k.batch, 0);
        let voff = self.ravel(&bm, &v.batch, 0);
        // The query row, in registers.
        // Loops over the head width are unrolled: constant indices keep
        // `q` and `acc` in registers (a dynamic index puts them in memory).
        self.body.stmt(format!("var q: array<f32, {dk}>;"));
        self.memo.clear();
        let qrow = self.body.bind("u32", format!("{qoff} + ic * {}", u(q.rs)));
        for d in 0..dk {
            let qi = self.body.bind("u32", format!("{qrow} + {}", u(d * q.cs)));
            let x = self.value_at(q.v, &qi)?;
            let x = cast(&x, g.meta(q.v).dtype, DType::F32);
            self.body.stmt(format!("q[{d}] = {x};"));
        }
        self.memo.clear();
        self.body.stmt(format!("var acc: array<f32, {dv}>;"));
        self.body.stmt(format!("var m: f32 = {ninf};"));
        self.body.stmt("var l: f32 = 0.0;".into());
        self.body.stmt(format!("var sc: array<f32, {KEYS}>;"));
        self.body.stmt(format!(
            "for (var j0 = 0u; j0 < {}; j0 = j0 + {}) {{",
            u(sk),
            u(KEYS)
        ));
        // Stage the tile's keys and values (zeros past the last key).
        for (tile, op, off, width) in [("ks", &k, &koff, dk), ("vs", &v, &voff, dv)] {
            let n = KEYS * width;
            self.body.stmt(format!(
                "for (var e = lid.x; e < {}; e = e + {}) {{",
                u(n),
                u(w)
            ));
            let jj = self.body.bind("u32", format!("e / {}", u(width)));
            let c = self.body.bind("u32", format!("e % {}", u(width)));
            let j = self.body.bind("u32", format!("j0 + {jj}"));
            let ok = self.body.bind("bool", format!("{j} < {}", u(sk)));
            let jc = self.body.bind("u32", format!("min({j}, {})", u(sk - 1)));
            // K is [d, j] (the right operand of Q K), V is [j, c].
            let at = if tile == "ks" {
                format!("{off} + {c} * {} + {jc} * {}", u(op.rs), u(op.cs))
            } else {
                format!("{off} + {jc} * {} + {c} * {}", u(op.rs), u(op.cs))
            };
            let at = self.body.bind("u32", at);
            let x = self.value_at(op.v, &at)?;
            let x = cast(&x, g.meta(op.v).dtype, DType::F32);
            self.body
                .stmt(format!("{tile}[e] = select(0.0, {x}, {ok});"));
            self.body.stmt("}".into());
            self.memo.clear();
        }
        self.body.stmt("workgroupBarrier();".into());
        // Scores of the tile: q . k_j, then the elementwise chain at
        // (bz, i, j) with the product's value there.
        let bmax = self.body.var("f32", ninf.clone());
        self.body.stmt(format!(
            "for (var jj = 0u; jj < {}; jj = jj + 1u) {{",
            u(KEYS)
        ));
        self.body.stmt("var s: f32 = 0.0;".into());
        self.body.stmt(format!("let kb = jj * {};", u(dk)));
        for d in 0..dk {
            self.body
                .stmt(format!("s = s + q[{d}] * ks[kb + {}];", u(d)));
        }
        self.body.stmt("let j = j0 + jj;".into());
        let si = self.body.bind(
            "u32",
            format!(
                "bz * {} + ic * {} + min(j, {})",
                u(sq * sk),
                u(sk),
                u(sk - 1)
            ),
        );
        let s = self.body.bind("f32", "s".into());
        self.memo.insert((s_val, si.clone()), s);
        let x = self.value_at(x_val, &si)?;
        let x = cast(&x, g.meta(x_val).dtype, DType::F32);
        self.body
            .stmt(format!("sc[jj] = select({ninf}, {x}, j < {});", u(sk)));
        self.body.stmt(format!("{bmax} = max({bmax}, sc[jj]);"));
        self.body.stmt("}".into());
        self.memo.clear();
        // Online softmax: rescale what the earlier tiles accumulated. A row
        // whose every score so far is -inf has nothing to rescale (and
        // ends 0 / 0 = NaN, as softmax gives).
        self.body.stmt(format!("let mn = max(m, {bmax});"));
        self.body.stmt(format!("let dead = mn == {ninf};"));
        self.body
            .stmt("let alpha = select(exp(m - mn), 1.0, dead);".into());
        self.body.stmt("l = l * alpha;".into());
        for c in 0..dv {
            self.body.stmt(format!("acc[{c}] = acc[{c}] * alpha;"));
        }
        self.body.stmt(format!(
            "for (var jj = 0u; jj < {}; jj = jj + 1u) {{",
            u(KEYS)
        ));
        self.body
            .stmt("let p = select(exp(sc[jj] - mn), 0.0, dead);".into());
        self.body.stmt("l = l + p;".into());
        self.body.stmt(format!("let vb = jj * {};", u(dv)));
        for c in 0..dv {
            self.body
                .stmt(format!("acc[{c}] = acc[{c}] + p * vs[vb + {}];", u(c)));
        }
        self.body.stmt("}".into());
        self.body.stmt("m = mn;".into());
        self.body.stmt("workgroupBarrier();".into());
        self.body.stmt("}".into());
        self.body.stmt(format!("if (i >= {}) {{ return; }}", u(sq)));
        let orow = self
            .body
            .bind("u32", format!("bz * {} + i * {}", u(sq * dv), u(dv)));
        let od = g.meta(o).dtype;
        for c in 0..dv {
            let oi = self.body.bind("u32", format!("{orow} + {}", u(c)));
            let y = cast(&format!("(acc[{c}] / l)"), DType::F32, od);
            self.store_to(o, &oi, &y)?;
        }
        if nb > 65535 {
            return Err(EngineError::Unsupported(format!(
                "attention over {nb} batch entries: too many workgroups"
            )));
        }
        let grid = [sq.div_ceil(w) as u32, nb as u32, 1];
        Ok(self.finish(
            format!("attention#{}", label.split('#').nth(1).unwrap_or("")),
            grid,
            [w as u32, 1, 1],
        ))
    }
}
