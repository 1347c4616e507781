//! Attention as one kernel: `O = softmax(f(Q K)) V` with `f` elementwise
//! (scale, mask), `Fused::Attention`. Each invocation owns one query row;
//! the workgroup (rows of one batch entry, or of every head where it
//! computes the output projection) walks the keys in tiles staged through
//! workgroup memory, with an online softmax (running maximum and sum,
//! accumulator rescaled per tile), so neither the scores nor the
//! probabilities reach memory. CPU adapters run a row kernel instead
//! (`attention_rows_kernel`).

use super::matmul::{Operand, Product};
use super::template::{self, Env};
use super::*;
use crate::schedule::AttentionTiles;

/// Query rows an invocation of the row kernel owns (CPU adapters,
/// `CompileOptions::attention_rows`), and keys a step of its walk.
/// lavapipe, the 128 x 256 4-head workload's attention (2026-12-04): 2
/// rows and 4 keys 3.6 ms; 1 row 5.5, 4 rows 4.0, 8 rows 6.0; 8 keys a
/// step 3.9 (2 rows), 7.1 (4 rows).
const ROWS: usize = crate::schedule::ATTENTION_ROW_BLOCK;
const STEP: usize = 4;

/// The widest head the row kernel unrolls (its code grows with
/// `ROWS * STEP * (dk + dv)`); wider heads run the tiled kernel.
const ROWS_MAX_HEAD: usize = 256;

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

/// The projections a fused attention computes (`Fused::Attention`'s
/// `q_proj` and `o_proj`: `linear` nodes).
pub(super) struct Projections {
    pub(super) q: Option<NodeId>,
    pub(super) o: Option<NodeId>,
}

/// Those projections as products, the output projection's with its
/// result; `heads` is the attention's innermost batch dimension.
struct Proj {
    q: Option<Product>,
    o: Option<(Product, ValueId)>,
    heads: usize,
}

impl Proj {
    fn none() -> Proj {
        Proj {
            q: None,
            o: None,
            heads: 1,
        }
    }
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

impl Score {
    /// The softmax denominator `l` as the output divides by it: for
    /// `scaled_dot_product_attention` a row whose every key is masked
    /// (`l` = 0) gives zeros, as PyTorch's safe softmax does; a program's
    /// own softmax gives NaN there, as eager's.
    fn denominator(&self, l: &str) -> String {
        match self {
            Score::Chain { .. } => l.to_string(),
            Score::Sdpa { .. } => format!("select({l}, 1.0, {l} == 0.0)"),
        }
    }
}

impl Gen<'_> {
    /// The fused `softmax(f(Q K)) V` of a program.
    pub(super) fn attention(
        &mut self,
        scores: NodeId,
        softmax: NodeId,
        product: NodeId,
        proj: Projections,
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
        let proj = Proj {
            q: proj.q.map(|n| self.product(n)).transpose()?,
            o: proj
                .o
                .map(|n| Ok((self.product(n)?, g.nodes[n].results[0])))
                .transpose()?,
            heads: spec.batch.last().copied().unwrap_or(1),
        };
        self.attention_kernel(spec, Score::Chain { s_val, x_val }, proj, label)
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
            Proj::none(),
            label,
        )
    }

    fn attention_kernel(
        &mut self,
        spec: Spec,
        score: Score,
        proj: Proj,
        label: String,
    ) -> R<KernelCode> {
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
        if nb > 65535 {
            return Err(CompileError::no_kernel(format!(
                "attention over {nb} batch entries: too many workgroups"
            )));
        }
        // CPU adapters' row kernel; with projections but no subgroups
        // (kernels in sequence, `lower::sequence`) each lane loads every
        // unit itself.
        let projected = proj.q.is_some() || proj.o.is_some();
        let rows_sg = self
            .subgroup
            .filter(|&sg| (self.workgroup as usize).is_multiple_of(sg))
            .or(projected.then_some(1))
            .filter(|_| self.attention_rows && dk.max(dv) <= ROWS_MAX_HEAD && sq > 0 && sk > 0);
        if let Some(sg) = rows_sg {
            let spec = Spec {
                q,
                k,
                v,
                batch,
                sq,
                dk,
                sk,
                dv,
                o,
            };
            return self.attention_rows_kernel(spec, &score, proj, sg, label);
        }
        // With the output projection a workgroup owns every head of its
        // rows (`schedule::AttentionTiles`), one head apart.
        let merged = proj.o.as_ref().map(|_| proj.heads);
        let Some(tiles) = AttentionTiles::new(self.subgroup, self.workgroup, sq, dk, dv, merged)
        else {
            return Err(bug("attention's tiles do not fit its workgroup"));
        };
        let AttentionTiles {
            lanes,
            keys,
            rows: wq,
            heads: hg,
        } = tiles;
        // Invocations a head, and the workgroup's.
        let hw = wq * lanes;
        let w = hw * hg;
        let unroll = keys * (dk + dv) <= 1024;
        let keys_at = if unroll {
            (0..keys).map(u).collect()
        } else {
            vec!["jj".to_string()]
        };
        let mut env = Env::default()
            .n("keys", keys)
            .n("ks_len", keys * dk)
            .n("vs_len", keys * dv)
            .n("kv_len", hg * keys * (dk + dv))
            .s("vs_at", u(hg * keys * dk))
            .n("dk", dk)
            .n("dv", dv)
            .n("dkl", dk / lanes)
            .n("dvl", dv / lanes)
            .n("lanes", lanes)
            .n("mw", hg * dv)
            .l(
                "lane_masks",
                (0..lanes.trailing_zeros()).map(|b| u(1 << b)).collect(),
            )
            .s("w", u(w))
            .s("hw", u(hw))
            .s("hg", u(hg))
            .s("wq", u(wq))
            .s("sq", u(sq))
            .s("sq_last", u(sq - 1))
            .s("sk", u(sk))
            .s("sk_last", u(sk - 1))
            .s("sq_sk", u(sq * sk))
            .s("sq_dv", u(sq * dv))
            .s("ninf", literal(f64::NEG_INFINITY, DType::F32))
            .s("l_div", score.denominator("l"))
            .b("unroll", unroll)
            .b("merge", proj.o.is_some())
            .l("keys_at", keys_at);
        for d in 0..dk.max(dv) {
            env = env.n(&format!("dl{d}"), d * lanes);
        }
        let mut holes = |gen: &mut Self, hole: &str, args: &[String], env: &mut Env| -> R<()> {
            match hole {
                "offsets" => {
                    gen.batch_offsets(&batch, &[("qoff", &q), ("koff", &k), ("voff", &v)], env)
                }
                "load_q" => match &proj.q {
                    Some(p) => gen.project_query(p, dk, lanes, sq, proj.heads)?,
                    None => gen.load_query(&q, dk, lanes, &env.get("qoff")?)?,
                },
                "stage" => {
                    let (x, ok) = if args[0] == "k" {
                        gen.stage_tile(&k, true, dk, sk, &env.get("koff")?)?
                    } else {
                        gen.stage_tile(&v, false, dv, sk, &env.get("voff")?)?
                    };
                    env.set("x", x);
                    env.set("ok", ok);
                }
                "score" => {
                    let (sv, si) = (env.get("sv")?, env.get("si")?);
                    let x = gen.score(&score, &batch, sq, sk, sv, &si)?;
                    env.set("x", x);
                }
                "store" => {
                    let c = env.get("c")?;
                    let y = cast(
                        &format!("(acc[{c}] / {})", score.denominator("l")),
                        DType::F32,
                        gen.meta(o).dtype,
                    );
                    gen.store_to(o, &env.get("oi")?, &y)?;
                }
                "project" => {
                    let Some((p, r_out)) = &proj.o else {
                        return Err(bug("attention template: a merge without its projection"));
                    };
                    gen.project_merge(p, *r_out, wq, w, sq)?;
                }
                "forget" => gen.memo.clear(),
                _ => return Err(bug(format!("attention template: no hole `{hole}`"))),
            }
            Ok(())
        };
        template::ATTENTION.render(self, &mut env, &mut holes)?;
        self.uses_subgroup |= lanes > 1;
        let grid = [sq.div_ceil(wq) as u32, (nb / hg) as u32, 1];
        Ok(self.finish(
            format!("attention#{}", label.split('#').nth(1).unwrap_or("")),
            grid,
            [w as u32, 1, 1],
        ))
    }

    /// This invocation's elements of query row `ic` (every `lanes`-th from
    /// `part`) into `q` (registers), with fresh fused loads.
    fn load_query(&mut self, q: &Operand, dk: usize, lanes: usize, qoff: &str) -> R<()> {
        let dt = self.meta(q.v).dtype;
        self.memo.clear();
        let qrow = self.body.bind("u32", format!("{qoff} + ic * {}", u(q.rs)));
        for d in 0..dk / lanes {
            let qi = self.body.bind(
                "u32",
                format!("{qrow} + ({} + part) * {}", u(d * lanes), u(q.cs)),
            );
            let x = self.value_at(q.v, &qi)?;
            let x = cast(&x, dt, DType::F32);
            self.body.stmt(format!("q[{d}] = {x};"));
        }
        self.memo.clear();
        Ok(())
    }

    /// This invocation's elements of query row `ic` of head `bz % heads`
    /// (every `lanes`-th from `part`) into `q`, computed from their
    /// projection `p` (`q[b, h, i, d]` = `Q[b, i, h dk + d]`, `Q = x W^T +
    /// bias`): x's row is read a vector at a time where the layout
    /// allows; a head group's invocations read the same weights.
    fn project_query(
        &mut self,
        p: &Product,
        dk: usize,
        lanes: usize,
        sq: usize,
        heads: usize,
    ) -> R<()> {
        let (kk, nq) = (p.kk, p.mm);
        self.memo.clear();
        let col0 = self
            .body
            .bind("u32", format!("(bz % {}) * {} + part", u(heads), u(dk)));
        let xrow = self
            .body
            .bind("u32", format!("(bz / {}) * {} + ic", u(heads), u(sq)));
        let sa = self.vec4_operand(&p.a, p.a.rs, p.a.cs, kk)?;
        let sb = self.vec4_operand(&p.b, p.b.cs, p.b.rs, kk)?;
        let quads = sa.zip(sb);
        let step = if quads.is_some() { 4 } else { 1 };
        self.body.stmt(format!(
            "for (var c = 0u; c < {}; c = c + {}) {{",
            u(kk),
            u(step)
        ));
        let at = format!("{xrow} * {} + c * {}", u(p.a.rs), u(p.a.cs));
        let x = self.load_unit(quads.as_ref().map(|q| &q.0), p.a.v, at)?;
        for d in 0..dk / lanes {
            let at = format!(
                "({col0} + {}) * {} + c * {}",
                u(d * lanes),
                u(p.b.cs),
                u(p.b.rs)
            );
            let wv = self.load_unit(quads.as_ref().map(|q| &q.1), p.b.v, at)?;
            let term = match quads {
                Some(_) => format!("dot({x}, {wv})"),
                None => format!("{x} * {wv}"),
            };
            self.body.stmt(format!("q[{d}] = q[{d}] + {term};"));
        }
        self.memo.clear();
        self.body.stmt("}".into());
        for d in 0..dk / lanes {
            let acc = format!("q[{d}]");
            let qi = self.body.bind(
                "u32",
                format!("{xrow} * {} + {col0} + {}", u(nq), u(d * lanes)),
            );
            let y = self.with_addend(&acc, p.extra, &p.batch, p.nn, nq, &qi, DType::F32)?;
            if y != acc {
                self.body.stmt(format!("{acc} = {y};"));
            }
        }
        self.memo.clear();
        Ok(())
    }

    /// The output projection `p` of the workgroup's `rows` rows of the
    /// head merge (in `kv`, a row of `p.kk` words each), stored as its
    /// result `r_out` through its bias and epilogue: invocation `lid.x`
    /// of `w` computes columns `lid.x`, `lid.x + w`, ..., each weight
    /// loaded once for every row.
    fn project_merge(
        &mut self,
        p: &Product,
        r_out: ValueId,
        rows: usize,
        w: usize,
        sq: usize,
    ) -> R<()> {
        let (kk, no) = (p.kk, p.mm);
        self.memo.clear();
        let sb = self.vec4_operand(&p.b, p.b.cs, p.b.rs, kk)?;
        let step = if sb.is_some() { 4 } else { 1 };
        self.body.stmt(format!(
            "for (var n = lid.x; n < {}; n = n + {}) {{",
            u(no),
            u(w)
        ));
        for r in 0..rows {
            self.body.stmt(format!("var o{r}: f32 = 0.0;"));
        }
        self.body.stmt(format!(
            "for (var c = 0u; c < {}; c = c + {}) {{",
            u(kk),
            u(step)
        ));
        let at = format!("n * {} + c * {}", u(p.b.cs), u(p.b.rs));
        let wv = self.load_unit(sb.as_ref(), p.b.v, at)?;
        for r in 0..rows {
            let m = |e: usize| format!("kv[{} + c + {}]", u(r * kk), u(e));
            let term = match sb {
                Some(_) => format!(
                    "dot(vec4<f32>({}, {}, {}, {}), {wv})",
                    m(0),
                    m(1),
                    m(2),
                    m(3)
                ),
                None => format!("{} * {wv}", m(0)),
            };
            self.body.stmt(format!("o{r} = o{r} + {term};"));
        }
        self.memo.clear();
        self.body.stmt("}".into());
        for r in 0..rows {
            let i = self
                .body
                .bind("u32", format!("wid.x * {} + {}", u(rows), u(r)));
            self.body.stmt(format!("if ({i} < {}) {{", u(sq)));
            let oi = self
                .body
                .bind("u32", format!("(wid.y * {} + {i}) * {} + n", u(sq), u(no)));
            self.store_projected(p, r_out, &oi, &format!("o{r}"))?;
            self.body.stmt("}".into());
            self.memo.clear();
        }
        self.body.stmt("}".into());
        Ok(())
    }

    /// Element `at` of `x` as f32, or the vector of four there where
    /// `slot` reads `x` as vectors.
    fn load_unit(&mut self, slot: Option<&Slot>, x: ValueId, at: String) -> R<String> {
        Ok(match slot {
            Some(s) => self.body.bind("vec4<f32>", super::matmul::vec4_at(s, &at)),
            None => {
                let at = self.body.bind("u32", at);
                let v = self.value_at(x, &at)?;
                self.body
                    .bind("f32", cast(&v, self.meta(x).dtype, DType::F32))
            }
        })
    }

    /// Element `e` of a tile of keys (`keys`: K as [d, j]) or values (V as
    /// [j, c]) of `width` columns: the value (as f32) and whether its key
    /// `j0 + e / width` exists.
    fn stage_tile(
        &mut self,
        op: &Operand,
        keys: bool,
        width: usize,
        sk: usize,
        off: &str,
    ) -> R<(String, String)> {
        let jj = self.body.bind("u32", format!("e / {}", u(width)));
        let c = self.body.bind("u32", format!("e % {}", u(width)));
        let j = self.body.bind("u32", format!("j0 + {jj}"));
        let ok = self.body.bind("bool", format!("{j} < {}", u(sk)));
        let jc = self.body.bind("u32", format!("min({j}, {})", u(sk - 1)));
        let at = if keys {
            format!("{off} + {c} * {} + {jc} * {}", u(op.rs), u(op.cs))
        } else {
            format!("{off} + {jc} * {} + {c} * {}", u(op.rs), u(op.cs))
        };
        let at = self.body.bind("u32", at);
        let x = self.value_at(op.v, &at)?;
        Ok((cast(&x, self.meta(op.v).dtype, DType::F32), ok))
    }

    /// The softmax's input at score `s` (position `si` of the scores
    /// [batch, sq, sk], key `j`, query row `ic`).
    fn score(
        &mut self,
        score: &Score,
        batch: &[usize],
        sq: usize,
        sk: usize,
        s: String,
        si: &str,
    ) -> R<String> {
        let g = self.g;
        let ninf = literal(f64::NEG_INFINITY, DType::F32);
        Ok(match score {
            Score::Chain { s_val, x_val } => {
                self.memo.insert((*s_val, si.to_string()), s);
                let x = self.value_at(*x_val, si)?;
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
                    let mut shape = batch.to_vec();
                    shape.extend([sq, sk]);
                    let mi = self.broadcast_index(si, &shape, &mm);
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
        })
    }
}

/// How a row kernel's invocation reads its share of a tile of K or V.
enum Share {
    /// Quads along the keys (K stored key-contiguous, as [d, j]):
    /// quad `d` holds keys `j0..j0 + 4` of dimension `d`.
    Keys(Slot),
    /// Quads along a key's row (K as [j, d] or V as [j, c]): quad
    /// `e` holds elements `4 (e % quads) ..` of key `j0 + e / quads`.
    Rows(Slot),
    /// Element loads (fused or unaligned operands).
    Elements,
}

impl Gen<'_> {
    /// Attention for CPU adapters (`CompileOptions::attention_rows`): an
    /// invocation owns `ROWS` query rows and walks the keys `STEP` at a
    /// time, online softmax in registers, no workgroup memory and no
    /// barrier. lavapipe runs a subgroup as the lanes of one SIMD
    /// register and loads memory lane by lane, so what costs is load
    /// instructions: each lane of a subgroup loads a different share of
    /// the step's keys and values (as vectors where the layout allows)
    /// and `subgroupBroadcast` hands every element to all lanes. The
    /// lanes of a workgroup are rows of one batch entry, so they read the
    /// same keys; lanes past the last row compute a clamped row and store
    /// nothing (every lane must reach the broadcasts).
    fn attention_rows_kernel(
        &mut self,
        spec: Spec,
        score: &Score,
        proj: Proj,
        sg: usize,
        label: String,
    ) -> R<KernelCode> {
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
        // An invocation walking every head does `heads` times the work:
        // workgroups of one subgroup spread it over more threads
        // (`schedule::ATTENTION_MIN_WORKGROUPS`).
        let w = if proj.o.is_some() && sg > 1 {
            sg
        } else {
            self.workgroup as usize
        };
        let ninf = literal(f64::NEG_INFINITY, DType::F32);
        self.body
            .stmt(format!("let blk = wid.x * {} + lid.x;", u(w)));
        self.body.stmt(format!("let lane = lid.x % {};", u(sg)));
        let mut rows = vec![];
        for r in 0..ROWS {
            self.body
                .stmt(format!("let i{r} = blk * {} + {};", u(ROWS), u(r)));
            self.body
                .stmt(format!("let ic{r} = min(i{r}, {});", u(sq - 1)));
            rows.push((format!("i{r}"), format!("ic{r}")));
        }
        // With the output projection, the invocation walks every head of
        // its rows, accumulating the projection of each head's share.
        let hl = if proj.o.is_some() { proj.heads } else { 1 };
        if let Some((p, _)) = &proj.o {
            self.body
                .stmt(format!("var oacc: array<f32, {}>;", ROWS * p.mm));
            self.body.stmt(format!(
                "for (var hh = 0u; hh < {}; hh = hh + 1u) {{",
                u(hl)
            ));
            self.body.stmt(format!("let bz = wid.y * {} + hh;", u(hl)));
        } else {
            self.body.stmt("let bz = wid.y;".into());
        }
        let mut env = Env::default();
        self.batch_offsets(
            &batch,
            &[("qoff", &q), ("koff", &k), ("voff", &v)],
            &mut env,
        );
        let (qoff, koff, voff) = (env.get("qoff")?, env.get("koff")?, env.get("voff")?);
        // The query rows, in registers.
        let mut qs = vec![];
        let qslot = match proj.q {
            Some(_) => None,
            None => self.vec4_operand(&q, q.rs, q.cs, dk)?,
        };
        if let Some(p) = &proj.q {
            qs = self.project_queries(p, &rows, dk, sq, proj.heads, sg)?;
        }
        for (_, ic) in rows.iter().filter(|_| proj.q.is_none()) {
            let row = self
                .body
                .bind("u32", format!("{qoff} + {ic} * {}", u(q.rs)));
            let mut qr = vec![];
            for d in 0..dk {
                let x = match &qslot {
                    Some(s) if d % 4 == 0 => {
                        let x = self.body.bind(
                            "vec4<f32>",
                            super::matmul::vec4_at(s, &format!("{row} + {}", u(d))),
                        );
                        qr.extend((0..4).map(|c| format!("{x}.{}", COMP[c])));
                        continue;
                    }
                    Some(_) => continue,
                    None => {
                        let at = self.body.bind("u32", format!("{row} + {}", u(d * q.cs)));
                        let x = self.value_at(q.v, &at)?;
                        cast(&x, self.meta(q.v).dtype, DType::F32)
                    }
                };
                qr.push(self.body.bind("f32", x));
            }
            qs.push(qr);
        }
        self.memo.clear();
        for r in 0..ROWS {
            for c in 0..dv {
                self.body.stmt(format!("var a{r}_{c}: f32 = 0.0;"));
            }
            self.body.stmt(format!("var m{r}: f32 = {ninf};"));
            self.body.stmt(format!("var l{r}: f32 = 0.0;"));
        }
        self.body.stmt(format!(
            "for (var j0 = 0u; j0 < {}; j0 = j0 + {}) {{",
            u(sk),
            u(STEP)
        ));
        // The step's keys: element (d, jj) of K as [d, j].
        let kshare = match self.vec4_operand(&k, k.rs, k.cs, sk)? {
            Some(s) => Share::Keys(s),
            None => match self.vec4_operand(&k, k.cs, k.rs, dk)? {
                Some(s) => Share::Rows(s),
                None => Share::Elements,
            },
        };
        let kel = self.share_tile(&k, kshare, true, dk, sk, &koff, sg)?;
        for (r, qr) in qs.iter().enumerate() {
            for (jj, kj) in kel.iter().enumerate() {
                let terms: Vec<String> = qr
                    .iter()
                    .zip(kj)
                    .map(|(q, k)| format!("{q} * {k}"))
                    .collect();
                self.body.stmt(format!("var s{r}_{jj}: f32 = 0.0;"));
                for chunk in terms.chunks(8) {
                    self.body
                        .stmt(format!("s{r}_{jj} = s{r}_{jj} + {};", chunk.join(" + ")));
                }
            }
        }
        // The softmax's inputs, each in a block of its own: the score's
        // chain binds `j` and `ic` (causal masks) and its loads end there.
        for (r, (_, ic)) in rows.iter().enumerate() {
            for jj in 0..STEP {
                self.body.stmt(format!("var x{r}_{jj}: f32;"));
                self.body.stmt("{".into());
                self.body.stmt(format!("let j = j0 + {};", u(jj)));
                self.body.stmt(format!("let ic = {ic};"));
                let si = self.body.bind(
                    "u32",
                    format!(
                        "bz * {} + ic * {} + min(j, {})",
                        u(sq * sk),
                        u(sk),
                        u(sk - 1)
                    ),
                );
                let x = self.score(score, &batch, sq, sk, format!("s{r}_{jj}"), &si)?;
                self.body
                    .stmt(format!("x{r}_{jj} = select({ninf}, {x}, j < {});", u(sk)));
                self.body.stmt("}".into());
                self.memo.clear();
            }
        }
        // Online softmax: rescale what the earlier steps accumulated. A
        // row whose every score so far is -inf has nothing to rescale
        // (and ends 0 / 0 = NaN, as softmax gives).
        let mut ps = vec![];
        for r in 0..ROWS {
            let xs: Vec<String> = (0..STEP).map(|jj| format!("x{r}_{jj}")).collect();
            let bm = xs
                .iter()
                .skip(1)
                .fold(xs[0].clone(), |a, x| format!("max({a}, {x})"));
            let mn = self.body.bind("f32", format!("max(m{r}, {bm})"));
            let dead = self.body.bind("bool", format!("{mn} == {ninf}"));
            let alpha = self
                .body
                .bind("f32", format!("select(exp(m{r} - {mn}), 1.0, {dead})"));
            let p: Vec<String> = xs
                .iter()
                .map(|x| {
                    self.body
                        .bind("f32", format!("select(exp({x} - {mn}), 0.0, {dead})"))
                })
                .collect();
            self.body
                .stmt(format!("l{r} = l{r} * {alpha} + {};", p.join(" + ")));
            self.body.stmt(format!("m{r} = {mn};"));
            for c in 0..dv {
                self.body.stmt(format!("a{r}_{c} = a{r}_{c} * {alpha};"));
            }
            ps.push(p);
        }
        // The step's values: element (jj, c) of V as [j, c].
        let vshare = match self.vec4_operand(&v, v.rs, v.cs, dv)? {
            Some(s) => Share::Rows(s),
            None => Share::Elements,
        };
        let vel = self.share_tile(&v, vshare, false, dv, sk, &voff, sg)?;
        for (r, p) in ps.iter().enumerate() {
            for c in 0..dv {
                let terms: Vec<String> = p
                    .iter()
                    .zip(&vel)
                    .map(|(w, vj)| format!("{w} * {}", vj[c]))
                    .collect();
                self.body
                    .stmt(format!("a{r}_{c} = a{r}_{c} + {};", terms.join(" + ")));
            }
        }
        self.memo.clear();
        self.body.stmt("}".into());
        if let Some((p, r_out)) = &proj.o {
            self.project_output(p, dv, sg, score)?;
            // The heads' loop.
            self.body.stmt("}".into());
            self.memo.clear();
            self.store_projection(p, *r_out, &rows, sq)?;
        }
        for (r, (i, _)) in rows.iter().enumerate().filter(|_| proj.o.is_none()) {
            self.body.stmt(format!("if ({i} < {}) {{", u(sq)));
            let orow = self
                .body
                .bind("u32", format!("bz * {} + {i} * {}", u(sq * dv), u(dv)));
            for c in 0..dv {
                let oi = self.body.bind("u32", format!("{orow} + {}", u(c)));
                let y = cast(
                    &format!("(a{r}_{c} / {})", score.denominator(&format!("l{r}"))),
                    DType::F32,
                    self.meta(o).dtype,
                );
                self.store_to(o, &oi, &y)?;
            }
            self.body.stmt("}".into());
            self.memo.clear();
        }
        self.uses_subgroup |= sg > 1;
        let workgroups = crate::schedule::attention_row_workgroups(sq, 1, w);
        let grid = [workgroups as u32, (nb / hl) as u32, 1];
        Ok(self.finish(
            format!("attention#{}", label.split('#').nth(1).unwrap_or("")),
            grid,
            [w as u32, 1, 1],
        ))
    }

    /// The invocation's query rows of head `bz % heads` computed from
    /// their projection `p` (`Q = x W^T + bias`, `q[b, h, i, d]` =
    /// `Q[b, i, h dk + d]`): the rows of x loaded once a step of k,
    /// as vectors where the layout allows. Returns the registers.
    fn project_queries(
        &mut self,
        p: &Product,
        rows: &[(String, String)],
        dk: usize,
        sq: usize,
        heads: usize,
        sg: usize,
    ) -> R<Vec<Vec<String>>> {
        let (kk, nq) = (p.kk, p.mm);
        self.memo.clear();
        let col0 = self
            .body
            .bind("u32", format!("(bz % {}) * {}", u(heads), u(dk)));
        let xrows: Vec<String> = rows
            .iter()
            .map(|(_, ic)| {
                self.body
                    .bind("u32", format!("(bz / {}) * {} + {ic}", u(heads), u(sq)))
            })
            .collect();
        for r in 0..ROWS {
            for d in 0..dk {
                self.body.stmt(format!("var q{r}_{d}: f32 = 0.0;"));
            }
        }
        let sa = self.vec4_operand(&p.a, p.a.rs, p.a.cs, kk)?;
        let sb = self.vec4_operand(&p.b, p.b.cs, p.b.rs, kk)?;
        let quads = sa.zip(sb);
        let step = if quads.is_some() { 4 } else { 1 };
        self.body.stmt(format!(
            "for (var c = 0u; c < {}; c = c + {}) {{",
            u(kk),
            u(step)
        ));
        let mut xs = vec![];
        for row in &xrows {
            let at = format!("{row} * {} + c * {}", u(p.a.rs), u(p.a.cs));
            xs.push(self.load_unit(quads.as_ref().map(|q| &q.0), p.a.v, at)?);
        }
        // Row `d` of the head's weights at this step: the same for every
        // lane, so each loads a share and broadcasts it.
        let sb = quads.as_ref().map(|(_, sb)| sb.clone());
        let ws = self.share_units(dk, sg, sb.as_ref(), p.b.v, &|d| {
            format!("({col0} + {d}) * {} + c * {}", u(p.b.cs), u(p.b.rs))
        })?;
        for (d, wv) in ws.iter().enumerate() {
            for (r, x) in xs.iter().enumerate() {
                let term = match quads {
                    Some(_) => format!("dot({x}, {wv})"),
                    None => format!("{x} * {wv}"),
                };
                self.body.stmt(format!("q{r}_{d} = q{r}_{d} + {term};"));
            }
        }
        self.memo.clear();
        self.body.stmt("}".into());
        let mut qs = vec![];
        for (r, row) in xrows.iter().enumerate() {
            let mut qr = vec![];
            for d in 0..dk {
                let acc = format!("q{r}_{d}");
                let qi = self
                    .body
                    .bind("u32", format!("{row} * {} + {col0} + {}", u(nq), u(d)));
                let y = self.with_addend(&acc, p.extra, &p.batch, p.nn, nq, &qi, DType::F32)?;
                if y != acc {
                    self.body.stmt(format!("{acc} = {y};"));
                }
                qr.push(acc);
            }
            qs.push(qr);
        }
        self.memo.clear();
        Ok(qs)
    }

    /// Head `hh`'s share of the output projection `p` (`O = M W^T`, the
    /// merge `M[b, i, h dv + e]` = this head's weighted sums `a / l`),
    /// added into `oacc` for each output column.
    fn project_output(&mut self, p: &Product, dv: usize, sg: usize, score: &Score) -> R<()> {
        let no = p.mm;
        let mut cs = vec![];
        for r in 0..ROWS {
            let l = score.denominator(&format!("l{r}"));
            let row: Vec<String> = (0..dv)
                .map(|e| self.body.bind("f32", format!("a{r}_{e} / {l}")))
                .collect();
            cs.push(row);
        }
        let kbase = self.body.bind("u32", format!("hh * {}", u(dv)));
        let sb = self.vec4_operand(&p.b, p.b.cs, p.b.rs, p.kk)?;
        let cv: Vec<Vec<String>> = match sb {
            Some(_) => cs
                .iter()
                .map(|row| {
                    row.chunks(4)
                        .map(|q| {
                            self.body
                                .bind("vec4<f32>", format!("vec4<f32>({})", q.join(", ")))
                        })
                        .collect()
                })
                .collect(),
            None => cs.clone(),
        };
        self.body
            .stmt(format!("for (var n = 0u; n < {}; n = n + 1u) {{", u(no)));
        let mut terms = vec![vec![]; ROWS];
        let step = if sb.is_some() { 4 } else { 1 };
        // Column `n`'s weights for this head, shared out as in
        // `share_tile`: the same for every lane.
        let ws = self.share_units(dv / step, sg, sb.as_ref(), p.b.v, &|q| {
            format!(
                "n * {} + ({kbase} + {q} * {}) * {}",
                u(p.b.cs),
                u(step),
                u(p.b.rs)
            )
        })?;
        for (q, wv) in ws.iter().enumerate() {
            for (r, t) in terms.iter_mut().enumerate() {
                t.push(match sb {
                    Some(_) => format!("dot({}, {wv})", cv[r][q]),
                    None => format!("{} * {wv}", cv[r][q]),
                });
            }
        }
        for (r, t) in terms.iter().enumerate() {
            let slot = format!("oacc[{} + n]", u(r * no));
            for chunk in t.chunks(8) {
                self.body
                    .stmt(format!("{slot} = {slot} + {};", chunk.join(" + ")));
            }
        }
        self.memo.clear();
        self.body.stmt("}".into());
        Ok(())
    }

    /// `units` loads every lane needs alike (vectors from `slot`, or
    /// elements of `x`), unit `i` at `at(i)`: each lane loads a share and
    /// `subgroupBroadcast` hands them to all (lavapipe loads memory lane
    /// by lane, whatever the address). Returns the units, in order.
    fn share_units(
        &mut self,
        units: usize,
        sg: usize,
        slot: Option<&Slot>,
        x: ValueId,
        at: &dyn Fn(&str) -> String,
    ) -> R<Vec<String>> {
        let ty = if slot.is_some() { "vec4<f32>" } else { "f32" };
        let mut loaded = vec![];
        for u0 in (0..units).step_by(sg) {
            let e = self
                .body
                .bind("u32", format!("min(lane + {}, {})", u(u0), u(units - 1)));
            let i = self.body.bind("u32", at(&e));
            let val = match slot {
                Some(s) => super::matmul::vec4_at(s, &i),
                None => {
                    let x0 = self.value_at(x, &i)?;
                    cast(&x0, self.meta(x).dtype, DType::F32)
                }
            };
            loaded.push(self.body.bind(ty, val));
        }
        if sg == 1 {
            return Ok(loaded);
        }
        Ok((0..units)
            .map(|i| {
                self.body.bind(
                    ty,
                    format!("subgroupBroadcast({}, {})", loaded[i / sg], u(i % sg)),
                )
            })
            .collect())
    }

    /// The output projection's rows (`oacc` plus its bias) stored as its
    /// result `r_out` (through its epilogue, `Gen::store_to`).
    fn store_projection(
        &mut self,
        p: &Product,
        r_out: ValueId,
        rows: &[(String, String)],
        sq: usize,
    ) -> R<()> {
        let no = p.mm;
        for (r, (i, _)) in rows.iter().enumerate() {
            self.body.stmt(format!("if ({i} < {}) {{", u(sq)));
            self.body
                .stmt(format!("for (var n = 0u; n < {}; n = n + 1u) {{", u(no)));
            let oi = self
                .body
                .bind("u32", format!("(wid.y * {} + {i}) * {} + n", u(sq), u(no)));
            let acc = self.body.bind("f32", format!("oacc[{} + n]", u(r * no)));
            self.store_projected(p, r_out, &oi, &acc)?;
            self.body.stmt("}".into());
            self.body.stmt("}".into());
            self.memo.clear();
        }
        Ok(())
    }

    /// Element `oi` of the output projection `p` (accumulated in `acc`)
    /// stored as its result `r_out`, through its bias and epilogue.
    fn store_projected(&mut self, p: &Product, r_out: ValueId, oi: &str, acc: &str) -> R<()> {
        let y = self.with_addend(acc, p.extra, &p.batch, p.nn, p.mm, oi, DType::F32)?;
        self.store_to(r_out, oi, &y)
    }

    /// A step's tile of K (`keys`: as [d, j], `width` = dk) or V (as
    /// [j, c], `width` = dv), `STEP` keys from `j0`, loaded a share a
    /// lane and broadcast: element `[jj][d]` of the result holds key
    /// `j0 + jj`'s element `d` in every lane (V: zero past the last key).
    #[allow(clippy::too_many_arguments)]
    fn share_tile(
        &mut self,
        x: &Operand,
        share: Share,
        keys: bool,
        width: usize,
        sk: usize,
        off: &str,
        sg: usize,
    ) -> R<Vec<Vec<String>>> {
        let (rs_j, rs_d) = if keys { (x.cs, x.rs) } else { (x.rs, x.cs) };
        let dt = self.meta(x.v).dtype;
        // Units a tile holds, the elements of each.
        let (units, per) = match share {
            Share::Keys(_) => (width, 4),
            Share::Rows(_) => (STEP * width / 4, 4),
            Share::Elements => (STEP * width, 1),
        };
        let mut loaded = vec![];
        for u0 in (0..units).step_by(sg) {
            let e = self
                .body
                .bind("u32", format!("min(lane + {}, {})", u(u0), u(units - 1)));
            let (at, jj) = match share {
                Share::Keys(_) => (format!("{e} * {} + j0", u(rs_d)), None),
                Share::Rows(_) => {
                    let quads = width / 4;
                    let jj = self.body.bind("u32", format!("{e} / {}", u(quads)));
                    (
                        format!(
                            "min(j0 + {jj}, {}) * {} + ({e} % {}) * 4u",
                            u(sk - 1),
                            u(rs_j),
                            u(quads)
                        ),
                        Some(jj),
                    )
                }
                Share::Elements => {
                    let jj = self.body.bind("u32", format!("{e} / {}", u(width)));
                    (
                        format!(
                            "min(j0 + {jj}, {}) * {} + ({e} % {}) * {}",
                            u(sk - 1),
                            u(rs_j),
                            u(width),
                            u(rs_d)
                        ),
                        Some(jj),
                    )
                }
            };
            let at = self.body.bind("u32", format!("{off} + {at}"));
            let val = match &share {
                Share::Keys(s) | Share::Rows(s) => super::matmul::vec4_at(s, &at),
                Share::Elements => {
                    let x = self.value_at(x.v, &at)?;
                    cast(&x, dt, DType::F32)
                }
            };
            let ty = if per == 4 { "vec4<f32>" } else { "f32" };
            // Past the last key: zeros (a value's weight is 0 there, but
            // 0 * inf would not be).
            let val = match jj.filter(|_| !keys && !sk.is_multiple_of(STEP)) {
                Some(jj) => format!("select({ty}(0.0), {val}, j0 + {jj} < {})", u(sk)),
                None => val,
            };
            loaded.push(self.body.bind(ty, val));
        }
        self.memo.clear();
        let mut out = vec![vec![String::new(); width]; STEP];
        for unit in 0..units {
            let src = &loaded[unit / sg];
            let b = match sg {
                1 => src.clone(),
                _ => self.body.bind(
                    if per == 4 { "vec4<f32>" } else { "f32" },
                    format!("subgroupBroadcast({src}, {})", u(unit % sg)),
                ),
            };
            for (c, comp) in COMP.iter().enumerate().take(per) {
                let el = if per == 4 {
                    format!("{b}.{comp}")
                } else {
                    b.clone()
                };
                let (jj, d) = match share {
                    Share::Keys(_) => (c, unit),
                    Share::Rows(_) => (unit / (width / 4), (unit % (width / 4)) * 4 + c),
                    Share::Elements => (unit / width, unit % width),
                };
                out[jj][d] = el;
            }
        }
        Ok(out)
    }
}

/// Vector components by lane.
const COMP: [&str; 4] = ["x", "y", "z", "w"];
