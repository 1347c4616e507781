//! Gathers: `index_select` and `embedding`, computed inline where their
//! elements are read.

use super::*;

impl Gen<'_> {
    /// Element `idx` of `index_select(self, dim, index)` or
    /// `embedding(self, index)` (`Elem::IndexSelect`), computed inline:
    /// `self` at the element's position with the index's value in place
    /// of its position along `dim`.
    pub(super) fn index_select_at(
        &mut self,
        n: NodeId,
        index: usize,
        dim: Option<usize>,
        idx: &str,
    ) -> R<String> {
        let g = self.g;
        let node = &g.nodes[n];
        let (src, ix) = (self.tensor_arg(n, 0)?, self.tensor_arg(n, index)?);
        let sm = g.meta(src);
        let (outer, inner) = crate::index::index_select_split(sm, &node.args, dim).map_err(bug)?;
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
