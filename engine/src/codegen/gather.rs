//! Gathers: `embedding` (a kernel of its own) and `index_select`
//! (computed inline).

use super::*;

impl Gen<'_> {
    pub(super) fn gather(&mut self, n: NodeId, v: ValueId, label: String) -> R<KernelCode> {
        let g = self.g;
        let node = &g.nodes[n];
        let om = g.meta(v).clone();
        let count = om.numel();
        self.guard(count);
        let Lowering::Gather(form) = node.op.def().lowering else {
            return Err(bug(format!("{} is no gather", node.op.name())));
        };
        let (src, idx) = (
            self.tensor_arg(n, form.table)?,
            self.tensor_arg(n, form.index)?,
        );
        let dim = match form.dim.map(|i| &node.args[i]) {
            None => 0usize,
            Some(&Arg::Int(d)) => {
                kiln_functionalize::meta::wrap_dim(d, g.meta(src).dim()).map_err(bug)?
            }
            Some(_) => return Err(bug(format!("{}: no dim", node.op.name()))),
        };
        let sizes = &g.meta(src).sizes;
        let len = sizes.get(dim).copied().unwrap_or(1);
        let inner = sizes.get(dim + 1..).map_or(1, |s| s.iter().product());
        let at = self.selected(n, idx, len, inner, "gid")?;
        let x = self.value_at(src, &at)?;
        self.store_to(v, "gid", &x)?;
        Ok(self.finish(
            label,
            wgsl::grid(count, self.workgroup),
            [self.workgroup, 1, 1],
        ))
    }

    /// Element `idx` of `index_select(self, dim, index)` (`Elem::IndexSelect`),
    /// computed inline: `self` at the element's position with the index's
    /// value in place of its position along `dim`.
    pub(super) fn index_select_at(
        &mut self,
        n: NodeId,
        index: usize,
        dim: usize,
        idx: &str,
    ) -> R<String> {
        let g = self.g;
        let node = &g.nodes[n];
        let (src, ix) = (self.tensor_arg(n, 0)?, self.tensor_arg(n, index)?);
        let sm = g.meta(src);
        let (outer, inner) =
            crate::index::index_select_split(sm, node.args.get(dim)).map_err(bug)?;
        let len = sm.numel() / (outer * inner).max(1);
        let at = self.selected(n, ix, len, inner, idx)?;
        self.value_at(src, &at)
    }

    /// Where element `idx` of a selection's result (`[outer, index,
    /// inner]` around a dimension of `len`) reads its table: at the index
    /// tensor's value for its position along that dimension (checked:
    /// a fault out of bounds; clamped).
    fn selected(
        &mut self,
        n: NodeId,
        ix: ValueId,
        len: usize,
        inner: usize,
        idx: &str,
    ) -> R<String> {
        let g = self.g;
        let nidx = g.meta(ix).numel();
        let o = self
            .body
            .bind("u32", format!("{idx} / {}", u(nidx * inner)));
        let p = self
            .body
            .bind("u32", format!("({idx} / {}) % {}", u(inner), u(nidx)));
        let q = self.body.bind("u32", format!("{idx} % {}", u(inner)));
        let iv = self.value_at(ix, &p)?;
        let iv = self
            .body
            .bind("i32", cast(&iv, g.meta(ix).dtype, DType::I32));
        self.flag_index(n, &iv, len, false)?;
        let r = self.body.bind(
            "u32",
            format!("u32(clamp({iv}, 0i, {}i))", len.max(1) as i32 - 1),
        );
        Ok(self.body.bind(
            "u32",
            format!("({o} * {} + {r}) * {} + {q}", u(len), u(inner)),
        ))
    }
}
