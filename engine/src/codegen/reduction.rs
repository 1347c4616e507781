//! Reductions along dimensions: sums, means, extremes, softmax and layer
//! norm (a row per invocation, or per 1-64 invocations through workgroup
//! memory on GPUs).

use super::template::{self, Env};
use super::*;

/// The workgroup array of a norm operand's row statistics
/// (`Gen::norm_rows`), and the first row it holds.
pub(super) const NORM_STATS: &str = "nrm";
pub(super) const NORM_FIRST: &str = "nrm_first";

/// Rows of `width` contiguous elements reduced by `lanes` invocations each
/// (a power of two up to 64; `64 / lanes` rows per workgroup), every
/// invocation holding `per` elements (strided by `lanes`) in registers.
pub(super) struct RowTile {
    pub(super) width: usize,
    pub(super) rows: usize,
    pub(super) lanes: usize,
    pub(super) per: usize,
}

impl RowTile {
    /// Rows up to 1024 wide keep their elements in registers (16 an
    /// invocation); wider rows (`looped`) are read in passes by 64 lanes.
    /// A row that fits one subgroup's registers (`subgroup`: the device's
    /// smallest) takes one subgroup: shuffles combine it, no workgroup
    /// memory or barrier (an H200 ran softmax over 49152 rows of 128 in
    /// 0.035 ms with 64 lanes a row, 2026-11-27).
    pub(super) fn new(width: usize, rows: usize, subgroup: Option<usize>) -> Option<RowTile> {
        let mut lanes = width.next_power_of_two().clamp(1, 64);
        if let Some(sg) = subgroup.filter(|&sg| (4..lanes).contains(&sg) && width <= 16 * sg) {
            lanes = sg;
        }
        let per = width.div_ceil(lanes);
        (width > 0).then_some(RowTile {
            width,
            rows,
            lanes,
            per,
        })
    }

    /// Too wide for registers: each pass loops over the row.
    pub(super) fn looped(&self) -> bool {
        self.per > 16
    }

    pub(super) fn workgroups(&self) -> usize {
        self.rows.div_ceil(64 / self.lanes).max(1)
    }
}

/// Lines of `len` elements along a dimension, `inner` apart.
struct Lines {
    len: usize,
    inner: usize,
    lines: usize,
}

/// A row kernel's lane and its elements: (value, in range, column, index).
pub(super) struct RowCtx {
    /// This invocation's row (past the last for spare invocations).
    pub(super) row: String,
    pub(super) lane: String,
    pub(super) xs: Vec<(String, String, String, String)>,
}

/// A reduction's lines (`Gen::reduction_lines`).
pub(super) struct ReducedLines {
    pub(super) input: ValueId,
    pub(super) red_op: kiln_functionalize::ops::Reduction,
    /// Kept dims' sizes and input strides: a line per output element.
    ks: Vec<usize>,
    kst: Vec<usize>,
    /// Reduced dims' sizes and input strides.
    rs: Vec<usize>,
    rst: Vec<usize>,
    /// Elements a line.
    pub(super) count: usize,
    /// Lines (output elements).
    pub(super) nout: usize,
    /// The reduced dims are the last ones.
    pub(super) trailing: bool,
}

impl Gen<'_> {
    /// `acc += x` with Kahan compensation `c` (keeps f32 sums close to the
    /// reference's f64).
    fn kahan_add(&mut self, acc: &str, c: &str, x: &str) {
        let y = self.body.bind("f32", format!("{x} - {c}"));
        let t = self.body.bind("f32", format!("{acc} + {y}"));
        self.body.stmt(format!("{c} = ({t} - {acc}) - {y};"));
        self.body.stmt(format!("{acc} = {t};"));
    }

    /// `acc += x` for an integer sum; an i64 sum flags leaving the
    /// device's 32-bit range (`wgsl::ty`).
    fn checked_add(&mut self, n: NodeId, acc: &str, x: &str, dt: DType) -> R<()> {
        if dt == DType::I64 {
            let r = self.body.bind("i32", format!("{acc} + {x}"));
            self.flag_overflow(n, &format!("k_add_ovf({acc}, {x}, {r})"))?;
        }
        self.body.stmt(format!("{acc} = {acc} + {x};"));
        Ok(())
    }

    /// `acc *= x`, i64 products out of range flagged.
    fn checked_mul(&mut self, n: NodeId, acc: &str, x: &str, dt: DType) -> R<()> {
        if dt == DType::I64 {
            self.flag_overflow(n, &format!("k_mul_ovf({acc}, {x})"))?;
        }
        self.body.stmt(format!("{acc} = {acc} * {x};"));
        Ok(())
    }

    pub(super) fn reduce(
        &mut self,
        n: NodeId,
        v: ValueId,
        margs: &[Arg<&Meta>],
        label: String,
    ) -> R<KernelCode> {
        use kiln_functionalize::ops::Reduction as Red;
        let ReducedLines {
            input,
            red_op,
            count,
            nout,
            trailing,
            ..
        } = self.reduction_lines(n, v, margs)?;
        let acc_dt = self.meta(v).dtype;
        // Float sums over trailing (contiguous) dims on GPUs: a row per
        // 1-64 invocations. One invocation per row read its row serially,
        // its neighbours' rows a row apart: an H100 took 67 us for
        // LLaMA's RMSNorm mean over 128 rows of 512.
        if self.workgroup_rows
            && matches!(red_op, Red::Sum | Red::Mean)
            && acc_dt.is_float()
            && trailing
        {
            if let Some(t) = RowTile::new(count, nout, self.subgroup).filter(|t| !t.looped()) {
                return self.sum_rows(input, v, red_op == Red::Mean, t, label);
            }
        }
        self.body
            .stmt(format!("if (gid >= {}) {{ return; }}", u(nout)));
        self.reduce_at(n, v, margs, "gid")?;
        Ok(self.finish(
            label,
            wgsl::grid(nout, self.workgroup),
            [self.workgroup, 1, 1],
        ))
    }

    /// Reduction node `n`'s input, op, and its lines: the kept and reduced
    /// dims' sizes and strides, elements per line, lines (outputs), and
    /// whether the reduced dims trail.
    pub(super) fn reduction_lines(
        &self,
        n: NodeId,
        v: ValueId,
        margs: &[Arg<&Meta>],
    ) -> R<ReducedLines> {
        let g = self.g;
        let node = &g.nodes[n];
        let Lowering::Reduce(red_op) = node.op.def().lowering else {
            return Err(bug(format!("{} is no reduction", node.op.name())));
        };
        let input = *node.args[0].tensors()[0];
        let im = g.meta(input).clone();
        let red = crate::fusion::reduced_dims(red_op, margs, im.dim()).map_err(bug)?;
        let kept: Vec<usize> = (0..im.dim()).filter(|&d| !red[d]).collect();
        let reduced: Vec<usize> = (0..im.dim()).filter(|&d| red[d]).collect();
        let istr = contiguous_strides(&im.sizes);
        let rs: Vec<usize> = reduced.iter().map(|&d| im.sizes[d]).collect();
        let trailing = !reduced.is_empty()
            && reduced
                .iter()
                .enumerate()
                .all(|(i, &d)| d == im.dim() - reduced.len() + i);
        Ok(ReducedLines {
            input,
            red_op,
            ks: kept.iter().map(|&d| im.sizes[d]).collect(),
            kst: kept.iter().map(|&d| istr[d]).collect(),
            count: numel(&rs),
            rst: reduced.iter().map(|&d| istr[d]).collect(),
            rs,
            nout: g.meta(v).numel(),
            trailing,
        })
    }

    /// Reduction node `n` for output element `out` (a u32 expression) of
    /// `v`: its line reduced, stored (or its `Fused::Rows` tail over the
    /// line).
    pub(super) fn reduce_at(
        &mut self,
        n: NodeId,
        v: ValueId,
        margs: &[Arg<&Meta>],
        out: &str,
    ) -> R<()> {
        use kiln_functionalize::ops::Reduction as Red;
        let ReducedLines {
            input,
            red_op,
            ks,
            kst,
            rs,
            rst,
            count,
            ..
        } = self.reduction_lines(n, v, margs)?;
        let im = self.meta(input).clone();
        let acc_dt = self.meta(v).dtype;
        let acc_ty = ty(acc_dt);
        let km = self.unravel(out, &ks);
        let kbase = self.ravel(&km, &kst, 0);
        let float = acc_dt.is_float();
        let (init, is_sum) = match red_op {
            Red::Amax => (extreme_literal(acc_dt, false), false),
            Red::Amin => (extreme_literal(acc_dt, true), false),
            Red::Prod => (literal(1.0, acc_dt), false),
            _ => (literal(0.0, acc_dt), true),
        };
        let acc = self.body.var(acc_ty, init);
        let comp = if is_sum && float {
            Some(self.body.var("f32", "0.0".into()))
        } else {
            None
        };
        let nan = if float && !is_sum {
            Some(self.body.var("bool", "false".into()))
        } else {
            None
        };
        self.body
            .stmt(format!("for (var r = 0u; r < {}; r = r + 1u) {{", u(count)));
        let saved = std::mem::take(&mut self.memo);
        let at = self.reduced_element(&kbase, &rs, &rst);
        self.prologue_at(&at)?;
        let x = self.value_at(input, &at)?;
        let x = self.body.bind(acc_ty, cast(&x, im.dtype, acc_dt));
        match (red_op, &comp, &nan) {
            (_, Some(c), _) => self.kahan_add(&acc, c, &x),
            (_, None, _) if is_sum => self.checked_add(n, &acc, &x, acc_dt)?,
            (Red::Prod, _, _) => self.checked_mul(n, &acc, &x, acc_dt)?,
            (Red::Amax, _, _) if acc_dt == DType::Bool => {
                self.body.stmt(format!("{acc} = {acc} || {x};"))
            }
            (_, _, _) if acc_dt == DType::Bool => self.body.stmt(format!("{acc} = {acc} && {x};")),
            (Red::Amax, _, _) => self.body.stmt(format!("{acc} = max({acc}, {x});")),
            _ => self.body.stmt(format!("{acc} = min({acc}, {x});")),
        }
        if let Some(nv) = &nan {
            self.body.stmt(format!("{nv} = {nv} || k_isnan({x});"));
        }
        self.body.stmt("}".into());
        self.memo = saved;
        self.group.clear();
        self.own = "gid".into();
        let mut res = acc.clone();
        if red_op == Red::Mean {
            res = self.body.bind(acc_ty, format!("{acc} / f32({})", u(count)));
        }
        if let Red::Var { sqrt } = red_op {
            // A second pass: squared deviations from the mean (the
            // corrected two-pass algorithm, as the reference computes).
            let mean = self.body.bind("f32", format!("{acc} / f32({})", u(count)));
            let ss = self.body.var("f32", "0.0".into());
            let sc = self.body.var("f32", "0.0".into());
            self.body
                .stmt(format!("for (var r = 0u; r < {}; r = r + 1u) {{", u(count)));
            let saved = std::mem::take(&mut self.memo);
            let at = self.reduced_element(&kbase, &rs, &rst);
            let x = self.value_at(input, &at)?;
            let x = self.body.bind("f32", cast(&x, im.dtype, DType::F32));
            let d = self
                .body
                .bind("f32", format!("({x} - {mean}) * ({x} - {mean})"));
            self.kahan_add(&ss, &sc, &d);
            self.body.stmt("}".into());
            self.memo = saved;
            let c = kiln_functionalize::ops::kernels::var_correction(margs).map_err(bug)?;
            let denom = (count as f64 - c).max(0.0);
            res = self
                .body
                .bind("f32", format!("{ss} / {}", literal(denom, DType::F32)));
            if sqrt {
                res = self.body.bind("f32", format!("sqrt({res})"));
            }
        }
        if let Some(nv) = nan {
            res = self.body.bind(
                acc_ty,
                format!("select({res}, {}, {nv})", literal(f64::NAN, DType::F32)),
            );
        }
        if self.rows.is_some_and(|(r, _)| r == v) {
            // The tail over the row: a second pass over its elements.
            self.body
                .stmt(format!("for (var r = 0u; r < {}; r = r + 1u) {{", u(count)));
            let saved = std::mem::take(&mut self.memo);
            let at = self.reduced_element(&kbase, &rs, &rst);
            self.rows_tail_at(v, &res, &at)?;
            self.body.stmt("}".into());
            self.memo = saved;
        } else {
            self.store_to(v, out, &res)?;
        }
        Ok(())
    }

    /// The elementwise members folded into this reduction
    /// (`Gen::prologue`) at element `at` of its input: computed (the
    /// reduction reads its input from them), the materialized ones
    /// stored. Each element is visited once, by one invocation.
    fn prologue_at(&mut self, at: &str) -> R<()> {
        if self.prologue.is_empty() {
            return Ok(());
        }
        self.group = self.prologue.clone();
        self.members_at(&self.prologue.clone(), at)
    }

    /// Element `r` (the loop's counter) of the reduced dims (sizes `rs`,
    /// strides `rst`) of the line starting at `kbase`.
    fn reduced_element(&mut self, kbase: &str, rs: &[usize], rst: &[usize]) -> String {
        let rm = self.unravel("r", rs);
        let roff = self.ravel(&rm, rst, 0);
        self.body.bind("u32", format!("{kbase} + {roff}"))
    }

    /// `sum` or `mean` of contiguous rows (`reduce`'s trailing dims): a row
    /// per `lanes` invocations, its elements read once, summed per lane,
    /// then across the lanes (pairwise, as the reference's f64 sum needs
    /// no compensation at these widths); lane 0 stores.
    fn sum_rows(
        &mut self,
        input: ValueId,
        v: ValueId,
        mean: bool,
        t: RowTile,
        label: String,
    ) -> R<KernelCode> {
        let od = self.meta(v).dtype;
        let RowCtx { row, lane, xs } = self.row_elements(input, &t)?;
        let mut sum = "0.0".to_string();
        for (x, inr, _, _) in &xs {
            sum = self
                .body
                .bind("f32", format!("{sum} + select(0.0, {x}, {inr})"));
        }
        let total = self.row_reduce(&t, &lane, &[&sum], false)?.remove(0);
        let res = if mean {
            self.body
                .bind("f32", format!("{total} / f32({})", u(t.width)))
        } else {
            total
        };
        if self.rows.is_some_and(|(r, _)| r == v) {
            // Every lane has the row's result: the tail at its elements.
            let res = self.body.bind(ty(od), cast(&res, DType::F32, od));
            for (_, inr, _, at) in &xs {
                self.body.stmt(format!("if ({inr}) {{"));
                self.rows_tail_at(v, &res, at)?;
                self.body.stmt("}".into());
            }
        } else {
            self.body
                .stmt(format!("if ({lane} == 0u && {row} < {}) {{", u(t.rows)));
            self.store_to(v, &row, &cast(&res, DType::F32, od))?;
            self.body.stmt("}".into());
        }
        Ok(self.finish(label, wgsl::fold(t.workgroups()), [64, 1, 1]))
    }

    /// The `Fused::Rows` tail of reduction result `v` at element `at` of
    /// its rows, stored there: its reads of `v` get `res`, the row's
    /// result.
    fn rows_tail_at(&mut self, v: ValueId, res: &str, at: &str) -> R<()> {
        let Some((_, t)) = self.rows else {
            return Err(bug("a row tail outside a row kernel"));
        };
        let g = self.g;
        let saved = self.memo.clone();
        self.row_result = Some((v, res.to_string()));
        let Def::Node(tn, tk) = g.values[t].def else {
            return Err(bug("a row tail without a node"));
        };
        let y = self.node_at(tn, tk, at);
        self.row_result = None;
        self.memo = saved;
        self.store_plain(t, at, &y?)
    }

    /// The input of node `n` (softmax, cumsum: `(self, dim, ...)`) and its
    /// lines along `dim`.
    fn lines(&self, n: NodeId) -> R<(ValueId, Meta, Lines)> {
        let node = &self.g.nodes[n];
        let input = *node.args[0].tensors()[0];
        let im = self.meta(input).clone();
        let (len, inner) = match node.args[1] {
            _ if im.dim() == 0 => (1, 1),
            Arg::Int(d) => {
                let d = kiln_functionalize::meta::wrap_dim(d, im.dim()).map_err(bug)?;
                (im.sizes[d], im.sizes[d + 1..].iter().product())
            }
            _ => return Err(bug(format!("{}: no dim", node.op.name()))),
        };
        let lines = im.numel() / len.max(1);
        Ok((input, im, Lines { len, inner, lines }))
    }

    /// Guards a line-per-invocation kernel; the first element of this
    /// invocation's line (elements `base + k * inner`).
    fn line_base(&mut self, len: usize, inner: usize, lines: usize) -> String {
        self.body
            .stmt(format!("if (gid >= {}) {{ return; }}", u(lines)));
        self.body.bind(
            "u32",
            format!("(gid / {i}) * {} + gid % {i}", u(len * inner), i = u(inner)),
        )
    }

    /// `cumsum`: one invocation per line along `dim`, a running (Kahan,
    /// for floats) sum stored at every element.
    pub(super) fn cumsum(&mut self, n: NodeId, v: ValueId, label: String) -> R<KernelCode> {
        let (input, im, Lines { len, inner, lines }) = self.lines(n)?;
        let om = self.meta(v).clone();
        let (t, dt) = (ty(om.dtype), om.dtype);
        let base = self.line_base(len, inner, lines);
        let acc = self.body.var(t, literal(0.0, dt));
        let comp = dt.is_float().then(|| self.body.var("f32", "0.0".into()));
        self.body
            .stmt(format!("for (var k = 0u; k < {}; k = k + 1u) {{", u(len)));
        let saved = std::mem::take(&mut self.memo);
        let at = self.body.bind("u32", format!("{base} + k * {}", u(inner)));
        let x = self.value_at(input, &at)?;
        let x = self.body.bind(t, cast(&x, im.dtype, dt));
        match &comp {
            Some(c) => self.kahan_add(&acc, c, &x),
            None => self.checked_add(n, &acc, &x, dt)?,
        }
        // f16 results are rounded where stored; the sum runs in f32.
        self.store_to(v, &at, &acc)?;
        self.body.stmt("}".into());
        self.memo = saved;
        Ok(self.finish(
            label,
            wgsl::grid(lines, self.workgroup),
            [self.workgroup, 1, 1],
        ))
    }

    /// One invocation per line along `dim`: max, sum of exponentials, write.
    pub(super) fn softmax(
        &mut self,
        n: NodeId,
        v: ValueId,
        log: bool,
        label: String,
    ) -> R<KernelCode> {
        let (input, _, Lines { len, inner, lines }) = self.lines(n)?;
        if let Some(t) =
            RowTile::new(len, lines, self.subgroup).filter(|_| inner == 1 && self.workgroup_rows)
        {
            if t.looped() {
                return self.softmax_wide(input, v, log, t, label);
            }
            return self.softmax_rows(input, v, log, t, label);
        }
        // A line per invocation: contiguous lines are whole words.
        if inner == 1 {
            self.stores_runs(v, len);
        }
        let base = self.line_base(len, inner, lines);
        self.softmax_line(input, v, log, &base, len, inner)?;
        Ok(self.finish(
            label,
            wgsl::grid(lines, self.workgroup),
            [self.workgroup, 1, 1],
        ))
    }

    /// Softmax (or log-softmax) of `input` into `v` over the line of `len`
    /// elements `base + k * inner`: max, sum of exponentials, write.
    pub(super) fn softmax_line(
        &mut self,
        input: ValueId,
        v: ValueId,
        log: bool,
        base: &str,
        len: usize,
        inner: usize,
    ) -> R<()> {
        let (im, om) = (self.meta(input).clone(), self.meta(v).clone());
        let read = |s: &mut Self, k: &str| -> R<String> {
            let at = s.body.bind("u32", format!("{base} + {k} * {}", u(inner)));
            let x = s.value_at(input, &at)?;
            Ok(s.body.bind("f32", cast(&x, im.dtype, DType::F32)))
        };
        let mx = self.body.var("f32", literal(f64::NEG_INFINITY, DType::F32));
        self.body
            .stmt(format!("for (var k = 0u; k < {}; k = k + 1u) {{", u(len)));
        let saved = std::mem::take(&mut self.memo);
        let x = read(self, "k")?;
        self.body.stmt(format!("{mx} = max({mx}, {x});"));
        self.body.stmt("}".into());
        self.memo.clear();
        let sum = self.body.var("f32", "0.0".into());
        self.body
            .stmt(format!("for (var k = 0u; k < {}; k = k + 1u) {{", u(len)));
        let x = read(self, "k")?;
        self.body.stmt(format!("{sum} = {sum} + exp({x} - {mx});"));
        self.body.stmt("}".into());
        self.memo.clear();
        self.body
            .stmt(format!("for (var k = 0u; k < {}; k = k + 1u) {{", u(len)));
        let x = read(self, "k")?;
        let y = if log {
            format!("{x} - {mx} - log({sum})")
        } else {
            format!("exp({x} - {mx}) / {sum}")
        };
        let y = self.body.bind("f32", y);
        let at = self.body.bind("u32", format!("{base} + k * {}", u(inner)));
        let y = cast(&y, DType::F32, om.dtype);
        self.store_to(v, &at, &y)?;
        self.body.stmt("}".into());
        self.memo = saved;
        Ok(())
    }

    pub(super) fn layer_norm(&mut self, n: NodeId, v: ValueId, label: String) -> R<KernelCode> {
        let (input, width, weight, bias, eps) = self.layer_norm_args(n)?;
        let im = self.meta(input).clone();
        let rows = im.numel() / width.max(1);
        if let Some(t) = RowTile::new(width, rows, self.subgroup).filter(|_| self.workgroup_rows) {
            if t.looped() {
                return self.layer_norm_wide(input, v, weight, bias, eps, t, label);
            }
            return self.layer_norm_rows(input, v, weight, bias, eps, t, label);
        }
        // A row per invocation: it stores its row's words whole.
        self.stores_runs(v, width);
        self.body
            .stmt(format!("if (gid >= {}) {{ return; }}", u(rows)));
        let base = self.body.bind("u32", format!("gid * {}", u(width)));
        self.layer_norm_row(n, v, &base)?;
        Ok(self.finish(
            label,
            wgsl::grid(rows, self.workgroup),
            [self.workgroup, 1, 1],
        ))
    }

    /// Layer norm node `n` into `v` over the row of its elements from
    /// `base`: the corrected two-pass statistics, then each element.
    pub(super) fn layer_norm_row(&mut self, n: NodeId, v: ValueId, base: &str) -> R<()> {
        let (input, _, weight, bias, _) = self.layer_norm_args(n)?;
        let im = self.meta(input).clone();
        let saved = std::mem::take(&mut self.memo);
        let (mean, rstd, width) = self.norm_row_stats(n, base)?;
        self.body
            .stmt(format!("for (var k = 0u; k < {}; k = k + 1u) {{", u(width)));
        let at = self.body.bind("u32", format!("{base} + k"));
        let x = self.value_at(input, &at)?;
        let x = self.body.bind("f32", cast(&x, im.dtype, DType::F32));
        let y = self.norm_affine(&x, &mean, &rstd, weight, bias, "k")?;
        let y = cast(&y, DType::F32, im.dtype);
        self.store_to(v, &at, &y)?;
        self.body.stmt("}".into());
        self.memo = saved;
        Ok(())
    }

    /// The mean and reciprocal deviation of layer norm node `n`'s row of
    /// elements from `base`, read by one invocation: the compensated
    /// sum's mean, refined by the deviations' sum (exact for constant
    /// rows), their squares giving the variance. Leaves the memo clear.
    pub(super) fn norm_row_stats(&mut self, n: NodeId, base: &str) -> R<(String, String, usize)> {
        let (input, width, _, _, eps) = self.layer_norm_args(n)?;
        let im = self.meta(input).clone();
        let read = |s: &mut Self| -> R<String> {
            let at = s.body.bind("u32", format!("{base} + k"));
            let x = s.value_at(input, &at)?;
            Ok(s.body.bind("f32", cast(&x, im.dtype, DType::F32)))
        };
        self.memo.clear();
        let sum = self.body.var("f32", "0.0".into());
        let c = self.body.var("f32", "0.0".into());
        self.body
            .stmt(format!("for (var k = 0u; k < {}; k = k + 1u) {{", u(width)));
        let x = read(self)?;
        let y = self.body.bind("f32", format!("{x} - {c}"));
        let t = self.body.bind("f32", format!("{sum} + {y}"));
        self.body.stmt(format!("{c} = ({t} - {sum}) - {y};"));
        self.body.stmt(format!("{sum} = {t};"));
        self.body.stmt("}".into());
        self.memo.clear();
        let mean0 = self.body.bind("f32", format!("{sum} / f32({})", u(width)));
        let dev = self.body.var("f32", "0.0".into());
        let sq = self.body.var("f32", "0.0".into());
        self.body
            .stmt(format!("for (var k = 0u; k < {}; k = k + 1u) {{", u(width)));
        let x = read(self)?;
        let d = self.body.bind("f32", format!("{x} - {mean0}"));
        self.body.stmt(format!("{dev} = {dev} + {d};"));
        self.body.stmt(format!("{sq} = {sq} + {d} * {d};"));
        self.body.stmt("}".into());
        self.memo.clear();
        let (mean, rstd) = self.norm_stats(&mean0, &dev, &sq, width, eps);
        Ok((mean, rstd, width))
    }

    /// `norm_row_stats` over an f32 row bound as vectors (`width` a
    /// multiple of 4): four compensated sums, a quarter of the loads.
    fn norm_row_stats_quads(
        &mut self,
        q: &Slot,
        base: &str,
        width: usize,
        eps: f64,
    ) -> (String, String) {
        let w = u(width);
        let x = super::matmul::vec4_at(q, &format!("{base} + k"));
        let sum = self.body.var("vec4<f32>", "vec4<f32>(0.0)".into());
        let c = self.body.var("vec4<f32>", "vec4<f32>(0.0)".into());
        self.body
            .stmt(format!("for (var k = 0u; k < {w}; k = k + 4u) {{"));
        let y = self.body.bind("vec4<f32>", format!("{x} - {c}"));
        let t = self.body.bind("vec4<f32>", format!("{sum} + {y}"));
        self.body.stmt(format!("{c} = ({t} - {sum}) - {y};"));
        self.body.stmt(format!("{sum} = {t};"));
        self.body.stmt("}".into());
        let mean0 = self.body.bind(
            "f32",
            format!("(({sum}.x + {sum}.y) + ({sum}.z + {sum}.w)) / f32({w})"),
        );
        let dev = self.body.var("vec4<f32>", "vec4<f32>(0.0)".into());
        let sq = self.body.var("vec4<f32>", "vec4<f32>(0.0)".into());
        self.body
            .stmt(format!("for (var k = 0u; k < {w}; k = k + 4u) {{"));
        let d = self
            .body
            .bind("vec4<f32>", format!("{x} - vec4<f32>({mean0})"));
        self.body.stmt(format!("{dev} = {dev} + {d};"));
        self.body.stmt(format!("{sq} = {sq} + {d} * {d};"));
        self.body.stmt("}".into());
        let total = |v: &str| format!("(({v}.x + {v}.y) + ({v}.z + {v}.w))");
        let dev = self.body.bind("f32", total(&dev));
        let sq = self.body.bind("f32", total(&sq));
        self.norm_stats(&mean0, &dev, &sq, width, eps)
    }

    /// Element `idx` of norm operand `v` (`Schedule::norm_operands`) in
    /// the product kernel computing it: its input there normalized with
    /// its row's statistics from the workgroup's array (`NORM_STATS`).
    pub(super) fn norm_at(&mut self, v: ValueId, idx: &str) -> R<String> {
        let (input, width, weight, bias, _) = self.norm_node_args(v)?;
        let w = u(width);
        let row = self.body.bind("u32", format!("{idx} / {w}"));
        let k = self.body.bind("u32", format!("{idx} % {w}"));
        let st = self
            .body
            .bind("vec2<f32>", format!("{NORM_STATS}[{row} - {NORM_FIRST}]"));
        let x = self.value_at(input, idx)?;
        let x = self
            .body
            .bind("f32", cast(&x, self.meta(input).dtype, DType::F32));
        let y = self.norm_affine(&x, &format!("{st}.x"), &format!("{st}.y"), weight, bias, &k)?;
        Ok(self.body.bind(
            ty(self.meta(v).dtype),
            cast(&y, DType::F32, self.meta(v).dtype),
        ))
    }

    /// The statistics of norm operand `v`'s `rows` rows from `NORM_FIRST`
    /// (those below `total`) into the workgroup array `NORM_STATS`, `threads`
    /// invocations (local index `lidx`) a row each at a time, then a
    /// barrier: lines moved to `start` of the body, ahead of the product
    /// reading them (in uniform control flow, before any early return).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn norm_rows_first(
        &mut self,
        v: ValueId,
        start: usize,
        rows: usize,
        total: usize,
        threads: usize,
        lidx: &str,
    ) -> R<()> {
        let Def::Node(n, _) = self.g.values[v].def else {
            return Err(bug("a norm operand without a node"));
        };
        let (input, width, _, _, eps) = self.layer_norm_args(n)?;
        let saved = std::mem::take(&mut self.memo);
        let end = self.body.lines.len();
        self.shared.push(format!(
            "var<workgroup> {NORM_STATS}: array<vec2<f32>, {}>;",
            rows.max(1)
        ));
        self.body
            .stmt(format!("let {NORM_FIRST}: u32 = wid.y * {};", u(rows)));
        self.body.stmt(format!(
            "for (var nr = {lidx}; nr < {}; nr = nr + {}) {{",
            u(rows),
            u(threads)
        ));
        let row = self.body.bind("u32", format!("{NORM_FIRST} + nr"));
        self.body.stmt(format!("if ({row} < {}) {{", u(total)));
        let base = self.body.bind("u32", format!("{row} * {}", u(width)));
        let quads = match width.is_multiple_of(4) {
            true => self.vec4_slot_of(input)?,
            false => None,
        };
        let (mean, rstd) = match quads {
            Some(q) => self.norm_row_stats_quads(&q, &base, width, eps),
            None => {
                let (mean, rstd, _) = self.norm_row_stats(n, &base)?;
                (mean, rstd)
            }
        };
        self.body
            .stmt(format!("{NORM_STATS}[nr] = vec2<f32>({mean}, {rstd});"));
        self.body.stmt("}".into());
        self.body.stmt("}".into());
        self.body.stmt("workgroupBarrier();".into());
        let lines = self.body.lines.split_off(end);
        self.body.lines.splice(start..start, lines);
        self.memo = saved;
        Ok(())
    }

    /// `layer_norm_args` of the node computing norm value `v`.
    #[allow(clippy::type_complexity)]
    pub(super) fn norm_node_args(
        &self,
        v: ValueId,
    ) -> R<(ValueId, usize, Option<ValueId>, Option<ValueId>, f64)> {
        let Def::Node(n, _) = self.g.values[v].def else {
            return Err(bug("a norm operand without a node"));
        };
        self.layer_norm_args(n)
    }

    /// Layer norm node `n`'s input, normalized width, weight, bias and eps.
    #[allow(clippy::type_complexity)]
    pub(super) fn layer_norm_args(
        &self,
        n: NodeId,
    ) -> R<(ValueId, usize, Option<ValueId>, Option<ValueId>, f64)> {
        let node = &self.g.nodes[n];
        let input = *node.args[0].tensors()[0];
        let width: usize = match &node.args[1] {
            Arg::IntList(l) => l.iter().product::<i64>() as usize,
            _ => return Err(bug("layer_norm shape")),
        };
        let tensor = |i: usize| {
            node.args
                .get(i)
                .and_then(|a| a.tensors().first().map(|x| **x))
        };
        let eps = match node.args.get(4) {
            Some(Arg::Float(e)) => *e,
            _ => 1e-5,
        };
        Ok((input, width, tensor(2), tensor(3), eps))
    }

    /// Shared setup of a row kernel: this invocation's row (`None` when
    /// past the last), its lane, and its elements of the row in registers
    /// as (value, in range, column) triples.
    pub(super) fn row_elements(&mut self, input: ValueId, t: &RowTile) -> R<RowCtx> {
        let im = self.meta(input).clone();
        self.shared
            .push("var<workgroup> red: array<f32, 128>;".into());
        let per_wg = 64 / t.lanes;
        let row = self.body.bind(
            "u32",
            format!(
                "(wid.y * nwg.x + wid.x) * {} + lid.x / {}",
                u(per_wg),
                u(t.lanes)
            ),
        );
        let lane = self.body.bind("u32", format!("lid.x % {}", u(t.lanes)));
        let valid = self.body.bind("bool", format!("{row} < {}", u(t.rows)));
        let base = self.body.bind("u32", format!("{row} * {}", u(t.width)));
        let mut xs = vec![];
        for e in 0..t.per {
            let k = self
                .body
                .bind("u32", format!("{lane} + {}", u(e * t.lanes)));
            let inr = self
                .body
                .bind("bool", format!("{valid} && {k} < {}", u(t.width)));
            let at = self
                .body
                .bind("u32", format!("select(0u, {base} + {k}, {inr})"));
            let x = self.value_at(input, &at)?;
            let x = self.body.bind("f32", cast(&x, im.dtype, DType::F32));
            xs.push((x, inr, k, at));
        }
        Ok(RowCtx { row, lane, xs })
    }

    /// Each of `partials` combined over the lanes of each row through
    /// workgroup memory, or subgroup shuffles first where the device has
    /// them (`shaders/templates/row_combine.wgsl`); every lane gets the
    /// results.
    pub(super) fn row_reduce(
        &mut self,
        t: &RowTile,
        lane: &str,
        partials: &[&str],
        max: bool,
    ) -> R<Vec<String>> {
        let sg = self.subgroup.filter(|&sg| t.lanes > 1 && sg <= 64);
        let block = t.lanes.min(sg.unwrap_or(t.lanes));
        let halves = |from: usize| {
            std::iter::successors(Some(from / 2), |m| Some(m / 2))
                .take_while(|&m| m >= 1)
                .map(|m| m.to_string())
                .collect::<Vec<_>>()
        };
        let mut env = Env::default()
            .b("subgroup", sg.is_some())
            .b("max", max)
            .b("split", block != t.lanes)
            .n("parts", partials.len())
            .n("block", block)
            .l("masks", halves(block))
            .l("strides", halves(t.lanes))
            .l(
                "later_blocks",
                (1..t.lanes / block).map(|b| b.to_string()).collect(),
            )
            .s("lane", lane);
        for (i, p) in partials.iter().enumerate() {
            env = env.s(&format!("part{i}"), *p).n(&format!("red{i}"), 64 * i);
        }
        self.uses_subgroup |= sg.is_some();
        template::ROW_COMBINE.render(self, &mut env, &mut |_, hole, _, _| {
            Err(bug(format!("row template: no hole `{hole}`")))
        })?;
        (0..partials.len())
            .map(|i| env.get(&format!("res{i}")))
            .collect()
    }

    /// Softmax along contiguous rows: a row per `lanes` invocations, its
    /// elements read once into registers, max and sum reduced across the
    /// lanes, one write.
    pub(super) fn softmax_rows(
        &mut self,
        input: ValueId,
        v: ValueId,
        log: bool,
        t: RowTile,
        label: String,
    ) -> R<KernelCode> {
        let od = self.meta(v).dtype;
        let RowCtx { lane, xs, .. } = self.row_elements(input, &t)?;
        let ninf = literal(f64::NEG_INFINITY, DType::F32);
        let mut m = ninf.clone();
        for (x, inr, _, _) in &xs {
            m = self
                .body
                .bind("f32", format!("max({m}, select({ninf}, {x}, {inr}))"));
        }
        let mx = self.row_reduce(&t, &lane, &[&m], true)?.remove(0);
        let mut sum = "0.0".to_string();
        let mut es = vec![];
        for (x, inr, _, _) in &xs {
            let e = self.body.bind("f32", format!("exp({x} - {mx})"));
            sum = self
                .body
                .bind("f32", format!("{sum} + select(0.0, {e}, {inr})"));
            es.push(e);
        }
        let total = self.row_reduce(&t, &lane, &[&sum], false)?.remove(0);
        for ((x, inr, _, at), e) in xs.iter().zip(&es) {
            let y = if log {
                format!("{x} - {mx} - log({total})")
            } else {
                format!("{e} / {total}")
            };
            let y = self.body.bind("f32", y);
            self.body.stmt(format!("if ({inr}) {{"));
            self.store_to(v, at, &cast(&y, DType::F32, od))?;
            self.body.stmt("}".into());
        }
        Ok(self.finish(label, wgsl::fold(t.workgroups()), [64, 1, 1]))
    }

    /// Layer norm's statistics from the first-pass mean and the second
    /// pass's deviation and square sums (the corrected two-pass algorithm:
    /// the deviations' sum refines the mean, exact for constant rows):
    /// the mean and the reciprocal standard deviation.
    fn norm_stats(
        &mut self,
        mean0: &str,
        dev: &str,
        sq: &str,
        width: usize,
        eps: f64,
    ) -> (String, String) {
        let w = u(width);
        let corr = self.body.bind("f32", format!("{dev} / f32({w})"));
        let mean = self.body.bind("f32", format!("{mean0} + {corr}"));
        let var = self.body.bind(
            "f32",
            format!("max({sq} / f32({w}) - {corr} * {corr}, 0.0)"),
        );
        let rstd = self.body.bind(
            "f32",
            format!("inverseSqrt({var} + {})", literal(eps, DType::F32)),
        );
        (mean, rstd)
    }

    /// `(x - mean) * rstd`, times the weight and plus the bias at column
    /// `k` when given.
    fn norm_affine(
        &mut self,
        x: &str,
        mean: &str,
        rstd: &str,
        weight: Option<ValueId>,
        bias: Option<ValueId>,
        k: &str,
    ) -> R<String> {
        let mut y = self.body.bind("f32", format!("({x} - {mean}) * {rstd}"));
        for (t, op) in [(weight, "*"), (bias, "+")] {
            if let Some(t) = t {
                let c = self.value_at(t, k)?;
                let c = cast(&c, self.meta(t).dtype, DType::F32);
                y = self.body.bind("f32", format!("{y} {op} {c}"));
            }
        }
        Ok(y)
    }

    /// A wide row's setup: the row of this workgroup (64 lanes), whether
    /// it exists, and its first element.
    fn wide_row(&mut self, t: &RowTile) -> (String, String) {
        self.shared
            .push("var<workgroup> red: array<f32, 128>;".into());
        let row = self.body.bind("u32", "wid.y * nwg.x + wid.x".into());
        let valid = self.body.bind("bool", format!("{row} < {}", u(t.rows)));
        let end = self
            .body
            .bind("u32", format!("select(0u, {}, {valid})", u(t.width)));
        let base = self.body.bind("u32", format!("{row} * {}", u(t.width)));
        (end, base)
    }

    /// Opens `for (k = lane; k < end; k += 64)` and reads the element there.
    fn wide_pass(&mut self, input: ValueId, end: &str, base: &str) -> R<String> {
        let im = self.meta(input).dtype;
        self.body
            .stmt(format!("for (var k = lid.x; k < {end}; k = k + 64u) {{"));
        let at = self.body.bind("u32", format!("{base} + k"));
        let x = self.value_at(input, &at)?;
        Ok(self.body.bind("f32", cast(&x, im, DType::F32)))
    }

    /// Softmax over rows wider than 1024: a row per workgroup of 64, three
    /// coalesced passes (max, sum, write) with reductions between.
    fn softmax_wide(
        &mut self,
        input: ValueId,
        v: ValueId,
        log: bool,
        t: RowTile,
        label: String,
    ) -> R<KernelCode> {
        let od = self.meta(v).dtype;
        let (end, base) = self.wide_row(&t);
        let lane = "lid.x".to_string();
        let m = self.body.var("f32", literal(f64::NEG_INFINITY, DType::F32));
        let saved = std::mem::take(&mut self.memo);
        let x = self.wide_pass(input, &end, &base)?;
        self.body.stmt(format!("{m} = max({m}, {x});"));
        self.body.stmt("}".into());
        self.memo.clear();
        let mx = self.row_reduce(&t, &lane, &[&m], true)?.remove(0);
        let sum = self.body.var("f32", "0.0".into());
        let x = self.wide_pass(input, &end, &base)?;
        self.body.stmt(format!("{sum} = {sum} + exp({x} - {mx});"));
        self.body.stmt("}".into());
        self.memo.clear();
        let total = self.row_reduce(&t, &lane, &[&sum], false)?.remove(0);
        let x = self.wide_pass(input, &end, &base)?;
        let y = if log {
            format!("{x} - {mx} - log({total})")
        } else {
            format!("exp({x} - {mx}) / {total}")
        };
        let y = self.body.bind("f32", y);
        let at = self.body.bind("u32", format!("{base} + k"));
        self.store_to(v, &at, &cast(&y, DType::F32, od))?;
        self.body.stmt("}".into());
        self.memo = saved;
        Ok(self.finish(label, wgsl::fold(t.rows), [64, 1, 1]))
    }

    /// Layer norm over rows wider than 1024: a row per workgroup of 64,
    /// the corrected two-pass statistics and the write in coalesced passes.
    #[allow(clippy::too_many_arguments)]
    fn layer_norm_wide(
        &mut self,
        input: ValueId,
        v: ValueId,
        weight: Option<ValueId>,
        bias: Option<ValueId>,
        eps: f64,
        t: RowTile,
        label: String,
    ) -> R<KernelCode> {
        let od = self.meta(v).dtype;
        let w = u(t.width);
        let (end, base) = self.wide_row(&t);
        let lane = "lid.x".to_string();
        let saved = std::mem::take(&mut self.memo);
        let sum = self.body.var("f32", "0.0".into());
        let x = self.wide_pass(input, &end, &base)?;
        self.body.stmt(format!("{sum} = {sum} + {x};"));
        self.body.stmt("}".into());
        self.memo.clear();
        let total = self.row_reduce(&t, &lane, &[&sum], false)?.remove(0);
        let mean0 = self.body.bind("f32", format!("{total} / f32({w})"));
        let (dev, sq) = (
            self.body.var("f32", "0.0".into()),
            self.body.var("f32", "0.0".into()),
        );
        let x = self.wide_pass(input, &end, &base)?;
        let d = self.body.bind("f32", format!("{x} - {mean0}"));
        self.body.stmt(format!("{dev} = {dev} + {d};"));
        self.body.stmt(format!("{sq} = {sq} + {d} * {d};"));
        self.body.stmt("}".into());
        self.memo.clear();
        let [dev, sq] = &self.row_reduce(&t, &lane, &[&dev, &sq], false)?[..] else {
            return Err(bug("row reduction"));
        };
        let (dev, sq) = (dev.clone(), sq.clone());
        let (mean, rstd) = self.norm_stats(&mean0, &dev, &sq, t.width, eps);
        let x = self.wide_pass(input, &end, &base)?;
        let y = self.norm_affine(&x, &mean, &rstd, weight, bias, "k")?;
        let at = self.body.bind("u32", format!("{base} + k"));
        self.store_to(v, &at, &cast(&y, DType::F32, od))?;
        self.body.stmt("}".into());
        self.memo = saved;
        Ok(self.finish(label, wgsl::fold(t.rows), [64, 1, 1]))
    }

    /// Layer norm over contiguous rows, a row per `lanes` invocations: the
    /// row read once into registers, the corrected two-pass mean and
    /// variance reduced across the lanes, one write.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn layer_norm_rows(
        &mut self,
        input: ValueId,
        v: ValueId,
        weight: Option<ValueId>,
        bias: Option<ValueId>,
        eps: f64,
        t: RowTile,
        label: String,
    ) -> R<KernelCode> {
        let od = self.meta(v).dtype;
        let RowCtx { lane, xs, .. } = self.row_elements(input, &t)?;
        let w = u(t.width);
        let mut sum = "0.0".to_string();
        for (x, inr, _, _) in &xs {
            sum = self
                .body
                .bind("f32", format!("{sum} + select(0.0, {x}, {inr})"));
        }
        let total = self.row_reduce(&t, &lane, &[&sum], false)?.remove(0);
        let mean0 = self.body.bind("f32", format!("{total} / f32({w})"));
        // The corrected two-pass algorithm: the deviations' sum refines the
        // mean (exact for constant rows), their squares give the variance.
        let (mut dev, mut sq) = ("0.0".to_string(), "0.0".to_string());
        for (x, inr, _, _) in &xs {
            let d = self
                .body
                .bind("f32", format!("select(0.0, {x} - {mean0}, {inr})"));
            dev = self.body.bind("f32", format!("{dev} + {d}"));
            sq = self.body.bind("f32", format!("{sq} + {d} * {d}"));
        }
        let [dev, sq] = &self.row_reduce(&t, &lane, &[&dev, &sq], false)?[..] else {
            return Err(bug("row reduction"));
        };
        let (dev, sq) = (dev.clone(), sq.clone());
        let (mean, rstd) = self.norm_stats(&mean0, &dev, &sq, t.width, eps);
        for (x, inr, k, at) in &xs {
            self.body.stmt(format!("if ({inr}) {{"));
            let saved = std::mem::take(&mut self.memo);
            let y = self.norm_affine(x, &mean, &rstd, weight, bias, k)?;
            self.store_to(v, at, &cast(&y, DType::F32, od))?;
            self.memo = saved;
            self.body.stmt("}".into());
        }
        Ok(self.finish(label, wgsl::fold(t.workgroups()), [64, 1, 1]))
    }
}

/// The identity of `max` (`min` when `high`) in a dtype.
pub(super) fn extreme_literal(d: DType, high: bool) -> String {
    match (d, high) {
        (DType::F32 | DType::F16, false) => literal(f64::NEG_INFINITY, d),
        (DType::F32 | DType::F16, true) => literal(f64::INFINITY, d),
        (DType::I32 | DType::I64, false) => "(-2147483647i - 1i)".into(),
        (DType::I32 | DType::I64, true) => "2147483647i".into(),
        (DType::I8, false) => "-128i".into(),
        (DType::I8, true) => "127i".into(),
        (DType::U32, false) => "0u".into(),
        (DType::U32, true) => "4294967295u".into(),
        (DType::Bool, high) => high.to_string(),
    }
}
