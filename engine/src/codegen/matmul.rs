//! Matrix products: every matrix op lowered onto a batched `C = A B`
//! with fused operand loads and epilogues; tiles through workgroup memory
//! or a loop per invocation.

use super::reduction::{NORM_FIRST, NORM_STATS};
use super::template::{self, Env};
use super::*;

/// Output rows each invocation of a tiled product computes: 4, or 1 when
/// the product has at most 16 rows.
pub(super) fn matmul_rows_per_invocation(rows: usize) -> usize {
    if rows <= 16 {
        1
    } else {
        4
    }
}

/// Products of at most this many rows (batch-1 inference) run as
/// `skinny_product` on GPUs.
pub(super) const SKINNY_ROWS: usize = 16;
/// Columns of a skinny product's workgroup, and lanes splitting K per
/// column (workgroup size [LANES, COLS, 1]).
const SKINNY_COLS: usize = 8;
const SKINNY_LANES: usize = 32;

/// A block of `BLOCK` x `BLOCK` results per invocation where a CPU
/// adapter runs products without workgroup tiles and both operands are
/// f32 rows along K. A software rasterizer gathers every load lane by
/// lane, so what pays is multiply-adds per element loaded (BLOCK / 2):
/// on lavapipe, 512x384x1536 in 157 ms against 544 ms with 4x4 blocks
/// (8x8: 308 ms; 32x16: 128 ms, with five times the shader compile).
const BLOCK: usize = 16;
/// Invocations along each side of a `BLOCK` workgroup: 64, so that even
/// small products spread over several workgroups (CPU threads).
const BLOCK_WG: usize = 8;

/// Word `i` (a multiple of 4) of vec4-bound slot `s`, as four f32.
pub(super) fn vec4_at(s: &Slot, i: &str) -> String {
    format!("bitcast<vec4<f32>>({}[({}u + {i}) >> 2u])", s.var, s.base)
}

/// The operands of a vec4-tiled product and how each tile is read: A
/// (`sa`) and B (`sb`) along k from vec4 bindings, or B row-major along
/// its columns (`b_cols`); element loads where the slot is `None`.
struct Quads<'o> {
    a: &'o Operand,
    b: &'o Operand,
    sa: Option<Slot>,
    sb: Option<Slot>,
    b_cols: Option<Slot>,
    nn: usize,
    kk: usize,
    mm: usize,
}

/// The names the tiled product templates share: `o$i` = 16 i (the
/// invocation's rows and columns are 16 apart; up to 8 rows), `comp$i`
/// the vector components.
fn tile_env() -> Env {
    let mut env = Env::default();
    for i in 0..8 {
        env = env.n(&format!("o{i}"), 16 * i);
    }
    for (i, c) in ["x", "y", "z", "w"].iter().enumerate() {
        env = env.s(&format!("comp{i}"), *c);
    }
    env
}

/// A tiled template's accumulators `c$i$j` (a twin's: `d$i$j`), row-major
/// over `rows` x `cols`.
fn accumulators(env: &Env, rows: usize, cols: usize, name: &str) -> R<Vec<String>> {
    (0..rows)
        .flat_map(|i| (0..cols).map(move |j| format!("{name}{i}{j}")))
        .map(|c| env.get(&c))
        .collect()
}

/// A matrix product operand: value, batch strides over the output batch,
/// row stride, column stride.
pub(super) struct Operand {
    pub(super) v: ValueId,
    pub(super) batch: Vec<usize>,
    pub(super) rs: usize,
    pub(super) cs: usize,
}

/// A matrix op as a batched `C = A B` over `batch`: `nn` x `mm` outputs,
/// `kk` contracted, plus an addend `(c, beta, alpha)`: `alpha A B + beta c`
/// (addmm; `linear`'s bias with both 1).
pub(super) struct Product {
    pub(super) a: Operand,
    pub(super) b: Operand,
    pub(super) batch: Vec<usize>,
    pub(super) nn: usize,
    pub(super) kk: usize,
    pub(super) mm: usize,
    pub(super) extra: Option<(ValueId, f64, f64)>,
}

impl Gen<'_> {
    /// Node `n` (any matrix op) as a batched product.
    pub(super) fn product(&self, n: NodeId) -> R<Product> {
        let g = self.g;
        let node = &g.nodes[n];
        let form = node
            .op
            .def()
            .lowering
            .product()
            .ok_or_else(|| bug(format!("{} is no matrix product", node.op.name())))?;
        let t = |i: usize| *node.args[i].tensors()[0];
        let (a, b, batch, nn, kk, mm, extra) = match form {
            f if f.linear => {
                let (x, w) = (t(0), t(1));
                let (xm, wm) = (g.meta(x), g.meta(w));
                let k = *wm.sizes.last().unwrap();
                let rows = xm.numel() / k.max(1);
                let outf = if wm.dim() == 2 { wm.sizes[0] } else { 1 };
                let bias = form
                    .addend
                    .and_then(|i| node.args.get(i))
                    .and_then(|a| a.tensors().first().map(|x| **x));
                (
                    Operand {
                        v: x,
                        batch: vec![],
                        rs: k,
                        cs: 1,
                    },
                    Operand {
                        v: w,
                        batch: vec![],
                        rs: 1,
                        cs: k,
                    },
                    vec![],
                    rows,
                    k,
                    outf,
                    bias.map(|b| (b, 1.0, 1.0)),
                )
            }
            _ => {
                let (x, y) = (t(form.left), t(form.right));
                let (xm, ym) = (g.meta(x).clone(), g.meta(y).clone());
                let (xb, n_, k_) = if xm.dim() == 1 {
                    (vec![], 1, xm.sizes[0])
                } else {
                    (
                        xm.sizes[..xm.dim() - 2].to_vec(),
                        xm.sizes[xm.dim() - 2],
                        xm.sizes[xm.dim() - 1],
                    )
                };
                let (yb, m_) = if ym.dim() == 1 {
                    (vec![], 1)
                } else {
                    (ym.sizes[..ym.dim() - 2].to_vec(), ym.sizes[ym.dim() - 1])
                };
                let batch = kiln_functionalize::meta::broadcast_shapes(&xb, &yb)
                    .map_err(bug)?
                    .into_vec();
                // Strides of an operand's own batch dims over the output batch
                // (0 where it broadcasts).
                let bstr = |own: &[usize], rows: usize, cols: usize| -> Vec<usize> {
                    let mut full = own.to_vec();
                    full.extend([rows, cols]);
                    let st = contiguous_strides(&full);
                    (0..batch.len())
                        .map(|i| {
                            let lead = batch.len() - own.len();
                            if i < lead || own[i - lead] != batch[i] || own[i - lead] == 1 {
                                0
                            } else {
                                st[i - lead]
                            }
                        })
                        .collect()
                };
                let xa = Operand {
                    v: x,
                    batch: bstr(&xb, n_, k_),
                    rs: if xm.dim() == 1 { 0 } else { k_ },
                    cs: 1,
                };
                let yo = Operand {
                    v: y,
                    batch: bstr(&yb, k_, m_),
                    rs: if ym.dim() == 1 { 1 } else { m_ },
                    cs: if ym.dim() == 1 { 0 } else { 1 },
                };
                // `beta` and `alpha` follow the product's operands.
                let extra = form.addend.map(|c| {
                    let number = |i: usize| match node.args.get(i) {
                        Some(Arg::Int(x)) => Some(*x as f64),
                        Some(Arg::Float(x)) => Some(*x),
                        _ => None,
                    };
                    let after = form.right + 1;
                    (
                        t(c),
                        number(after).unwrap_or(1.0),
                        number(after + 1).unwrap_or(1.0),
                    )
                });
                (xa, yo, batch, n_, k_, m_, extra)
            }
        };
        Ok(Product {
            a,
            b,
            batch,
            nn,
            kk,
            mm,
            extra,
        })
    }

    /// The kernel of product node `n`: tiles of 64x64 through workgroup
    /// memory, or 4x4 blocks per invocation (`tile_min_rows`).
    pub(super) fn matmul(&mut self, n: NodeId, label: String) -> R<KernelCode> {
        let g = self.g;
        let node = &g.nodes[n];
        let name = node.op.name();
        let v = node.results[0];
        let om = g.meta(v).clone();
        let Product {
            a,
            b,
            batch,
            nn,
            kk,
            mm,
            extra,
        } = self.product(n)?;
        // A twin product (`Schedule::twins`): same A and shapes, its own B
        // and addend, accumulated alongside.
        let twin = match self.s.twins.get(&n) {
            Some(&n1) => Some((g.nodes[n1].results[0], self.product(n1)?)),
            None => None,
        };
        let b1 = twin.as_ref().map(|(_, p)| &p.b);
        // A norm computed here: its rows' statistics first (`norm_rows_first`).
        let norm = self.s.norm_operands.contains(&a.v).then_some(a.v);
        let start = self.body.lines.len();
        self.norm_rows = norm;
        let acc_dt = if om.dtype.is_float() {
            DType::F32
        } else {
            om.dtype
        };
        let at = ty(acc_dt);
        let nb = numel(&batch).max(1);
        let tiled = nn >= self.tile_min_rows;
        let mut blocks = false;
        let skinny = tiled && (1..=SKINNY_ROWS).contains(&nn) && mm > 0;
        // Rows of a workgroup's tile (the loop variant: 64).
        let mut tile_rows = 64;
        // Invocations across a workgroup (wide blocks: 8).
        let mut tile_width = 16;
        let (acc, acc1) = if skinny {
            let sums = self.skinny_product(
                &a,
                &[&b].into_iter().chain(b1).collect::<Vec<_>>(),
                &batch,
                nn,
                kk,
                mm,
                acc_dt,
            )?;
            let mut sums = sums.into_iter();
            let acc = sums
                .next()
                .ok_or_else(|| bug("a skinny product without its sum"))?;
            (acc, sums.next())
        } else if tiled {
            let (acc, acc1, rows, wx) =
                self.tiled_product(&a, &b, b1, &batch, nn, kk, mm, acc_dt)?;
            tile_rows = rows;
            tile_width = wx;
            (acc, acc1)
        } else if b1.is_none() && self.blocks_ok(&a, &b, kk, mm, acc_dt, om.dtype)? {
            blocks = true;
            tile_rows = BLOCK * BLOCK_WG;
            tile_width = BLOCK_WG as u32;
            (self.big_blocks(&a, &b, &batch, nn, kk, mm, at)?, None)
        } else {
            // Each invocation computes a 4x4 block: 16 multiply-adds per 8
            // loads, no workgroup memory, no barriers. Its four columns
            // start at a multiple of 4: whole packed words where rows are.
            self.stores_runs(v, mm);
            self.body
                .stmt("let r0 = (wid.y * 16u + lid.y) * 4u;".into());
            self.body
                .stmt("let c0 = (wid.x * 16u + lid.x) * 4u;".into());
            self.body.stmt("let bz = wid.z;".into());
            self.body.stmt(format!(
                "if (r0 >= {} || c0 >= {}) {{ return; }}",
                u(nn),
                u(mm)
            ));
            let bm = self.unravel("bz", &batch);
            let aoff = self.ravel(&bm, &a.batch, 0);
            // The twin's block in `accs2`, from a second pass over A.
            for (x, accs) in [(Some(&b), "accs"), (b1, "accs2")] {
                let Some(x) = x else { continue };
                let xoff = self.ravel(&bm, &x.batch, 0);
                self.body.stmt(format!("var {accs}: array<{at}, 16>;"));
                if !self.vec4_blocks(&a, x, &aoff, &xoff, nn, kk, mm, acc_dt, accs)? {
                    self.scalar_blocks(&a, x, &aoff, &xoff, nn, kk, mm, acc_dt, accs)?;
                }
            }
            self.body
                .stmt("for (var ij = 0u; ij < 16u; ij = ij + 1u) {".into());
            self.body.stmt("let row = r0 + ij / 4u;".into());
            self.body.stmt("let col = c0 + ij % 4u;".into());
            self.body.stmt(format!(
                "if (row >= {} || col >= {}) {{ continue; }}",
                u(nn),
                u(mm)
            ));
            let acc1 = b1.map(|_| self.body.bind(at, "accs2[ij]".into()));
            (self.body.bind(at, "accs[ij]".into()), acc1)
        };
        let saved_epilogue = std::mem::take(&mut self.memo);
        let oi = self.body.bind(
            "u32",
            format!("bz * {} + row * {} + col", u(nn * mm), u(mm)),
        );
        if let (Some((x, p1)), Some(acc1)) = (&twin, &acc1) {
            // The epilogue reads the twin's result here, from registers.
            let res1 = self.with_addend(acc1, p1.extra, &batch, nn, mm, &oi, acc_dt)?;
            let res1 = self.body.bind(ty(om.dtype), cast(&res1, acc_dt, om.dtype));
            self.memo.insert((*x, oi.clone()), res1);
        } else if twin.is_some() {
            return Err(bug("a twin product without its accumulator"));
        }
        let res = self.with_addend(&acc, extra, &batch, nn, mm, &oi, acc_dt)?;
        let res = cast(&res, acc_dt, om.dtype);
        self.store_to(v, &oi, &res)?;
        self.memo = saved_epilogue;
        // Both variants end in a loop over the invocation's outputs; a
        // workgroup covers 64 columns and `tile_rows` rows.
        self.body.stmt("}".into());
        let (grid, wg) = if skinny {
            (
                [mm.div_ceil(SKINNY_COLS) as u32, 1, nb as u32],
                [SKINNY_LANES as u32, SKINNY_COLS as u32, 1],
            )
        } else {
            let (cols, high) = if blocks {
                (BLOCK * BLOCK_WG, BLOCK_WG as u32)
            } else {
                (64, 16)
            };
            (
                [
                    mm.div_ceil(cols) as u32,
                    nn.div_ceil(tile_rows) as u32,
                    nb as u32,
                ],
                [tile_width, high, 1],
            )
        };
        if grid.iter().any(|&x| x > 65535) {
            return Err(CompileError::no_kernel(format!(
                "{name} of {nb} batches of {nn}x{mm}: too many workgroups"
            )));
        }
        if let Some(x) = norm {
            // A workgroup's rows of A: its tile's, or all of a skinny one.
            let rows = if skinny { nn } else { tile_rows.min(nn) };
            let lidx = format!("lid.y * {} + lid.x", u(wg[0] as usize));
            let threads = (wg[0] * wg[1]) as usize;
            self.norm_rows_first(x, start, rows, nn, threads, &lidx)?;
            self.norm_rows = None;
        }
        Ok(self.finish(label, grid, wg))
    }

    /// `alpha acc + beta c` for a product's addend `(c, beta, alpha)` at
    /// output element `oi` (`acc` where there is none).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn with_addend(
        &mut self,
        acc: &str,
        extra: Option<(ValueId, f64, f64)>,
        batch: &[usize],
        nn: usize,
        mm: usize,
        oi: &str,
        acc_dt: DType,
    ) -> R<String> {
        let Some((c, beta, alpha)) = extra else {
            return Ok(acc.to_string());
        };
        let at = ty(acc_dt);
        let cm = self.g.meta(c).clone();
        // The addend broadcast to the whole (batched) result.
        let mut full = batch.to_vec();
        full.extend([nn, mm]);
        let ci = self.broadcast_index(oi, &full, &cm);
        let cv = self.value_at(c, &ci)?;
        let cv = cast(&cv, cm.dtype, acc_dt);
        Ok(if beta == 0.0 {
            self.body
                .bind(at, format!("{} * {acc}", literal(alpha, acc_dt)))
        } else {
            self.body.bind(
                at,
                format!(
                    "{} * {acc} + {} * {cv}",
                    literal(alpha, acc_dt),
                    literal(beta, acc_dt)
                ),
            )
        })
    }

    /// Whether operand `x` (f32) can be read as vectors of four along
    /// `inner` (stride 1) with `outer` and batch strides multiples of 4;
    /// its vec4-bound slot then.
    pub(super) fn vec4_operand(
        &mut self,
        x: &Operand,
        outer: usize,
        inner: usize,
        extent: usize,
    ) -> R<Option<Slot>> {
        let quad = |v: usize| v.is_multiple_of(4);
        if !self.vectorize
            || inner != 1
            || !quad(outer)
            || !quad(extent)
            || extent == 0
            || !x.batch.iter().all(|&b| quad(b))
        {
            return Ok(None);
        }
        self.vec4_slot_of(x.v)
    }

    /// A's tile (`bm` rows x 16 k) by vec4 loads along k: one vector an
    /// invocation for 64-row tiles. `false` (nothing generated) when A is
    /// not laid out for it.
    fn vec4_tile_a(
        &mut self,
        a: &Operand,
        aoff: &str,
        bm: usize,
        nn: usize,
        kk: usize,
        acc_dt: DType,
    ) -> R<bool> {
        if acc_dt != DType::F32 || nn == 0 || kk == 0 {
            return Ok(false);
        }
        let Some(sa) = self.vec4_operand(a, a.rs, a.cs, kk)? else {
            return Ok(false);
        };
        let sa_pad = bm + 1;
        let n = bm * 4;
        self.body.stmt(format!(
            "for (var e = lid.y * 16u + lid.x; e < {}; e = e + 256u) {{",
            u(n)
        ));
        self.body.stmt("let r = e / 4u;".into());
        self.body.stmt("let kq = (e % 4u) * 4u;".into());
        self.body.stmt(format!("let row = wid.y * {} + r;", u(bm)));
        self.body.stmt("let ka = t0 + kq;".into());
        self.body
            .stmt(format!("let ok = row < {} && ka < {};", u(nn), u(kk)));
        self.body.stmt(format!(
            "let x = select(vec4<f32>(0.0), bitcast<vec4<f32>>({}[({}u + {aoff} + min(row, {}) * {} + min(ka, {})) >> 2u]), ok);",
            sa.var,
            sa.base,
            u(nn - 1),
            u(a.rs),
            u(kk - 4)
        ));
        for (j, c) in ["x", "y", "z", "w"].iter().enumerate() {
            self.body
                .stmt(format!("ta[(kq + {j}u) * {} + r] = x.{c};", u(sa_pad)));
        }
        self.body.stmt("}".into());
        Ok(true)
    }

    /// B's tile (16 k x 64 columns) by vec4 loads, along k (`linear`'s
    /// weight) or along columns: one vector an invocation.
    fn vec4_tile_b(
        &mut self,
        b: &Operand,
        boff: &str,
        kk: usize,
        mm: usize,
        acc_dt: DType,
        tile: &str,
    ) -> R<bool> {
        if acc_dt != DType::F32 || mm == 0 || kk == 0 {
            return Ok(false);
        }
        let along_k = b.rs == 1;
        let slot = if along_k {
            self.vec4_operand(b, b.cs, b.rs, kk)?
        } else {
            self.vec4_operand(b, b.rs, b.cs, mm)?
        };
        let Some(sb) = slot else {
            return Ok(false);
        };
        self.body.stmt("{".into());
        self.body.stmt("let e = lid.y * 16u + lid.x;".into());
        // The vector this invocation loads: its first k (`k0`) and column
        // (`c`) within the tile, the last valid first element along the
        // vector's dimension, and where lane `j` goes in `tb`.
        let (k0, c, last_k, last_col, lane) = if along_k {
            (
                "(e % 4u) * 4u",
                "e / 4u",
                kk - 4,
                mm - 1,
                "(k0 + {j}u) * 65u + c",
            )
        } else {
            (
                "e / 16u",
                "(e % 16u) * 4u",
                kk - 1,
                mm - 4,
                "k0 * 65u + c + {j}u",
            )
        };
        self.body.stmt(format!("let k0 = {k0};"));
        self.body.stmt(format!("let c = {c};"));
        self.body.stmt("let col = wid.x * 64u + c;".into());
        self.body.stmt("let kb = t0 + k0;".into());
        self.body
            .stmt(format!("let ok = col < {} && kb < {};", u(mm), u(kk)));
        self.body.stmt(format!(
            "let x = select(vec4<f32>(0.0), bitcast<vec4<f32>>({}[({}u + {boff} + min(kb, {}) * {} + min(col, {}) * {}) >> 2u]), ok);",
            sb.var,
            sb.base,
            u(last_k),
            u(b.rs),
            u(last_col),
            u(b.cs)
        ));
        for (j, comp) in ["x", "y", "z", "w"].iter().enumerate() {
            let at = lane.replace("{j}", &j.to_string());
            self.body.stmt(format!("{tile}[{at}] = x.{comp};"));
        }
        self.body.stmt("}".into());
        Ok(true)
    }

    /// The 4x4 block of invocation (`r0`, `c0`) into `accs`, one k at a
    /// time, operands through `value_at` (any layout, inlined producers).
    #[allow(clippy::too_many_arguments)]
    fn scalar_blocks(
        &mut self,
        a: &Operand,
        b: &Operand,
        aoff: &str,
        boff: &str,
        nn: usize,
        kk: usize,
        mm: usize,
        acc_dt: DType,
        accs: &str,
    ) -> R<()> {
        let g = self.g;
        let at = ty(acc_dt);
        self.body.stmt("{".into());
        self.body.stmt(format!("var av: array<{at}, 4>;"));
        self.body.stmt(format!("var bv: array<{at}, 4>;"));
        self.body
            .stmt(format!("for (var q = 0u; q < {}; q = q + 1u) {{", u(kk)));
        self.body
            .stmt("for (var i = 0u; i < 4u; i = i + 1u) {".into());
        let saved = std::mem::take(&mut self.memo);
        let ia = self.body.bind(
            "u32",
            format!(
                "{aoff} + min(r0 + i, {}) * {} + q * {}",
                u(nn - 1),
                u(a.rs),
                u(a.cs)
            ),
        );
        let xa = self.value_at(a.v, &ia)?;
        let xa = cast(&xa, g.meta(a.v).dtype, acc_dt);
        self.body.stmt(format!("av[i] = {xa};"));
        self.memo.clear();
        let ib = self.body.bind(
            "u32",
            format!(
                "{boff} + q * {} + min(c0 + i, {}) * {}",
                u(b.rs),
                u(mm - 1),
                u(b.cs)
            ),
        );
        let xb = self.value_at(b.v, &ib)?;
        let xb = cast(&xb, g.meta(b.v).dtype, acc_dt);
        self.body.stmt(format!("bv[i] = {xb};"));
        self.body.stmt("}".into());
        self.memo = saved;
        self.body.stmt(format!(
            "for (var i = 0u; i < 4u; i = i + 1u) {{ for (var j = 0u; j < 4u; j = j + 1u) {{ {accs}[i * 4u + j] = {accs}[i * 4u + j] + av[i] * bv[j]; }} }}"
        ));
        self.body.stmt("}".into());
        self.body.stmt("}".into());
        Ok(())
    }

    /// Can `big_blocks` compute this product: f32 results from f32
    /// operands bound as vectors, A's rows along K in runs of four, B
    /// along K too (`linear`'s weight) or along its columns (then a
    /// multiple of four of them)?
    fn blocks_ok(
        &mut self,
        a: &Operand,
        b: &Operand,
        kk: usize,
        mm: usize,
        acc_dt: DType,
        out: DType,
    ) -> R<bool> {
        let quad = |x: usize| x.is_multiple_of(4);
        let b_along_k = b.rs == 1 && quad(b.cs);
        let b_along_cols = b.cs == 1 && quad(b.rs) && quad(mm);
        Ok(acc_dt == DType::F32
            && out == DType::F32
            && self.vectorize
            && kk > 0
            && quad(kk)
            && a.cs == 1
            && quad(a.rs)
            && a.batch.iter().all(|&x| quad(x))
            && (b_along_k || b_along_cols)
            && b.batch.iter().all(|&x| quad(x))
            && self.block_slot_of_a(a)?.is_some()
            && self.vec4_slot_of(b.v)?.is_some())
    }

    /// A `BLOCK` x `BLOCK` block of the product per invocation
    /// (`blocks_ok`), its sums in registers through the loop over K,
    /// then the loop over its results the epilogue runs in (`row`, `col`;
    /// the returned accumulator). Rows and columns past the end are
    /// clamped in the loop and skipped there.
    #[allow(clippy::too_many_arguments)]
    fn big_blocks(
        &mut self,
        a: &Operand,
        b: &Operand,
        batch: &[usize],
        nn: usize,
        kk: usize,
        mm: usize,
        at: &str,
    ) -> R<String> {
        let (Some(sa), Some(sb)) = (self.block_slot_of_a(a)?, self.vec4_slot_of(b.v)?) else {
            return Err(bug("a blocked product without vector operands"));
        };
        let (side, wg) = (u(BLOCK), u(BLOCK_WG));
        self.body
            .stmt(format!("let r0 = (wid.y * {wg} + lid.y) * {side};"));
        self.body
            .stmt(format!("let c0 = (wid.x * {wg} + lid.x) * {side};"));
        self.body.stmt("let bz = wid.z;".into());
        self.body.stmt(format!(
            "if (r0 >= {} || c0 >= {}) {{ return; }}",
            u(nn),
            u(mm)
        ));
        let bm = self.unravel("bz", batch);
        let aoff = self.ravel(&bm, &a.batch, 0);
        let boff = self.ravel(&bm, &b.batch, 0);
        self.block_norm_stats(a, nn);
        // Named sums, not an array: the loop indexes them by constants
        // only, and the epilogue's loop reads the array after it.
        if b.cs == 1 && b.rs != 1 {
            return self.big_blocks_by_columns(&sa, &sb, a, b, &aoff, &boff, nn, kk, mm, at);
        }
        for k in 0..BLOCK * BLOCK {
            self.body.stmt(format!("var s{k} = {at}(0);"));
        }
        self.body
            .stmt(format!("for (var q = 0u; q < {}; q = q + 4u) {{", u(kk)));
        self.block_rows_of_a(&sa, a, &aoff, nn)?;
        for j in 0..BLOCK {
            let col = format!("min(c0 + {j}u, {})", u(mm - 1));
            let at_b = format!("{boff} + {col} * {} + q", u(b.cs));
            self.body
                .stmt(format!("let qb{j} = {};", vec4_at(&sb, &at_b)));
        }
        for i in 0..BLOCK {
            for j in 0..BLOCK {
                let k = i * BLOCK + j;
                self.body.stmt(format!("s{k} = s{k} + dot(qa{i}, qb{j});"));
            }
        }
        self.body.stmt("}".into());
        self.body
            .stmt(format!("var accs: array<{at}, {}>;", BLOCK * BLOCK));
        for k in 0..BLOCK * BLOCK {
            self.body.stmt(format!("accs[{k}] = s{k};"));
        }
        Ok(self.block_results(nn, mm, at))
    }

    /// `qa0`.. : four k of each row of the block from A (a norm operand
    /// normalized from its input's, `Schedule::norm_operands`).
    fn block_rows_of_a(&mut self, sa: &Slot, a: &Operand, aoff: &str, nn: usize) -> R<()> {
        let affine = match self.norm_rows == Some(a.v) {
            true => Some(self.norm_quads(a.v)?),
            false => None,
        };
        for i in 0..BLOCK {
            let row = format!("min(r0 + {i}u, {})", u(nn - 1));
            let at_a = format!("{aoff} + {row} * {} + q", u(a.rs));
            let x = vec4_at(sa, &at_a);
            let x = match &affine {
                Some((Some(wq), Some(bq))) => {
                    format!("fma(({x} - vec4<f32>(st{i}.x)) * st{i}.y, {wq}, {bq})")
                }
                Some((wq, bq)) => {
                    let wq = wq.as_ref().map_or(String::new(), |w| format!(" * {w}"));
                    let bq = bq.as_ref().map_or(String::new(), |b| format!(" + {b}"));
                    format!("(({x} - vec4<f32>(st{i}.x)) * st{i}.y){wq}{bq}")
                }
                None => x,
            };
            self.body.stmt(format!("let qa{i} = {x};"));
        }
        Ok(())
    }

    /// The vector slot A's blocks load: A's, or a norm operand's input's.
    fn block_slot_of_a(&mut self, a: &Operand) -> R<Option<Slot>> {
        match self.norm_rows == Some(a.v) {
            true => {
                let input = self.norm_node_args(a.v)?.0;
                self.vec4_slot_of(input)
            }
            false => self.vec4_slot_of(a.v),
        }
    }

    /// `st0`..: the statistics of a block's rows of norm operand A, loaded
    /// once before the loop over K.
    fn block_norm_stats(&mut self, a: &Operand, nn: usize) {
        if self.norm_rows == Some(a.v) {
            for i in 0..BLOCK {
                self.body.stmt(format!(
                    "let st{i} = {NORM_STATS}[min(r0 + {i}u, {}) - {NORM_FIRST}];",
                    u(nn - 1)
                ));
            }
        }
    }

    /// The weight and bias of norm operand `v` at columns `q..q + 4` as
    /// vectors (`None` where it has none).
    #[allow(clippy::type_complexity)]
    fn norm_quads(&mut self, v: ValueId) -> R<(Option<String>, Option<String>)> {
        let (_, _, weight, bias, _) = self.norm_node_args(v)?;
        let saved = std::mem::take(&mut self.memo);
        let mut out = vec![];
        for t in [weight, bias] {
            let Some(t) = t else {
                out.push(None);
                continue;
            };
            let dt = self.meta(t).dtype;
            let mut lanes = vec![];
            for j in 0..4 {
                let x = self.value_at(t, &format!("q + {j}u"))?;
                lanes.push(cast(&x, dt, DType::F32));
            }
            let q = self
                .body
                .bind("vec4<f32>", format!("vec4<f32>({})", lanes.join(", ")));
            out.push(Some(q));
        }
        self.memo = saved;
        Ok((out[0].clone(), out[1].clone()))
    }

    /// `big_blocks` where B is read along its columns: four of B's rows
    /// a step, each as `BLOCK / 4` vectors of four columns, summed into
    /// vectors of four results.
    #[allow(clippy::too_many_arguments)]
    fn big_blocks_by_columns(
        &mut self,
        sa: &Slot,
        sb: &Slot,
        a: &Operand,
        b: &Operand,
        aoff: &str,
        boff: &str,
        nn: usize,
        kk: usize,
        mm: usize,
        at: &str,
    ) -> R<String> {
        let quads = BLOCK / 4;
        for i in 0..BLOCK {
            for j in 0..quads {
                self.body.stmt(format!("var s{i}_{j} = vec4<{at}>(0);"));
            }
        }
        self.body
            .stmt(format!("for (var q = 0u; q < {}; q = q + 4u) {{", u(kk)));
        self.block_rows_of_a(sa, a, aoff, nn)?;
        // Columns clamped by whole vectors: `mm` is a multiple of four.
        for j in 0..quads {
            let col = format!("min(c0 + {}u, {})", 4 * j, u(mm - 4));
            for kq in 0..4 {
                let at_b = format!("{boff} + (q + {kq}u) * {} + {col}", u(b.rs));
                self.body
                    .stmt(format!("let qb{kq}_{j} = {};", vec4_at(sb, &at_b)));
            }
        }
        for i in 0..BLOCK {
            for j in 0..quads {
                let sum = (0..4)
                    .map(|kq| format!("qa{i}.{} * qb{kq}_{j}", ["x", "y", "z", "w"][kq]))
                    .collect::<Vec<_>>()
                    .join(" + ");
                self.body.stmt(format!("s{i}_{j} = s{i}_{j} + {sum};"));
            }
        }
        self.body.stmt("}".into());
        self.body
            .stmt(format!("var accs: array<{at}, {}>;", BLOCK * BLOCK));
        for i in 0..BLOCK {
            for j in 0..quads {
                for (t, c) in ["x", "y", "z", "w"].iter().enumerate() {
                    let k = i * BLOCK + 4 * j + t;
                    self.body.stmt(format!("accs[{k}] = s{i}_{j}.{c};"));
                }
            }
        }
        Ok(self.block_results(nn, mm, at))
    }

    /// The loop over a block's results the epilogue runs in.
    fn block_results(&mut self, nn: usize, mm: usize, at: &str) -> String {
        let side = u(BLOCK);
        self.body.stmt(format!(
            "for (var ij = 0u; ij < {}; ij = ij + 1u) {{",
            u(BLOCK * BLOCK)
        ));
        self.body.stmt(format!("let row = r0 + ij / {side};"));
        self.body.stmt(format!("let col = c0 + ij % {side};"));
        self.body.stmt(format!(
            "if (row >= {} || col >= {}) {{ continue; }}",
            u(nn),
            u(mm)
        ));
        self.body.bind(at, "accs[ij]".into())
    }

    /// The 4x4 block of invocation (`r0`, `c0`) into `accs`, four k at a
    /// time through `vec4` loads of buffers bound as vectors: A's rows
    /// along k, B along k (`linear`'s weight) or along its columns. CPU
    /// adapters execute invocations as SIMD lanes, where every load is a
    /// gather: a vector load brings four values for the price of one.
    /// `false` (nothing generated) unless both operands are f32 buffers
    /// laid out for it.
    #[allow(clippy::too_many_arguments)]
    fn vec4_blocks(
        &mut self,
        a: &Operand,
        b: &Operand,
        aoff: &str,
        boff: &str,
        nn: usize,
        kk: usize,
        mm: usize,
        acc_dt: DType,
        accs: &str,
    ) -> R<bool> {
        let quad = |x: usize| x.is_multiple_of(4);
        let a_ok = a.cs == 1 && quad(a.rs) && a.batch.iter().all(|&x| quad(x));
        let b_along_k = b.rs == 1 && quad(b.cs);
        let b_along_cols = b.cs == 1 && quad(b.rs) && quad(mm);
        if acc_dt != DType::F32
            || !self.vectorize
            || !quad(kk)
            || kk == 0
            || !a_ok
            || !(b_along_k || b_along_cols)
            || !b.batch.iter().all(|&x| quad(x))
        {
            return Ok(false);
        }
        let (Some(sa), Some(sb)) = (self.vec4_slot_of(a.v)?, self.vec4_slot_of(b.v)?) else {
            return Ok(false);
        };
        self.body
            .stmt(format!("for (var q = 0u; q < {}; q = q + 4u) {{", u(kk)));
        for i in 0..4 {
            let row = format!("min(r0 + {i}u, {})", u(nn - 1));
            self.body.stmt(format!(
                "let qa{i} = {};",
                vec4_at(&sa, &format!("{aoff} + {row} * {} + q", u(a.rs)))
            ));
        }
        if b_along_k {
            for j in 0..4 {
                let col = format!("min(c0 + {j}u, {})", u(mm - 1));
                self.body.stmt(format!(
                    "let qb{j} = {};",
                    vec4_at(&sb, &format!("{boff} + {col} * {} + q", u(b.cs)))
                ));
            }
            for i in 0..4 {
                for j in 0..4 {
                    let k = i * 4 + j;
                    self.body
                        .stmt(format!("{accs}[{k}] = {accs}[{k}] + dot(qa{i}, qb{j});"));
                }
            }
        } else {
            // c0 is a multiple of 4 below mm (a multiple of 4): the four
            // columns are one vector of each of B's rows q..q+3.
            for kq in 0..4 {
                self.body.stmt(format!(
                    "let qb{kq} = {};",
                    vec4_at(&sb, &format!("{boff} + (q + {kq}u) * {} + c0", u(b.rs)))
                ));
            }
            for i in 0..4 {
                let sum = (0..4)
                    .map(|kq| format!("qa{i}.{} * qb{kq}", ["x", "y", "z", "w"][kq]))
                    .collect::<Vec<_>>()
                    .join(" + ");
                self.body.stmt(format!("let qr{i} = {sum};"));
                for j in 0..4 {
                    let k = i * 4 + j;
                    self.body.stmt(format!(
                        "{accs}[{k}] = {accs}[{k}] + qr{i}.{};",
                        ["x", "y", "z", "w"][j]
                    ));
                }
            }
        }
        self.body.stmt("}".into());
        Ok(true)
    }

    /// Stores element `index` of `v` (zero where `pred` is false) at `slot`
    /// of workgroup tile `tile`.
    pub(super) fn load_tile(
        &mut self,
        tile: &str,
        slot: &str,
        v: ValueId,
        index: &str,
        pred: &str,
        acc_dt: DType,
    ) -> R<()> {
        let i = self
            .body
            .bind("u32", format!("select(0u, {index}, {pred})"));
        let x = self.value_at(v, &i)?;
        let x = cast(&x, self.meta(v).dtype, acc_dt);
        self.body.stmt(format!(
            "{tile}[{slot}] = select({}, {x}, {pred});",
            literal(0.0, acc_dt)
        ));
        Ok(())
    }

    /// The GPU product of at most `SKINNY_ROWS` rows: a workgroup per
    /// `SKINNY_COLS` columns, each column's K split over `SKINNY_LANES`
    /// invocations (consecutive k, so reads of `linear`'s weight rows and of
    /// A's rows coalesce; vec4 loads where both are laid out for them), each
    /// accumulating every row, then the lanes' partial sums added through
    /// workgroup memory. A 16-row tile instead walks K serially, one load
    /// and two barriers per 16 k: an H100 took 41 us for 1x384x1536 that
    /// way, whatever the width, against 0.8 us to read the weight once.
    /// Each of `bs` (a product and its twin) is accumulated from the same
    /// loads of A. Opens the epilogue loop (`row`, `col`, `bz` in scope) and
    /// returns the accumulator of each of `bs`.
    #[allow(clippy::too_many_arguments)]
    fn skinny_product(
        &mut self,
        a: &Operand,
        bs: &[&Operand],
        batch: &[usize],
        nn: usize,
        kk: usize,
        mm: usize,
        acc_dt: DType,
    ) -> R<Vec<String>> {
        let g = self.g;
        let at = ty(acc_dt);
        let zero = literal(0.0, acc_dt);
        let lanes = SKINNY_LANES;
        // Partial sums, [column][row][lane], each (column, row) run of
        // lanes rotated by its index so that the final sums (an invocation
        // per row, reading lane j of its run) hit distinct banks. At most
        // 8 x 16 x 32 words: WebGPU's 16 KiB of workgroup memory (a twin's
        // sums pass through it after the first's).
        self.shared.push(format!(
            "var<workgroup> red: array<{at}, {}>;",
            SKINNY_COLS * nn * lanes
        ));
        self.body.stmt("let bz = wid.z;".into());
        let bzm = self.unravel("bz", batch);
        let aoff = self.ravel(&bzm, &a.batch, 0);
        let boffs: Vec<String> = bs.iter().map(|b| self.ravel(&bzm, &b.batch, 0)).collect();
        self.body.stmt(format!(
            "let cl = min(wid.x * {}u + lid.y, {});",
            SKINNY_COLS,
            u(mm.max(1) - 1)
        ));
        let accs: Vec<Vec<String>> = bs
            .iter()
            .map(|_| (0..nn).map(|_| self.body.var(at, zero.clone())).collect())
            .collect();
        let f32_quads = acc_dt == DType::F32 && kk.is_multiple_of(4) && kk > 0 && nn > 0;
        let sa = if f32_quads && a.cs == 1 {
            self.vec4_operand(a, a.rs, a.cs, kk)?
        } else {
            None
        };
        let mut sbs = vec![];
        for b in bs {
            sbs.push(if f32_quads && b.rs == 1 {
                self.vec4_operand(b, b.cs, b.rs, kk)?
            } else {
                None
            });
        }
        if f32_quads && (sa.is_some() || sbs.iter().any(Option::is_some)) {
            // Four consecutive k an invocation, lanes 16 bytes apart.
            self.body.stmt(format!(
                "for (var k = lid.x * 4u; k < {}; k = k + {}u) {{",
                u(kk),
                4 * lanes
            ));
            let saved = std::mem::take(&mut self.memo);
            let quad =
                |gen: &mut Self, s: &Option<Slot>, x: &Operand, base: String, step: usize| {
                    if let Some(s) = s {
                        return Ok(vec4_at(s, &base));
                    }
                    let mut parts = vec![];
                    for j in 0..4 {
                        let i = gen.body.bind("u32", format!("{base} + {j}u * {}", u(step)));
                        let v = gen.value_at(x.v, &i)?;
                        parts.push(cast(&v, g.meta(x.v).dtype, acc_dt));
                    }
                    Ok::<String, CompileError>(format!("vec4<f32>({})", parts.join(", ")))
                };
            let mut bqs = vec![];
            for ((b, sb), boff) in bs.iter().zip(&sbs).zip(&boffs) {
                let bexpr = quad(
                    self,
                    sb,
                    b,
                    format!("{boff} + k * {} + cl * {}", u(b.rs), u(b.cs)),
                    b.rs,
                )?;
                bqs.push(self.body.bind("vec4<f32>", bexpr));
            }
            for r in 0..nn {
                let aexpr = quad(
                    self,
                    &sa,
                    a,
                    format!("{aoff} + {} + k * {}", u(r * a.rs), u(a.cs)),
                    a.cs,
                )?;
                let aq = self.body.bind("vec4<f32>", aexpr);
                for (acc, bq) in accs.iter().zip(&bqs) {
                    let acc = &acc[r];
                    self.body.stmt(format!("{acc} = {acc} + dot({aq}, {bq});"));
                }
            }
            self.memo = saved;
            self.body.stmt("}".into());
        } else {
            self.body.stmt(format!(
                "for (var k = lid.x; k < {}; k = k + {}u) {{",
                u(kk),
                lanes
            ));
            let saved = std::mem::take(&mut self.memo);
            let mut xbs = vec![];
            for (b, boff) in bs.iter().zip(&boffs) {
                let ib = self.body.bind(
                    "u32",
                    format!("{boff} + k * {} + cl * {}", u(b.rs), u(b.cs)),
                );
                let xb = self.value_at(b.v, &ib)?;
                xbs.push(self.body.bind(at, cast(&xb, g.meta(b.v).dtype, acc_dt)));
            }
            for r in 0..nn {
                let ia = self
                    .body
                    .bind("u32", format!("{aoff} + {} + k * {}", u(r * a.rs), u(a.cs)));
                let xa = self.value_at(a.v, &ia)?;
                let xa = self.body.bind(at, cast(&xa, g.meta(a.v).dtype, acc_dt));
                for (acc, xb) in accs.iter().zip(&xbs) {
                    let acc = &acc[r];
                    self.body.stmt(format!("{acc} = {acc} + {xa} * {xb};"));
                }
            }
            self.memo = saved;
            self.body.stmt("}".into());
        }
        let mut sums = vec![];
        for (i, accs) in accs.iter().enumerate() {
            if i > 0 {
                // The previous sums are read before `red` is written again.
                self.body.stmt("workgroupBarrier();".into());
            }
            for (r, acc) in accs.iter().enumerate() {
                self.body.stmt(format!(
                    "red[(lid.y * {nn}u + {r}u) * {lanes}u + (lid.x + {r}u) % {lanes}u] = {acc};",
                ));
            }
            self.body.stmt("workgroupBarrier();".into());
            // Invocation (lid.x = row, lid.y = column) adds its run of lanes.
            let sum = self.body.var(at, zero.clone());
            self.body.stmt(format!("if (lid.x < {}) {{", u(nn)));
            self.body
                .stmt(format!("let run{i} = (lid.y * {nn}u + lid.x) * {lanes}u;",));
            self.body.stmt(format!(
                "for (var j = 0u; j < {lanes}u; j = j + 1u) {{ {sum} = {sum} + red[run{i} + (j + lid.x) % {lanes}u]; }}",
            ));
            self.body.stmt("}".into());
            sums.push(sum);
        }
        self.body
            .stmt("for (var ij = 0u; ij < 1u; ij = ij + 1u) {".into());
        self.body.stmt("let row = lid.x;".into());
        self.body
            .stmt(format!("let col = wid.x * {}u + lid.y;", SKINNY_COLS));
        self.body.stmt(format!(
            "if (row >= {} || col >= {}) {{ continue; }}",
            u(nn),
            u(mm)
        ));
        Ok(sums)
    }

    /// `tiled_product` for f32 products of 64-row tiles whose A is read
    /// along k, in `vec4`s everywhere (`shaders/templates/matmul_vec4.wgsl`):
    /// each invocation loads one vector of each operand tile per K step
    /// (four consecutive k of A's row, and of B's column or, for a
    /// row-major B bound as vectors, four consecutive columns of B's row)
    /// straight from `vec4` bindings or assembled from four element loads
    /// (inlined producers: a head merge, a transpose). `None` (nothing
    /// generated) where it does not apply. A twin's B (`b1`, laid out as
    /// `b`) is loaded into a tile of its own and accumulated in `d$i$j`.
    #[allow(clippy::too_many_arguments)]
    fn tiled_vec4_product(
        &mut self,
        a: &Operand,
        b: &Operand,
        b1: Option<&Operand>,
        batch: &[usize],
        nn: usize,
        kk: usize,
        mm: usize,
        acc_dt: DType,
        tall: bool,
        wide: bool,
    ) -> R<Option<(String, Option<String>)>> {
        if acc_dt != DType::F32
            || matmul_rows_per_invocation(nn) != 4
            || a.cs != 1
            || kk == 0
            || mm == 0
        {
            return Ok(None);
        }
        // B row-major and bound as vectors along its columns (`mm`), else
        // read along k (vectors or elements).
        let b_cols = if b.cs == 1 && b.rs != 1 {
            match self.vec4_operand(b, b.rs, b.cs, mm)? {
                Some(sb) => Some(sb),
                None => return Ok(None),
            }
        } else {
            None
        };
        if b_cols.is_none() && b.rs != 1 {
            return Ok(None);
        }
        let sa = self.vec4_operand(a, a.rs, a.cs, kk)?;
        let sb = match &b_cols {
            Some(_) => None,
            None => self.vec4_operand(b, b.cs, b.rs, kk)?,
        };
        let mut twin = None;
        if let Some(b1) = b1 {
            let (sb1, b1_cols) = match &b_cols {
                Some(_) => match self.vec4_operand(b1, b1.rs, b1.cs, mm)? {
                    Some(s) => (None, Some(s)),
                    None => return Ok(None),
                },
                None => (self.vec4_operand(b1, b1.cs, b1.rs, kk)?, None),
            };
            twin = Some(Quads {
                a,
                b: b1,
                sa: None,
                sb: sb1,
                b_cols: b1_cols,
                nn,
                kk,
                mm,
            });
        }
        let quads = Quads {
            a,
            b,
            sa,
            sb,
            b_cols,
            nn,
            kk,
            mm,
        };
        // Wide (tall tiles only, so never a twin): 8 columns an invocation,
        // 8 invocations across the tile.
        let (tn, wx) = if wide { (8, 8) } else { (4, 16) };
        let col = match (quads.b_cols.is_some(), wide) {
            (true, false) => "lid.x * 4u + ij % 4u",
            (true, true) => "lid.x * 4u + ij % 4u + 32u * ((ij % 8u) / 4u)",
            (false, false) => "lid.x + 16u * (ij % 4u)",
            (false, true) => "lid.x + 8u * (ij % 8u)",
        };
        let tm = if tall { 8 } else { 4 };
        // Vectors of A (B) each invocation loads a step: the tile's
        // 16 tm rows x 4 vectors (64 columns x 4) over its invocations.
        let (ra, rb) = (tm * 64 / (wx * 16), 256 / (wx * 16));
        let mut env = tile_env()
            .b("b_cols", quads.b_cols.is_some())
            .b("dual", twin.is_some())
            .b("tall", tall)
            .n("tm", tm)
            .n("tn", tn)
            .n("wx", wx)
            .n("ra", ra)
            .n("rb", rb)
            .n("bm", 16 * tm)
            .n("ta_len", 16 * tm * 5)
            .s("kk", u(kk));
        for r in 0..ra {
            env = env.n(&format!("ao{r}"), r * wx * 4);
        }
        for s in 0..rb {
            env = env
                .n(&format!("bco{s}"), s * wx * 4)
                .n(&format!("bo{s}"), s * wx)
                .n(&format!("bx{s}"), s * wx);
        }
        for j in 0..tn {
            env = env
                .n(&format!("p{j}"), j * wx)
                .n(&format!("bn{j}"), j / 4)
                .s(&format!("cj{j}"), ["x", "y", "z", "w"][j % 4]);
        }
        let mut acc = None;
        let mut holes = |gen: &mut Self, hole: &str, args: &[String], env: &mut Env| -> R<()> {
            match hole {
                "offsets" => {
                    gen.batch_offsets(batch, &[("aoff", a), ("boff", b)], env);
                    if let Some(t) = &twin {
                        gen.batch_offsets(batch, &[("boff2", t.b)], env);
                    }
                }
                "load" => {
                    let (aoff, boff) = (env.get("aoff")?, env.get("boff")?);
                    for r in 0..ra {
                        let pa = gen.vec4_quad_a(&quads, &aoff, &format!("ar{r}"), &args[0])?;
                        env.set(&format!("pa{r}"), pa);
                    }
                    // B row-major: every vector at column bc0, rows bo$s
                    // further; else column bc$s.
                    for s in 0..rb {
                        let (kb, bc) = match quads.b_cols {
                            Some(_) => (format!("({} + {}u)", args[1], s * wx), "bc0".into()),
                            None => (args[1].clone(), format!("bc{s}")),
                        };
                        let pb = gen.vec4_quad_b(&quads, &boff, &args[0], &kb, &bc)?;
                        env.set(&format!("pb{s}"), pb);
                    }
                    if let Some(t) = &twin {
                        let pb2 =
                            gen.vec4_quad_b(t, &env.get("boff2")?, &args[0], &args[1], "bc0")?;
                        env.set("pb2", pb2);
                    }
                }
                "outputs" => {
                    let accs = accumulators(env, tm, tn, "c")?;
                    let first = gen.tile_outputs(&accs, 16 * tm, tn, col, nn, mm, "f32");
                    let second = match &twin {
                        Some(_) => Some(gen.pick(&accumulators(env, tm, 4, "d")?, "f32")),
                        None => None,
                    };
                    acc = Some((first, second));
                }
                _ => return Err(bug(format!("matmul template: no hole `{hole}`"))),
            }
            Ok(())
        };
        template::MATMUL_VEC4.render(self, &mut env, &mut holes)?;
        acc.map(Some)
            .ok_or_else(|| bug("matmul template without outputs"))
    }

    /// Four consecutive k of `x` at `line` (A's row or B's column) from
    /// `k`: one vector load from `slot`, or four element loads (zero past
    /// `kk`).
    #[allow(clippy::too_many_arguments)]
    fn quad_along_k(
        &mut self,
        x: &Operand,
        slot: &Option<Slot>,
        off: &str,
        line: &str,
        lines: usize,
        line_stride: usize,
        k: &str,
        kk: usize,
    ) -> R<String> {
        let ok = format!("{line} < {} && {k} < {}", u(lines), u(kk));
        if let Some(s) = slot {
            let at = format!(
                "{off} + min({line}, {}) * {} + min({k}, {})",
                u(lines - 1),
                u(line_stride),
                u(kk - 4)
            );
            return Ok(format!("select(vec4<f32>(0.0), {}, {ok})", vec4_at(s, &at)));
        }
        let dt = self.meta(x.v).dtype;
        let mut parts = vec![];
        for j in 0..4 {
            let kj = self.body.bind("u32", format!("{k} + {j}u"));
            let okj = self
                .body
                .bind("bool", format!("{line} < {} && {kj} < {}", u(lines), u(kk)));
            let at = self.body.bind(
                "u32",
                format!(
                    "{off} + min({line}, {}) * {} + min({kj}, {})",
                    u(lines - 1),
                    u(line_stride),
                    u(kk - 1)
                ),
            );
            let v = self.value_at(x.v, &at)?;
            let v = cast(&v, dt, DType::F32);
            parts.push(self.body.bind("f32", format!("select(0.0, {v}, {okj})")));
        }
        Ok(format!("vec4<f32>({})", parts.join(", ")))
    }

    /// This invocation's vector of A's tile at `k` on row `line`, bound to
    /// a fresh name with fresh fused loads.
    fn vec4_quad_a(&mut self, q: &Quads, aoff: &str, line: &str, k: &str) -> R<String> {
        let saved = std::mem::take(&mut self.memo);
        let pa = self.quad_along_k(q.a, &q.sa, aoff, line, q.nn, q.a.rs, k, q.kk)?;
        let pa = self.body.bind("vec4<f32>", pa);
        self.memo = saved;
        Ok(pa)
    }

    /// This invocation's vector of B's tile at `k` (B row-major: its row
    /// `kb`), bound to a fresh name with fresh fused loads.
    fn vec4_quad_b(&mut self, q: &Quads, boff: &str, k: &str, kb: &str, bc: &str) -> R<String> {
        let (b, kk, mm) = (q.b, q.kk, q.mm);
        let saved = std::mem::take(&mut self.memo);
        let pb = match &q.b_cols {
            Some(s) => {
                let at = format!(
                    "{boff} + min({kb}, {}) * {} + min({bc}, {})",
                    u(kk - 1),
                    u(b.rs),
                    u(mm - 4)
                );
                let pb = format!(
                    "select(vec4<f32>(0.0), {}, {bc} < {} && {kb} < {})",
                    vec4_at(s, &at),
                    u(mm),
                    u(kk)
                );
                self.body.bind("vec4<f32>", pb)
            }
            None => {
                let pb = self.quad_along_k(b, &q.sb, boff, bc, mm, b.cs, k, kk)?;
                self.body.bind("vec4<f32>", pb)
            }
        };
        self.memo = saved;
        Ok(pb)
    }

    /// The GPU matrix product (`shaders/templates/matmul.wgsl`): a 64x64
    /// output tile per workgroup of 16x16 invocations (16x64 for products
    /// of at most 16 rows, batch-1 inference, where bigger tiles would
    /// idle), K in steps of 16 through workgroup memory; the vec4 form
    /// where it applies, in 128x64 tiles where those number at least
    /// `tall_tiles_from`. Opens the epilogue loop over the
    /// invocation's outputs (`row`, `col`, `bz` in scope) and returns its
    /// accumulator (and a twin's, from `b1`: a third tile of workgroup
    /// memory, so never tall) and the tile's rows.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn tiled_product(
        &mut self,
        a: &Operand,
        b: &Operand,
        b1: Option<&Operand>,
        batch: &[usize],
        nn: usize,
        kk: usize,
        mm: usize,
        acc_dt: DType,
    ) -> R<(String, Option<String>, usize, u32)> {
        let tall = b1.is_none()
            && nn.div_ceil(128) * mm.div_ceil(64) * numel(batch).max(1) >= self.tall_tiles_from;
        let wide = tall && self.wide_blocks;
        if let Some((acc, acc1)) =
            self.tiled_vec4_product(a, b, b1, batch, nn, kk, mm, acc_dt, tall, wide)?
        {
            let wx = if wide { 8 } else { 16 };
            return Ok((acc, acc1, if tall { 128 } else { 64 }, wx));
        }
        let at = ty(acc_dt);
        let tm = matmul_rows_per_invocation(nn);
        let bm = 16 * tm;
        let sa = bm + 1;
        let mut env = tile_env()
            .s("at", at)
            .s("zero", literal(0.0, acc_dt))
            .n("tm", tm)
            .n("ta_len", 16 * sa)
            .n("tb_len", 16 * 65)
            .s("sa", u(sa))
            .s("kk", u(kk))
            .b("dual", b1.is_some());
        let mut acc = None;
        let mut holes = |gen: &mut Self, hole: &str, _: &[String], env: &mut Env| -> R<()> {
            match hole {
                "offsets" => {
                    gen.batch_offsets(batch, &[("aoff", a), ("boff", b)], env);
                    if let Some(b1) = b1 {
                        gen.batch_offsets(batch, &[("boff2", b1)], env);
                    }
                }
                "tile_a" => {
                    let aoff = env.get("aoff")?;
                    if !gen.vec4_tile_a(a, &aoff, bm, nn, kk, acc_dt)? {
                        gen.tile_a_elements(a, &aoff, tm, nn, kk, acc_dt)?;
                    }
                }
                "tile_b" | "tile_b2" => {
                    let (x, off, tile) = match (hole, b1) {
                        ("tile_b2", Some(b1)) => (b1, env.get("boff2")?, "tb2"),
                        ("tile_b2", None) => return Err(bug("matmul template: no twin")),
                        _ => (b, env.get("boff")?, "tb"),
                    };
                    if !gen.vec4_tile_b(x, &off, kk, mm, acc_dt, tile)? {
                        gen.tile_b_elements(x, &off, kk, mm, acc_dt, tile)?;
                    }
                }
                "outputs" => {
                    let accs = accumulators(env, tm, 4, "c")?;
                    let col = "lid.x + 16u * (ij % 4u)";
                    let first = gen.tile_outputs(&accs, bm, 4, col, nn, mm, at);
                    let second = match b1 {
                        Some(_) => Some(gen.pick(&accumulators(env, tm, 4, "d")?, at)),
                        None => None,
                    };
                    acc = Some((first, second));
                }
                _ => return Err(bug(format!("matmul template: no hole `{hole}`"))),
            }
            Ok(())
        };
        template::MATMUL.render(self, &mut env, &mut holes)?;
        acc.map(|(acc, acc1)| (acc, acc1, bm, 16))
            .ok_or_else(|| bug("matmul template without outputs"))
    }

    /// A's tile (`16 tm` rows x 16 k) element by element, `tm` elements an
    /// invocation: along k when k is contiguous, else along rows.
    fn tile_a_elements(
        &mut self,
        a: &Operand,
        aoff: &str,
        tm: usize,
        nn: usize,
        kk: usize,
        acc_dt: DType,
    ) -> R<()> {
        let bm = 16 * tm;
        self.body
            .stmt(format!("for (var e = 0u; e < {}; e = e + 1u) {{", u(tm)));
        let saved = std::mem::take(&mut self.memo);
        let idx = self.body.bind("u32", "lin + e * 256u".into());
        let (r, k) = if a.cs == 1 {
            (format!("{idx} / 16u"), format!("{idx} % 16u"))
        } else {
            (format!("{idx} % {}", u(bm)), format!("{idx} / {}", u(bm)))
        };
        let (r, k) = (self.body.bind("u32", r), self.body.bind("u32", k));
        let (row, ka) = (
            self.body.bind("u32", format!("wid.y * {} + {r}", u(bm))),
            self.body.bind("u32", format!("t0 + {k}")),
        );
        let pa = self
            .body
            .bind("bool", format!("{row} < {} && {ka} < {}", u(nn), u(kk)));
        let ia = format!("{aoff} + {row} * {} + {ka} * {}", u(a.rs), u(a.cs));
        let slot = format!("{k} * {} + {r}", u(bm + 1));
        self.load_tile("ta", &slot, a.v, &ia, &pa, acc_dt)?;
        self.memo = saved;
        self.body.stmt("}".into());
        Ok(())
    }

    /// B's tile (16 k x 64 columns) element by element, 4 elements an
    /// invocation: along columns when they are contiguous.
    fn tile_b_elements(
        &mut self,
        b: &Operand,
        boff: &str,
        kk: usize,
        mm: usize,
        acc_dt: DType,
        tile: &str,
    ) -> R<()> {
        self.body
            .stmt("for (var e = 0u; e < 4u; e = e + 1u) {".into());
        let saved = std::mem::take(&mut self.memo);
        let idx = self.body.bind("u32", "lin + e * 256u".into());
        let (k, c) = if b.cs == 1 || b.rs != 1 {
            (format!("{idx} / 64u"), format!("{idx} % 64u"))
        } else {
            (format!("{idx} % 16u"), format!("{idx} / 16u"))
        };
        let (k, c) = (self.body.bind("u32", k), self.body.bind("u32", c));
        let (kb, col) = (
            self.body.bind("u32", format!("t0 + {k}")),
            self.body.bind("u32", format!("wid.x * 64u + {c}")),
        );
        let pb = self
            .body
            .bind("bool", format!("{kb} < {} && {col} < {}", u(kk), u(mm)));
        let ib = format!("{boff} + {kb} * {} + {col} * {}", u(b.rs), u(b.cs));
        let slot = format!("{k} * 65u + {c}");
        self.load_tile(tile, &slot, b.v, &ib, &pb, acc_dt)?;
        self.memo = saved;
        self.body.stmt("}".into());
        Ok(())
    }

    /// Binds each operand's first element for batch entry `bz` in `env`.
    pub(super) fn batch_offsets(
        &mut self,
        batch: &[usize],
        ops: &[(&str, &Operand)],
        env: &mut Env,
    ) {
        let bm = self.unravel("bz", batch);
        for (name, op) in ops {
            let off = self.ravel(&bm, &op.batch, 0);
            env.set(name, off);
        }
    }

    /// Opens a tiled product's epilogue loop over the invocation's
    /// accumulators (`tn` columns a row; rows `lid.y + 16 i` of a `bm`-row
    /// tile, columns `col` within its 64): `row`, `col` in scope, past the
    /// result skipped; returns the accumulator, picked by selects (a
    /// dynamic index would move the accumulators out of registers).
    #[allow(clippy::too_many_arguments)]
    fn tile_outputs(
        &mut self,
        accs: &[String],
        bm: usize,
        tn: usize,
        col: &str,
        nn: usize,
        mm: usize,
        at: &str,
    ) -> String {
        self.body.stmt(format!(
            "for (var ij = 0u; ij < {}; ij = ij + 1u) {{",
            u(accs.len())
        ));
        self.body.stmt(format!(
            "let row = wid.y * {} + lid.y + 16u * (ij / {});",
            u(bm),
            u(tn)
        ));
        self.body.stmt(format!("let col = wid.x * 64u + {col};"));
        self.body.stmt(format!(
            "if (row >= {} || col >= {}) {{ continue; }}",
            u(nn),
            u(mm)
        ));
        self.pick(accs, at)
    }

    /// In a tiled product's epilogue loop, accumulator `ij` of `accs`,
    /// picked by selects (a dynamic index would move the accumulators out
    /// of registers).
    fn pick(&mut self, accs: &[String], at: &str) -> String {
        let mut pick = accs[0].clone();
        for (i, c) in accs.iter().enumerate().skip(1) {
            pick = format!("select({pick}, {c}, ij == {i}u)");
        }
        self.body.bind(at, pick)
    }
}
