//! Attention as one kernel: `O = softmax(f(Q K)) V` with `f` elementwise
//! (scale, mask), `Fused::Attention`. Each invocation owns one query row;
//! the workgroup (rows of one batch entry) walks the keys in tiles staged
//! through workgroup memory, with an online softmax (running maximum and
//! sum, accumulator rescaled per tile), so neither the scores nor the
//! probabilities reach memory.

use super::matmul::Operand;
use super::*;

/// Keys per tile.
const KEYS: usize = 16;

/// Query rows per workgroup: the rows of one batch entry, up to the
/// device's workgroup size.
fn rows_per_workgroup(rows: usize, workgroup: u32) -> usize {
    rows.next_power_of_two().clamp(8, workgroup.max(8) as usize)
}

/// An attention kernel's operands: `q` as [sq, dk], `k` as [dk, sk] (the
/// right operand of `q k`), `v` as [sk, dv], over `batch`, into `o`.
struct Spec {
    q: Operand,
    k: Operand,
    v: Operand,
    batch: Vec<usize>,
    sq: usize,
    dk: usize,
    sk: usize,
    dv: usize,
    o: ValueId,
}

/// How a score becomes the softmax's input.
enum Score {
    /// The fused program's elementwise chain `x_val` over the product
    /// `s_val` (`Fused::Attention`).
    Chain { s_val: ValueId, x_val: ValueId },
    /// `scaled_dot_product_attention`: scale, causal mask, attention mask
    /// (bool: allowed positions; float: added).
    Sdpa {
        scale: f64,
        causal: bool,
        mask: Option<ValueId>,
    },
}

impl Gen<'_> {
    /// The fused `softmax(f(Q K)) V` of a program.
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
        if qk.extra.is_some() || pv.extra.is_some() || qk.batch != pv.batch || pv.kk != qk.mm {
            return Err(bug("attention products do not chain"));
        }
        let spec = Spec {
            sq: qk.nn,
            dk: qk.kk,
            sk: qk.mm,
            dv: pv.mm,
            q: qk.a,
            k: qk.b,
            v: pv.b,
            batch: pv.batch,
            o,
        };
        self.attention_kernel(spec, Score::Chain { s_val, x_val }, label)
    }

    /// `scaled_dot_product_attention(q, k, v, attn_mask, dropout_p,
    /// is_causal, scale)` node `n`.
    pub(super) fn sdpa(&mut self, n: NodeId, label: String) -> R<KernelCode> {
        let g = self.g;
        let node = &g.nodes[n];
        let t = |i: usize| -> R<ValueId> {
            match node.args.get(i) {
                Some(Arg::Tensor(v)) => Ok(*v),
                _ => Err(bug("sdpa operand")),
            }
        };
        let (q, k, v) = (t(0)?, t(1)?, t(2)?);
        let mask = t(3).ok();
        let causal = matches!(node.args.get(5), Some(Arg::Bool(true)));
        let (qm, km, vm) = (g.meta(q), g.meta(k), g.meta(v));
        let (sq, dk) = (qm.sizes[qm.dim() - 2], qm.sizes[qm.dim() - 1]);
        let sk = km.sizes[km.dim() - 2];
        let dv = vm.sizes[vm.dim() - 1];
        let scale = match node.args.get(6) {
            Some(Arg::Float(s)) => *s,
            Some(Arg::Int(s)) => *s as f64,
            _ => 1.0 / (dk as f64).sqrt(),
        };
        let o = node.results[0];
        let om = g.meta(o);
        let batch = om.sizes[..om.dim() - 2].to_vec();
        // Strides of an operand's own batch dims over the output batch (0
        // where it broadcasts).
        let bstr = |m: &Meta| -> Vec<usize> {
            let own = &m.sizes[..m.dim() - 2];
            let st = contiguous_strides(&m.sizes);
            let lead = batch.len() - own.len();
            (0..batch.len())
                .map(|i| {
                    if i < lead || own[i - lead] == 1 {
                        0
                    } else {
                        st[i - lead]
                    }
                })
                .collect()
        };
        let spec = Spec {
            q: Operand {
                v: q,
                batch: bstr(qm),
                rs: dk,
                cs: 1,
            },
            k: Operand {
                v: k,
                batch: bstr(km),
                rs: 1,
                cs: dk,
            },
            v: Operand {
                v,
                batch: bstr(vm),
                rs: dv,
                cs: 1,
            },
            batch,
            sq,
            dk,
            sk,
            dv,
            o,
        };
        self.attention_kernel(
            spec,
            Score::Sdpa {
                scale,
                causal,
                mask,
            },
            label,
        )
    }

    fn attention_kernel(&mut self, spec: Spec, score: Score, label: String) -> R<KernelCode> {
        let g = self.g;
        let Spec {
            q,
            k,
            v,
            batch,
            sq,
            dk,
            sk,
            dv,
            o,
        } = spec;
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
        // (bz, i, j) with the product's value there. Small heads unroll the
        // loops over the tile's keys too: a dynamic index keeps `sc` in
        // memory, and constant offsets let the compiler read `ks`/`vs` four
        // words at a time (an H100 ran MiniLM 32 x 128's attention at 7
        // TFLOP/s looped). Wide heads keep the loops: unrolled, their
        // shaders take lavapipe minutes to compile.
        let unroll = KEYS * (dk + dv) <= 1024;
        let keys: Vec<String> = if unroll {
            (0..KEYS).map(u).collect()
        } else {
            vec!["jj".to_string()]
        };
        let open = |gen: &mut Self| {
            gen.body.stmt(if unroll {
                "{".to_string()
            } else {
                format!("for (var jj = 0u; jj < {}; jj = jj + 1u) {{", u(KEYS))
            })
        };
        let bmax = self.body.var("f32", ninf.clone());
        for jj in &keys {
            open(self);
            self.body.stmt("var s: f32 = 0.0;".into());
            self.body.stmt(format!("let kb = {jj} * {};", u(dk)));
            for d in 0..dk {
                self.body
                    .stmt(format!("s = s + q[{d}] * ks[kb + {}];", u(d)));
            }
            self.body.stmt(format!("let j = j0 + {jj};"));
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
            let x = match &score {
                Score::Chain { s_val, x_val } => {
                    self.memo.insert((*s_val, si.clone()), s);
                    let x = self.value_at(*x_val, &si)?;
                    cast(&x, g.meta(*x_val).dtype, DType::F32)
                }
                Score::Sdpa {
                    scale,
                    causal,
                    mask,
                } => {
                    let mut x = self
                        .body
                        .bind("f32", format!("{s} * {}", literal(*scale, DType::F32)));
                    if *causal {
                        x = self
                            .body
                            .bind("f32", format!("select({ninf}, {x}, j <= ic)"));
                    }
                    if let Some(mv) = mask {
                        let mm = g.meta(*mv).clone();
                        let mut shape = batch.clone();
                        shape.extend([sq, sk]);
                        let mi = self.broadcast_index(&si, &shape, &mm);
                        let m = self.value_at(*mv, &mi)?;
                        x = if mm.dtype == DType::Bool {
                            self.body.bind("f32", format!("select({ninf}, {x}, {m})"))
                        } else {
                            let m = cast(&m, mm.dtype, DType::F32);
                            self.body.bind("f32", format!("{x} + {m}"))
                        };
                    }
                    x
                }
            };
            self.body
                .stmt(format!("sc[{jj}] = select({ninf}, {x}, j < {});", u(sk)));
            self.body.stmt(format!("{bmax} = max({bmax}, sc[{jj}]);"));
            self.body.stmt("}".into());
            // The block's bindings end with it.
            self.memo.clear();
        }
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
        for jj in &keys {
            open(self);
            self.body
                .stmt(format!("let p = select(exp(sc[{jj}] - mn), 0.0, dead);"));
            self.body.stmt("l = l + p;".into());
            self.body.stmt(format!("let vb = {jj} * {};", u(dv)));
            for c in 0..dv {
                self.body
                    .stmt(format!("acc[{c}] = acc[{c}] + p * vs[vb + {}];", u(c)));
            }
            self.body.stmt("}".into());
        }
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
            return Err(CompileError::no_kernel(format!(
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
