//! Maps: element `i` of a result computed inline from its inputs, by the
//! element form its op declares (`ops::Elem`). `index::reads` gives, for
//! the same forms, which inputs an element reads and where.

use super::*;
use kiln_functionalize::ops::{Elem, RemapKind};

/// A node's arguments as metas.
fn metas(g: &Graph, n: NodeId) -> Vec<Arg<&Meta>> {
    g.nodes[n]
        .args
        .iter()
        .map(|a| a.map(&mut |v| g.meta(*v)))
        .collect()
}

/// Tensor argument `i` of node `n`.
fn tensor_arg(g: &Graph, n: NodeId, i: usize) -> R<ValueId> {
    let node = &g.nodes[n];
    match node.args.get(i) {
        Some(Arg::Tensor(v)) => Ok(*v),
        _ => Err(bug(format!(
            "{}: argument {i} is not a tensor",
            node.op.name()
        ))),
    }
}

impl Gen<'_> {
    /// Tensor argument `i` of node `n`.
    pub(super) fn tensor_arg(&self, n: NodeId, i: usize) -> R<ValueId> {
        tensor_arg(self.g, n, i)
    }

    /// Element `idx` of result `k` of node `n`, computed inline.
    pub fn node_at(&mut self, n: NodeId, k: usize, idx: &str) -> R<String> {
        let g = self.g;
        let node = &g.nodes[n];
        let def = node.op.def();
        let out = g.meta(node.results[k]).clone();
        let elem = match def.lowering {
            Lowering::Map(e) | Lowering::Free(e) => e,
            Lowering::RegionScatter { .. } | Lowering::StridedScatter(_) => {
                return self.region_scatter_at(n, idx)
            }
            Lowering::IndexPut => return self.index_put_at(n, idx),
            _ => return Err(bug(format!("{} cannot be computed inline", def.name))),
        };
        let t = |i| tensor_arg(g, n, i);
        match elem {
            Elem::Pointwise => self.pointwise_at(n, idx),
            Elem::ViewCopy => {
                let Rule::ViewCopy(view) = def.rule else {
                    return Err(bug(format!("{} is no view copy", def.name)));
                };
                if let Some(x) = self.block_view_at(n, k, idx)? {
                    return Ok(x);
                }
                if idx == self.own {
                    if let Some(tile) = self.tiles.get(&(n, k)) {
                        let at = format!("{tile}[{}]", self.tile_at);
                        return Ok(self.body.bind(ty(out.dtype), at));
                    }
                }
                let input = t(0)?;
                let a = Affine::view(g, view, g.meta(input), &node.args[1..], k).map_err(bug)?;
                let at = self.index_at(&a, idx);
                self.value_at(input, &at)
            }
            Elem::Same => self.value_at(t(0)?, idx),
            Elem::Cast => {
                let x = t(0)?;
                let v = self.value_at(x, idx)?;
                let code = self.fault_of(&v);
                self.narrowed(n, &v, g.meta(x).dtype, out.dtype, code)
            }
            Elem::Triangle { upper } => self.triangle_at(n, upper, idx),
            Elem::Join { .. } => self.join_at(n, idx),
            Elem::Remap(kind) => self.remap_at(n, kind, idx),
            Elem::IndexAdd => self.index_add_at(n, idx),
            Elem::Index => {
                let x = t(0)?;
                let list: Vec<Option<ValueId>> = match &node.args[1] {
                    Arg::TensorList(l) => l.clone(),
                    _ => return Err(bug("index: no index list")),
                };
                let xm = g.meta(x).clone();
                let lay = scatter::layout(g, &xm, &list)?;
                let m = self.unravel(idx, &lay.rshape);
                let at = self.indexed_at(n, &m, &lay, &list, &xm.sizes)?;
                self.value_at(x, &at)
            }
            Elem::GatherAlong { index, dim } => self.gather_along_at(n, index, dim, idx),
            Elem::IndexSelect { index, dim } => self.index_select_at(n, index, dim, idx),
            Elem::ScatterInto { add, copy } => self.scatter_into_at(n, add, copy, idx),
            Elem::CopyFrom => {
                let src = t(1)?;
                let sm = g.meta(src);
                let si = self.broadcast_index(idx, &out.sizes, sm);
                let x = self.value_at(src, &si)?;
                Ok(self.body.bind(ty(out.dtype), cast(&x, sm.dtype, out.dtype)))
            }
            // Bound: a literal such as `-1i` may meet a prefix operator.
            Elem::Fill { value } => {
                let x = self.fill_value(n, value)?;
                Ok(self.body.bind(ty(out.dtype), x))
            }
            Elem::MaskedFill => {
                let value = self.fill_value(n, 2)?;
                let (this, mask) = (t(0)?, t(1)?);
                let ti = self.broadcast_index(idx, &out.sizes, g.meta(this));
                let x = self.value_at(this, &ti)?;
                let mi = self.broadcast_index(idx, &out.sizes, g.meta(mask));
                let mv = self.value_at(mask, &mi)?;
                Ok(self
                    .body
                    .bind(ty(out.dtype), format!("select({x}, {value}, {mv})")))
            }
            Elem::Constant { one } => Ok(literal(if one { 1.0 } else { 0.0 }, out.dtype)),
            Elem::Arange => self.arange_at(n, idx),
        }
    }

    /// An elementwise op: its plan's code over its operands, broadcast.
    fn pointwise_at(&mut self, n: NodeId, idx: &str) -> R<String> {
        let g = self.g;
        let node = &g.nodes[n];
        let def = node.op.def();
        let out = g.meta(node.results[0]).clone();
        let Rule::Pointwise(plan) = &def.rule else {
            return Err(bug(format!("{} has no elementwise plan", def.name)));
        };
        let p = plan(&metas(g, n)).map_err(bug)?;
        let (mut vals, mut codes) = (vec![], vec![]);
        for o in &p.operands {
            vals.push(match o.src {
                Src::Arg(i) => {
                    let t = self.tensor_arg(n, i)?;
                    let tm = g.meta(t);
                    let ti = self.broadcast_index(idx, &out.sizes, tm);
                    let x = self.value_at(t, &ti)?;
                    codes.push(self.fault_of(&x));
                    cast(&x, tm.dtype, o.cast)
                }
                Src::Const { value, .. } => {
                    codes.push(None);
                    lit(value, o.cast)?
                }
            });
        }
        let types: Vec<DType> = p.operands.iter().map(|o| o.cast).collect();
        let (r, dt, code) = self.render(n, &p.expr, &vals, &types, &codes)?;
        self.narrowed(n, &r, dt, out.dtype, code)
    }

    /// `tril` / `triu` (`upper`): the input, zero outside the triangle.
    fn triangle_at(&mut self, n: NodeId, upper: bool, idx: &str) -> R<String> {
        let g = self.g;
        let out = g.meta(g.nodes[n].results[0]).clone();
        let x = self.tensor_arg(n, 0)?;
        let v = self.value_at(x, idx)?;
        let k = metas(g, n).opt_int(1).map_err(bug)?.unwrap_or(0);
        let (r, c) = (out.sizes[out.dim() - 2], out.sizes[out.dim() - 1]);
        let i = self
            .body
            .bind("i32", format!("i32(({idx} / {}) % {})", u(c), u(r)));
        let j = self.body.bind("i32", format!("i32({idx} % {})", u(c)));
        let op = if upper { ">=" } else { "<=" };
        let keep = format!("{j} - {i} {op} {k}i");
        Ok(self.body.bind(
            ty(out.dtype),
            format!("select({}, {v}, {keep})", literal(0.0, out.dtype)),
        ))
    }

    /// `index_add`: self + alpha * the source rows whose index is this
    /// row, in index order.
    fn index_add_at(&mut self, n: NodeId, idx: &str) -> R<String> {
        let g = self.g;
        let out = g.meta(g.nodes[n].results[0]).clone();
        let margs = metas(g, n);
        let (x, index, src) = (
            self.tensor_arg(n, 0)?,
            self.tensor_arg(n, 2)?,
            self.tensor_arg(n, 3)?,
        );
        let d = kiln_functionalize::meta::wrap_dim(margs.int(1).map_err(bug)?, out.dim())
            .map_err(bug)?;
        let alpha = margs.scalar(4).map_err(bug)?.to_f64();
        let sm = g.meta(src).clone();
        let nidx = g.meta(index).numel();
        let m = self.unravel(idx, &out.sizes);
        let base = self.value_at(x, idx)?;
        let t = ty(out.dtype);
        let acc = self.body.var(t, base);
        self.body
            .stmt(format!("for (var k = 0u; k < {}; k = k + 1u) {{", u(nidx)));
        let saved = std::mem::take(&mut self.memo);
        let iv = self.value_at(index, "k")?;
        let mut sm_idx = m.clone();
        sm_idx[d] = "k".into();
        let si = self.ravel(&sm_idx, &contiguous_strides(&sm.sizes), 0);
        let sv = self.value_at(src, &si)?;
        let add = format!("{} * {sv}", literal(alpha, out.dtype));
        self.body.stmt(format!(
            "if (u32({iv}) == {}) {{ {acc} = {acc} + {add}; }}",
            m[d]
        ));
        self.body.stmt("}".into());
        self.memo = saved;
        Ok(self.body.bind(t, acc))
    }

    /// Element `idx` of `index_put(self, indices, values, accumulate)`
    /// with one integer index (`fusion::index_put_map`): self there, then
    /// every position of the index naming it along the index's dim, in
    /// order: the last one's value, or all of them added.
    fn index_put_at(&mut self, n: NodeId, idx: &str) -> R<String> {
        let g = self.g;
        let node = &g.nodes[n];
        let out = g.meta(node.results[0]).clone();
        let (d, t) =
            crate::fusion::index_put_map(g, n).ok_or_else(|| bug("index_put is no map"))?;
        let Arg::TensorList(indices) = &node.args[1] else {
            return Err(bug("index_put indices"));
        };
        let lay = scatter::layout(g, &out, indices)?;
        let (x, values) = (self.tensor_arg(n, 0)?, *node.args[2].tensors()[0]);
        let vm = g.meta(values).clone();
        let accumulate = matches!(node.args.get(3), Some(Arg::Bool(true)));
        let m = self.unravel(idx, &out.sizes);
        let base = self.value_at(x, idx)?;
        let ty_out = ty(out.dtype);
        let acc = self.body.var(ty_out, base);
        let npos = numel(&lay.bshape);
        self.body
            .stmt(format!("for (var k = 0u; k < {}; k = k + 1u) {{", u(npos)));
        let saved = std::mem::take(&mut self.memo);
        let ti = self.broadcast_index("k", &lay.bshape, g.meta(t));
        let iv = self.value_at(t, &ti)?;
        let iv = self
            .body
            .bind("i32", cast(&iv, g.meta(t).dtype, DType::I32));
        let size = out.sizes[d];
        self.flag_index(n, &iv, size, true)?;
        // The values at [before..., k's position in the index, after...].
        let kpos = self.unravel("k", &lay.bshape);
        let rpos: Vec<String> = lay
            .before
            .iter()
            .map(|&b| m[b].clone())
            .chain(kpos)
            .chain(lay.after.iter().map(|&a| m[a].clone()))
            .collect();
        let r = self.ravel(&rpos, &contiguous_strides(&lay.rshape), 0);
        let vi = self.broadcast_index(&r, &lay.rshape, &vm);
        let val = self.value_at(values, &vi)?;
        let val = cast(&val, vm.dtype, out.dtype);
        let new = scatter::put_value(out.dtype, &acc, &val, accumulate);
        self.body.stmt(format!(
            "if ({} == i32({})) {{ {acc} = {new}; }}",
            scatter::wrapped(&iv, size),
            m[d]
        ));
        self.body.stmt("}".into());
        self.memo = saved;
        Ok(self.body.bind(ty_out, acc))
    }

    /// `gather` / `take_along_dim`: self at the own position with `dim`
    /// replaced by the index there (the flattened self without a dim).
    fn gather_along_at(&mut self, n: NodeId, index: usize, dim: usize, idx: &str) -> R<String> {
        let g = self.g;
        let node = &g.nodes[n];
        let out = g.meta(node.results[0]).clone();
        let (x, index) = (self.tensor_arg(n, 0)?, self.tensor_arg(n, index)?);
        let xm = g.meta(x).clone();
        let dim = match node.args.get(dim) {
            Some(Arg::Int(d)) => {
                Some(kiln_functionalize::meta::wrap_dim(*d, xm.dim()).map_err(bug)?)
            }
            _ => None,
        };
        let ii = self.broadcast_index(idx, &out.sizes, g.meta(index));
        let iv = self.value_at(index, &ii)?;
        let len = match dim.filter(|_| xm.dim() > 0) {
            Some(d) => xm.sizes[d],
            None => xm.numel(),
        };
        self.flag_index(n, &iv, len, false)?;
        let at = match dim.filter(|_| xm.dim() > 0) {
            None => format!("u32({iv})"),
            Some(d) => {
                let mut m = self.unravel(idx, &out.sizes);
                m[d] = format!("u32({iv})");
                for (k, mk) in m.iter_mut().enumerate() {
                    if k != d && xm.sizes[k] == 1 {
                        *mk = "0u".into();
                    }
                }
                self.ravel(&m, &contiguous_strides(&xm.sizes), 0)
            }
        };
        let at = self.body.bind("u32", at);
        self.value_at(x, &at)
    }

    /// `scatter` or `index_copy` (the last write wins) in place: `out`
    /// holds self already, so an invocation per source element writes it
    /// where the index names, unless a later element along `dim` names the
    /// same position (as the map form resolves duplicates). Writes the
    /// source's elements instead of self's (a KV cache's new rows, not the
    /// cache).
    pub(super) fn scatter_sources(
        &mut self,
        n: NodeId,
        out: ValueId,
        copy: bool,
        label: String,
    ) -> R<KernelCode> {
        let g = self.g;
        let om = g.meta(out).clone();
        let margs = metas(g, n);
        let index = self.tensor_arg(n, 2)?;
        let im = g.meta(index).clone();
        let d = if om.dim() == 0 {
            0
        } else {
            kiln_functionalize::meta::wrap_dim(margs.int(1).map_err(bug)?, om.dim()).map_err(bug)?
        };
        // The elements written: self's shape with `dim` the index's length
        // (`index_copy`), or the index's shape (`scatter`).
        let shape: Vec<usize> = if copy {
            let mut s = om.sizes.to_vec();
            if !s.is_empty() {
                s[d] = im.numel();
            }
            s
        } else {
            im.sizes.to_vec()
        };
        let count = numel(&shape);
        if count == 0 {
            return Err(bug("an in-place scatter of nothing"));
        }
        self.guard(count);
        let q = self.unravel("gid", &shape);
        let along = if q.is_empty() { 1 } else { shape[d] };
        let at_index = |s: &mut Self, k: &str| -> String {
            if copy || im.dim() == 0 {
                k.to_string()
            } else {
                let mut qk = q.clone();
                qk[d] = k.to_string();
                s.ravel(&qk, &contiguous_strides(&im.sizes), 0)
            }
        };
        let p = q.get(d).cloned().unwrap_or_else(|| "0u".into());
        let ii = at_index(self, &p);
        let iv = self.value_at(index, &ii)?;
        let len = if om.dim() == 0 { 1 } else { om.sizes[d] };
        self.flag_index(n, &iv, len, false)?;
        // A later element naming the same position wins.
        let later = self.body.var("bool", "false".into());
        self.body.stmt(format!(
            "for (var k = {p} + 1u; k < {}; k = k + 1u) {{",
            u(along)
        ));
        let saved = std::mem::take(&mut self.memo);
        let ik = at_index(self, "k");
        let kv = self.value_at(index, &ik)?;
        self.body
            .stmt(format!("if ({kv} == {iv}) {{ {later} = true; }}"));
        self.body.stmt("}".into());
        self.memo = saved;
        self.body.stmt(format!("if (!{later}) {{"));
        let sv = self.scatter_source(n, &q)?;
        let sv = cast(&sv, self.scatter_source_dtype(n), om.dtype);
        let mut qt = q.clone();
        if !qt.is_empty() {
            qt[d] = format!("u32({iv})");
        }
        let at = self.ravel(&qt, &contiguous_strides(&om.sizes), 0);
        let at = self.body.bind("u32", at);
        self.put(out, &at, &sv, false)?;
        self.body.stmt("}".into());
        Ok(self.finish(
            label,
            wgsl::grid(count, self.workgroup),
            [self.workgroup, 1, 1],
        ))
    }

    /// The source of scatter node `n` at multi-index `q` (over the index's
    /// or the source's shape): the source tensor there, or the scalar.
    fn scatter_source(&mut self, n: NodeId, q: &[String]) -> R<String> {
        let g = self.g;
        let out = g.meta(g.nodes[n].results[0]).dtype;
        match g.nodes[n].args.get(3) {
            Some(Arg::Tensor(s)) => {
                let sm = g.meta(*s).clone();
                let si = if sm.dim() == 0 {
                    "0u".to_string()
                } else {
                    self.ravel(q, &contiguous_strides(&sm.sizes), 0)
                };
                self.value_at(*s, &si)
            }
            _ => lit(metas(g, n).scalar(3).map_err(bug)?.to_f64(), out),
        }
    }

    /// The dtype `scatter_source` gives.
    fn scatter_source_dtype(&self, n: NodeId) -> DType {
        let g = self.g;
        match g.nodes[n].args.get(3) {
            Some(Arg::Tensor(s)) => g.meta(*s).dtype,
            _ => g.meta(g.nodes[n].results[0]).dtype,
        }
    }

    /// `scatter`, `scatter_add` (`add`), `index_copy` (`copy`): self, then
    /// every source element whose index names this position, in eager's
    /// order (the last write wins).
    fn scatter_into_at(&mut self, n: NodeId, add: bool, copy: bool, idx: &str) -> R<String> {
        let g = self.g;
        let node = &g.nodes[n];
        let out = g.meta(node.results[0]).clone();
        let margs = metas(g, n);
        let (x, index) = (self.tensor_arg(n, 0)?, self.tensor_arg(n, 2)?);
        let d = if out.dim() == 0 {
            0
        } else {
            kiln_functionalize::meta::wrap_dim(margs.int(1).map_err(bug)?, out.dim())
                .map_err(bug)?
        };
        let im = g.meta(index).clone();
        let steps = if copy || im.dim() == 0 {
            im.numel()
        } else {
            im.sizes[d]
        };
        let m = self.unravel(idx, &out.sizes);
        let base = self.value_at(x, idx)?;
        let t = ty(out.dtype);
        let acc = self.body.var(t, base);
        // A smaller index tensor reaches only part of self.
        let inside: Vec<String> = (0..im.dim())
            .filter(|&k| !copy && k != d && im.sizes[k] < out.sizes[k])
            .map(|k| format!("{} < {}", m[k], u(im.sizes[k])))
            .collect();
        if !inside.is_empty() {
            self.body.stmt(format!("if ({}) {{", inside.join(" && ")));
        }
        self.body
            .stmt(format!("for (var k = 0u; k < {}; k = k + 1u) {{", u(steps)));
        let saved = std::mem::take(&mut self.memo);
        let mut q = m.clone();
        if !q.is_empty() {
            q[d] = "k".into();
        }
        let ii = if copy || im.dim() == 0 {
            "k".to_string()
        } else {
            self.ravel(&q, &contiguous_strides(&im.sizes), 0)
        };
        let iv = self.value_at(index, &ii)?;
        let len = if out.dim() == 0 { 1 } else { out.sizes[d] };
        self.flag_index(n, &iv, len, false)?;
        let sv = self.scatter_source(n, &q)?;
        let here = m.get(d).cloned().unwrap_or_else(|| "0u".into());
        let update = if add { format!("{acc} + {sv}") } else { sv };
        self.body
            .stmt(format!("if (u32({iv}) == {here}) {{ {acc} = {update}; }}"));
        self.body.stmt("}".into());
        if !inside.is_empty() {
            self.body.stmt("}".into());
        }
        self.memo = saved;
        Ok(self.body.bind(t, acc))
    }

    /// The fill value at argument `i` of node `n` (a scalar, or a 0-d
    /// tensor read once), in the result's dtype (unbound).
    fn fill_value(&mut self, n: NodeId, i: usize) -> R<String> {
        let g = self.g;
        let node = &g.nodes[n];
        let out = g.meta(node.results[0]);
        match node.args.get(i) {
            Some(Arg::Tensor(t)) => {
                let x = self.value_at(*t, "0u")?;
                Ok(cast(&x, g.meta(*t).dtype, out.dtype))
            }
            _ => lit(metas(g, n).scalar(i).map_err(bug)?.to_f64(), out.dtype),
        }
    }

    /// `arange`: `start + step * i`, in f32 for floats as eager computes.
    fn arange_at(&mut self, n: NodeId, idx: &str) -> R<String> {
        let g = self.g;
        let node = &g.nodes[n];
        let out = g.meta(node.results[0]).clone();
        let margs = metas(g, n);
        let vals: Vec<f64> = (0..node.args.len())
            .filter_map(|i| margs.scalar(i).ok())
            .map(|s| s.to_f64())
            .collect();
        let (start, step) = match vals[..] {
            [_] => (0.0, 1.0),
            [s, _] => (s, 1.0),
            [s, _, st, ..] => (s, st),
            _ => return Err(bug("arange arguments")),
        };
        lit(
            start + step * out.numel().saturating_sub(1) as f64,
            out.dtype,
        )?;
        let e = if out.dtype.is_float() {
            format!(
                "{} + {} * f32({idx})",
                literal(start, DType::F32),
                literal(step, DType::F32)
            )
        } else {
            format!(
                "{} + {} * {}({idx})",
                lit(start, out.dtype)?,
                lit(step, out.dtype)?,
                ty(out.dtype)
            )
        };
        let r = self.body.bind(ty(out.dtype), e);
        let computed = if out.dtype.is_float() {
            DType::F32
        } else {
            out.dtype
        };
        Ok(self.body.bind(ty(out.dtype), cast(&r, computed, out.dtype)))
    }

    /// A region scatter: `src` inside the region, the base elsewhere.
    fn region_scatter_at(&mut self, n: NodeId, idx: &str) -> R<String> {
        let g = self.g;
        let node = &g.nodes[n];
        let out = g.meta(node.results[0]).clone();
        let (base, src) = (self.tensor_arg(n, 0)?, self.tensor_arg(n, 1)?);
        let bv = self.value_at(base, idx)?;
        let m = self.unravel(idx, &out.sizes);
        let (pred, src_m) = Region::of(g, n, &out).map_err(bug)?.emit(&m);
        let pred = self.body.bind("bool", pred);
        let sm = g.meta(src).clone();
        let si = self.ravel(&src_m, &contiguous_strides(&sm.sizes), 0);
        let si = self.body.bind("u32", format!("select(0u, {si}, {pred})"));
        // The same view of the base, read by the source at `si`, is
        // the base at `idx` (where the predicate holds): a chain of
        // region updates evaluates each base once per element.
        for &u in self.s.uses.get(&base).map(Vec::as_slice).unwrap_or(&[]) {
            for &c in &g.nodes[u].results {
                if crate::fusion::is_scatter_view_copy(g, n, c) {
                    self.memo.insert((c, si.clone()), bv.clone());
                }
            }
        }
        let sv = self.value_at(src, &si)?;
        let sv = cast(&sv, sm.dtype, out.dtype);
        Ok(self
            .body
            .bind(ty(out.dtype), format!("select({bv}, {sv}, {pred})")))
    }

    /// Element `idx` of a `flip`, `repeat` or `constant_pad_nd` result: the
    /// input at the multi-index `Remap` gives (the pad value outside it).
    fn remap_at(&mut self, n: NodeId, kind: RemapKind, idx: &str) -> R<String> {
        use kiln_functionalize::ops::kernels::Remap;
        let g = self.g;
        let node = &g.nodes[n];
        let margs = metas(g, n);
        let x = *node.args[0].tensors()[0];
        let xm = g.meta(x).clone();
        let out = g.meta(node.results[0]).clone();
        let r = Remap::of(kind, &margs).map_err(bug)?;
        let m = self.unravel(idx, &out.sizes);
        let mut inside = vec![];
        let sm: Vec<String> = match &r {
            Remap::Flip(dims) => (0..m.len())
                .map(|d| {
                    if dims.contains(&d) {
                        format!("({} - {})", u(xm.sizes[d].max(1) - 1), m[d])
                    } else {
                        m[d].clone()
                    }
                })
                .collect(),
            Remap::Repeat { lead } => (0..xm.dim())
                .map(|d| format!("({} % {})", m[lead + d], u(xm.sizes[d].max(1))))
                .collect(),
            Remap::Pad { before } => (0..xm.dim())
                .map(|d| {
                    let s = self
                        .body
                        .bind("i32", format!("i32({}) - {}i", m[d], before[d]));
                    inside.push(format!("({s} >= 0i && {s} < {}i)", xm.sizes[d]));
                    format!("u32(clamp({s}, 0i, {}i))", xm.sizes[d].max(1) - 1)
                })
                .collect(),
        };
        let si = self.ravel(&sm, &contiguous_strides(&xm.sizes), 0);
        let v = self.value_at(x, &si)?;
        let v = cast(&v, xm.dtype, out.dtype);
        if inside.is_empty() {
            return Ok(v);
        }
        let fill = margs
            .opt_scalar(2)
            .map_err(bug)?
            .map_or(0.0, |s| s.to_f64());
        Ok(self.body.bind(
            ty(out.dtype),
            format!(
                "select({}, {v}, {})",
                literal(fill, out.dtype),
                inside.join(" && ")
            ),
        ))
    }

    /// Element `idx` of a `cat` or `stack` result: the input whose region
    /// holds it (`index::reads`), the others' loads discarded by selects.
    fn join_at(&mut self, n: NodeId, idx: &str) -> R<String> {
        let g = self.g;
        let out = g.meta(g.nodes[n].results[0]).clone();
        let m = self.unravel(idx, &out.sizes);
        let mut acc = literal(0.0, out.dtype);
        for r in crate::index::reads(g, n, 0).map_err(bug)? {
            let crate::index::Read::Source(src, region) = r else {
                return Err(bug("a join read that is not a region"));
            };
            let (pred, sm) = region.emit(&m);
            let pred = self.body.bind("bool", pred);
            let smeta = g.meta(src).clone();
            let si = self.ravel(&sm, &contiguous_strides(&smeta.sizes), 0);
            let si = self.body.bind("u32", format!("select(0u, {si}, {pred})"));
            let x = self.value_at(src, &si)?;
            let x = cast(&x, smeta.dtype, out.dtype);
            acc = self
                .body
                .bind(ty(out.dtype), format!("select({acc}, {x}, {pred})"));
        }
        Ok(acc)
    }
}
