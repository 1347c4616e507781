//! Data-dependent selection along a dimension: extremes with their index
//! (`argmax argmin max.dim min.dim`, an output element per invocation) and
//! sorting (`sort topk`: each element's rank in its line, an element per
//! invocation, then a store at the rank).

use super::*;

/// A line along `dim` (the flattened tensor when `dim` is None): `len`
/// elements `inner` apart.
struct Line {
    len: usize,
    inner: usize,
    count: usize,
}

fn line_of(m: &Meta, dim: Option<i64>) -> R<Line> {
    let (len, inner) = match dim {
        _ if m.dim() == 0 => (1, 1),
        None => (m.numel(), 1),
        Some(d) => {
            let d = kiln_functionalize::meta::wrap_dim(d, m.dim()).map_err(bug)?;
            (m.sizes[d], m.sizes[d + 1..].iter().product())
        }
    };
    Ok(Line {
        len,
        inner,
        count: m.numel() / len.max(1),
    })
}

impl<'a> Gen<'a> {
    fn opt_dim(&self, n: NodeId, at: usize) -> Option<i64> {
        match self.g.nodes[n].args.get(at) {
            Some(Arg::Int(d)) => Some(*d),
            _ => None,
        }
    }

    /// "`a` comes before `b`" in a line ordered for a maximum (`high`) or a
    /// minimum: NaN first, then the larger (smaller) value.
    fn before(&self, a: &str, b: &str, d: DType, high: bool) -> String {
        let cmp = if high { ">" } else { "<" };
        if d.is_float() {
            format!(
                "((k_isnan({a}) && !k_isnan({b})) || (!k_isnan({a}) && !k_isnan({b}) && {a} {cmp} {b}))"
            )
        } else if d == DType::Bool {
            let (x, y) = (
                format!("select(0u, 1u, {a})"),
                format!("select(0u, 1u, {b})"),
            );
            format!("({x} {cmp} {y})")
        } else {
            format!("({a} {cmp} {b})")
        }
    }

    /// `argmax`/`argmin`, and `max.dim`/`min.dim`/`max`/`min` (result 0 the
    /// value, 1 the index): the first extreme of each line, NaN winning.
    pub(super) fn extreme(&mut self, n: NodeId, v: ValueId, label: String) -> R<KernelCode> {
        let node = &self.g.nodes[n];
        let Lowering::Extreme { high, index_only } = node.op.def().lowering else {
            return Err(bug(format!("{} is no extreme", node.op.name())));
        };
        let input = *node.args[0].tensors()[0];
        let im = self.meta(input).clone();
        let k = node.results.iter().position(|&r| r == v).unwrap_or(0);
        let want_index = index_only || k == 1;
        let line = line_of(&im, self.opt_dim(n, 1))?;
        let t = ty(im.dtype);
        self.body
            .stmt(format!("if (gid >= {}) {{ return; }}", u(line.count)));
        let base = self.body.bind(
            "u32",
            format!(
                "(gid / {i}) * {} + gid % {i}",
                u(line.len * line.inner),
                i = u(line.inner)
            ),
        );
        let first = self.value_at(input, &base)?;
        let best = self.body.var(t, first);
        let at = self.body.var("u32", "0u".into());
        self.body.stmt(format!(
            "for (var r = 1u; r < {}; r = r + 1u) {{",
            u(line.len)
        ));
        let saved = std::mem::take(&mut self.memo);
        let i = self
            .body
            .bind("u32", format!("{base} + r * {}", u(line.inner)));
        let x = self.value_at(input, &i)?;
        let better = self.before(&x, &best, im.dtype, high);
        self.body
            .stmt(format!("if ({better}) {{ {best} = {x}; {at} = r; }}"));
        self.body.stmt("}".into());
        self.memo = saved;
        let out = if want_index {
            cast(&format!("i32({at})"), DType::I32, self.meta(v).dtype)
        } else {
            best
        };
        self.store_to(v, "gid", &out)?;
        Ok(self.finish(
            label,
            wgsl::grid(line.count, self.workgroup),
            [self.workgroup, 1, 1],
        ))
    }

    /// `sort(self, dim, descending)` and `topk(self, k, dim, largest)`:
    /// each element's rank among its line (ties in index order, NaN as
    /// the largest), stored at that rank when it is among the first
    /// `k`; result 0 the values, 1 the indices.
    pub(super) fn sort(&mut self, n: NodeId, v: ValueId, label: String) -> R<KernelCode> {
        let node = &self.g.nodes[n];
        let topk = matches!(node.op.def().lowering, Lowering::Sort { topk: true });
        let margs: Vec<Arg<&Meta>> = node
            .args
            .iter()
            .map(|a| a.map(&mut |x| self.g.meta(*x)))
            .collect();
        let input = *node.args[0].tensors()[0];
        let im = self.meta(input).clone();
        let om = self.meta(v).clone();
        let (dim_at, flag_at) = if topk { (2, 3) } else { (1, 2) };
        let dim = Some(self.opt_dim(n, dim_at).unwrap_or(-1));
        let flag = margs.get(flag_at).is_some() && margs.bool(flag_at).map_err(bug)?;
        // sort's flag is `descending`, topk's `largest` (default true).
        let high = if topk {
            margs.get(flag_at).is_none() || flag
        } else {
            flag
        };
        let line = line_of(&im, dim)?;
        let keep = line_of(&om, dim)?.len;
        let index = node.results.iter().position(|&r| r == v) == Some(1);
        let total = line.count * line.len;
        self.body
            .stmt(format!("if (gid >= {}) {{ return; }}", u(total)));
        let (len, inner) = (u(line.len), u(line.inner));
        let k = self.body.bind("u32", format!("(gid / {inner}) % {len}"));
        let base = self.body.bind(
            "u32",
            format!("(gid / ({inner} * {len})) * {len} * {inner} + gid % {inner}"),
        );
        let x = self.value_at(input, "gid")?;
        let rank = self.body.var("u32", "0u".into());
        self.body
            .stmt(format!("for (var j = 0u; j < {len}; j = j + 1u) {{"));
        let saved = std::mem::take(&mut self.memo);
        let at = self.body.bind("u32", format!("{base} + j * {inner}"));
        let y = self.value_at(input, &at)?;
        let ahead = self.before(&y, &x, im.dtype, high);
        let tie = format!("(j < {k} && !{})", self.before(&x, &y, im.dtype, high));
        self.body
            .stmt(format!("if ({ahead} || {tie}) {{ {rank} = {rank} + 1u; }}"));
        self.body.stmt("}".into());
        self.memo = saved;
        self.body
            .stmt(format!("if ({rank} >= {}) {{ return; }}", u(keep)));
        let keep_u = u(keep);
        let dst = self.body.bind(
            "u32",
            format!(
                "(gid / ({inner} * {len})) * {keep_u} * {inner} + gid % {inner} + {rank} * {inner}"
            ),
        );
        let value = if index {
            cast(&format!("i32({k})"), DType::I32, om.dtype)
        } else {
            x
        };
        self.store_to(v, &dst, &value)?;
        Ok(self.finish(
            label,
            wgsl::grid(total, self.workgroup),
            [self.workgroup, 1, 1],
        ))
    }
}
