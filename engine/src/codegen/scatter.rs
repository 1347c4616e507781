//! Scatters: a view's elements written into a buffer (re-inplaced region
//! updates, `as_strided_scatter`), and `index_put`.

use super::*;

impl Gen<'_> {
    /// Writes `src` through the scatter's view of buffer `target`
    /// (element `j` of `src` goes to the view's `j`-th position).
    pub(super) fn scatter_write(
        &mut self,
        n: NodeId,
        target: ValueId,
        out: ValueId,
        label: String,
    ) -> R<Option<KernelCode>> {
        let g = self.g;
        let node = &g.nodes[n];
        let src = *node.args[1].tensors()[0];
        let sm = g.meta(src).clone();
        let view = node
            .op
            .def()
            .lowering
            .scatter_view()
            .ok_or_else(|| bug("scatter without a view"))?;
        let tm = Meta::contiguous(g.meta(target).dtype, g.meta(target).sizes.clone());
        let mut va: Vec<Arg<&Meta>> = vec![Arg::Tensor(&tm)];
        va.extend(node.args[2..].iter().map(|a| a.map(&mut |x| g.meta(*x))));
        let vm = ops::infer(view, &va).map_err(bug)?.remove(0);
        let count = sm.numel();
        if count == 0 {
            return Ok(None);
        }
        self.guard(count);
        let x = self.value_at(src, "gid")?;
        let x = cast(&x, sm.dtype, tm.dtype);
        let m = self.unravel("gid", &vm.sizes);
        let at = self.ravel(&m, &vm.strides, vm.offset);
        if !self.locs.contains_key(&out) {
            return Err(bug("scatter target without a buffer"));
        }
        let (slot, loc) = self.slot_of(out, true)?;
        if loc.packed {
            return Err(bug("a scatter into a packed buffer"));
        }
        self.body.stmt(store(&slot, &at, tm.dtype, &x));
        Ok(Some(self.finish(
            label,
            wgsl::grid(count, self.workgroup),
            [self.workgroup, 1, 1],
        )))
    }

    /// `index_put` with integer indices, after `out` holds a copy of self:
    /// one invocation walks every indexed position in order, so duplicate
    /// indices resolve as in eager (last write wins, or all accumulate).
    pub(super) fn index_put(&mut self, n: NodeId, out: ValueId, label: String) -> R<KernelCode> {
        let g = self.g;
        let node = &g.nodes[n];
        let om = g.meta(out).clone();
        let idx: Vec<Option<ValueId>> = match &node.args[1] {
            Arg::TensorList(l) => l.clone(),
            _ => return Err(bug("index_put indices")),
        };
        let values = *node.args[2].tensors()[0];
        if idx
            .iter()
            .flatten()
            .any(|&t| g.meta(t).dtype == DType::Bool)
        {
            return self.index_put_mask(n, out, &idx, values, label);
        }
        let accumulate = matches!(node.args.get(3), Some(Arg::Bool(true)));
        let lay = layout(g, &om, &idx)?;
        let rshape = &lay.rshape;
        let total = numel(rshape);
        self.body.stmt("if (gid != 0u) { return; }".into());
        self.body
            .stmt(format!("for (var r = 0u; r < {}; r = r + 1u) {{", u(total)));
        let saved = std::mem::take(&mut self.memo);
        let m = self.unravel("r", rshape);
        let vm = g.meta(values).clone();
        let vi = self.broadcast_index("r", rshape, &vm);
        let val = self.value_at(values, &vi)?;
        let val = cast(&val, vm.dtype, om.dtype);
        let at = self.indexed_at(n, &m, &lay, &idx, &om.sizes)?;
        self.put(out, &at, &val, accumulate)?;
        self.body.stmt("}".into());
        self.memo = saved;
        Ok(self.finish(label, [1, 1, 1], [self.workgroup, 1, 1]))
    }

    /// The element of a tensor of `sizes` that position `m` of
    /// `self[idx]` (laid out as `lay`) names; negative indices wrap.
    pub(super) fn indexed_at(
        &mut self,
        n: NodeId,
        m: &[String],
        lay: &Advanced,
        idx: &[Option<ValueId>],
        sizes: &[usize],
    ) -> R<String> {
        let g = self.g;
        let cstr = contiguous_strides(sizes);
        let nb = lay.before.len();
        let bpos = self.ravel(
            &m[nb..nb + lay.bshape.len()],
            &contiguous_strides(&lay.bshape),
            0,
        );
        let mut terms = vec![];
        for (j, &d) in lay.before.iter().enumerate() {
            terms.push(format!("{} * {}", m[j], u(cstr[d])));
        }
        for (j, &d) in lay.after.iter().enumerate() {
            terms.push(format!("{} * {}", m[nb + lay.bshape.len() + j], u(cstr[d])));
        }
        for &d in &lay.adv {
            let t = idx[d].ok_or_else(|| bug("advanced dim without an index"))?;
            let ti = self.broadcast_index(&bpos, &lay.bshape, g.meta(t));
            let iv = self.value_at(t, &ti)?;
            self.flag_index(n, &iv, sizes[d], true)?;
            let size = sizes[d] as i32;
            let w = self.body.bind("i32", wrapped(&iv, sizes[d]));
            terms.push(format!(
                "u32(clamp({w}, 0i, {}i)) * {}",
                size - 1,
                u(cstr[d])
            ));
        }
        Ok(self.body.bind(
            "u32",
            if terms.is_empty() {
                "0u".into()
            } else {
                terms.join(" + ")
            },
        ))
    }

    /// `out[at] = val`, or `out[at] += val` when accumulating.
    pub(super) fn put(&mut self, out: ValueId, at: &str, val: &str, accumulate: bool) -> R<()> {
        let d = self.meta(out).dtype;
        if !self.locs.contains_key(&out) {
            return Err(bug("index_put without a buffer"));
        }
        let (slot, loc) = self.slot_of(out, true)?;
        if loc.packed {
            return Err(bug("index_put into a packed buffer"));
        }
        let value = put_value(d, &load(&slot, at, d, false), val, accumulate);
        self.body.stmt(store(&slot, at, d, &value));
        Ok(())
    }

    /// `index_put` with one bool mask (`x[mask] = v`): the masked
    /// positions, in order, take the values' consecutive rows.
    pub(super) fn index_put_mask(
        &mut self,
        n: NodeId,
        out: ValueId,
        idx: &[Option<ValueId>],
        values: ValueId,
        label: String,
    ) -> R<KernelCode> {
        let g = self.g;
        let om = g.meta(out).clone();
        let accumulate = matches!(g.nodes[n].args.get(3), Some(Arg::Bool(true)));
        let used: Vec<(usize, ValueId)> = idx
            .iter()
            .enumerate()
            .filter_map(|(d, t)| t.map(|t| (d, t)))
            .collect();
        let [(d0, mask)] = used[..] else {
            return Err(CompileError::no_kernel(
                "index_put mixing a bool mask with other indices",
            ));
        };
        let mm = g.meta(mask).clone();
        let k = mm.dim();
        if om.sizes.get(d0..d0 + k) != Some(&mm.sizes[..]) {
            return Err(CompileError::no_kernel(
                "index_put with a mask whose shape does not match the indexed dims",
            ));
        }
        let before: Vec<usize> = om.sizes[..d0].to_vec();
        let after: Vec<usize> = om.sizes[d0 + k..].to_vec();
        let (nb, np, na) = (numel(&before), mm.numel(), numel(&after));
        // The values, right-aligned against [before..., nnz, after...].
        let vm = g.meta(values).clone();
        let rank = before.len() + 1 + after.len();
        if vm.dim() > rank {
            return Err(CompileError::no_kernel(
                "index_put values of higher rank than the indexing result",
            ));
        }
        let vstr = contiguous_strides(&vm.sizes);
        let mut vs = vec![0usize; rank];
        for (j, (&size, &st)) in vm.sizes.iter().zip(&vstr).enumerate() {
            vs[rank - vm.dim() + j] = if size == 1 { 0 } else { st };
        }
        self.body.stmt("if (gid != 0u) { return; }".into());
        self.body
            .stmt(format!("for (var b = 0u; b < {}; b = b + 1u) {{", u(nb)));
        self.body.stmt("var c = 0u;".into());
        self.body
            .stmt(format!("for (var p = 0u; p < {}; p = p + 1u) {{", u(np)));
        let saved = std::mem::take(&mut self.memo);
        let hit = self.value_at(mask, "p")?;
        self.body.stmt(format!("if ({hit}) {{"));
        self.body
            .stmt(format!("for (var a = 0u; a < {}; a = a + 1u) {{", u(na)));
        self.memo.clear();
        let bm = self.unravel("b", &before);
        let am = self.unravel("a", &after);
        let mut m = bm;
        m.push("c".into());
        m.extend(am);
        let vi = self.ravel(&m, &vs, 0);
        let val = self.value_at(values, &vi)?;
        let val = cast(&val, vm.dtype, om.dtype);
        let at = self
            .body
            .bind("u32", format!("(b * {} + p) * {} + a", u(np), u(na)));
        self.put(out, &at, &val, accumulate)?;
        self.body.stmt("}".into());
        self.body.stmt("c = c + 1u;".into());
        self.body.stmt("}".into());
        self.body.stmt("}".into());
        self.body.stmt("}".into());
        self.memo = saved;
        Ok(self.finish(label, [1, 1, 1], [self.workgroup, 1, 1]))
    }
}

/// Index `iv` (an i32 expression) into a dim of `size`, negative ones
/// counted from the end.
pub(super) fn wrapped(iv: &str, size: usize) -> String {
    format!("select({iv}, {iv} + {}i, {iv} < 0i)", size as i32)
}

/// What a put leaves where it writes `val` over `old`: `val`, or when
/// accumulating their sum (bools: or).
pub(super) fn put_value(d: DType, old: &str, val: &str, accumulate: bool) -> String {
    if !accumulate {
        val.to_string()
    } else if d == DType::Bool {
        format!("({old} || {val})")
    } else {
        format!("({old} + {val})")
    }
}

/// The advanced-indexing layout of `self[idx]` for `self` of `om`.
pub(super) fn layout(g: &Graph, om: &Meta, idx: &[Option<ValueId>]) -> R<Advanced> {
    let shapes: Vec<Option<&[usize]>> = idx
        .iter()
        .map(|t| t.map(|t| &g.meta(t).sizes[..]))
        .collect();
    Advanced::of(&om.sizes, &shapes).map_err(bug)
}
