//! Attention as one kernel: `O = softmax(f(Q K)) V` with `f` elementwise
//! (scale, mask), `Fused::Attention`. Each invocation owns one query row;
//! the workgroup (rows of one batch entry) walks the keys in tiles staged
//! through workgroup memory, with an online softmax (running maximum and
//! sum, accumulator rescaled per tile), so neither the scores nor the
//! probabilities reach memory.

use super::matmul::Operand;
use super::template::{self, Env};
use super::*;

/// Keys per tile.
const KEYS: usize = 16;

/// Invocations sharing a query row where the device has subgroups.
const LANES: usize = 4;

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
        let lanes = match self.subgroup {
            Some(sg) if sg >= LANES && dk % LANES == 0 && dv % LANES == 0 => LANES,
            _ => 1,
        };
        // Query rows a workgroup, and its invocations.
        let wq = rows_per_workgroup(sq, self.workgroup / lanes as u32);
        let w = wq * lanes;
        let unroll = KEYS * (dk + dv) <= 1024;
        let keys_at = if unroll {
            (0..KEYS).map(u).collect()
        } else {
            vec!["jj".to_string()]
        };
        let mut env = Env::default()
            .n("keys", KEYS)
            .n("ks_len", KEYS * dk)
            .n("vs_len", KEYS * dv)
            .n("dk", dk)
            .n("dv", dv)
            .n("dkl", dk / lanes)
            .n("dvl", dv / lanes)
            .n("lanes", lanes)
            .l(
                "lane_masks",
                (0..lanes.trailing_zeros()).map(|b| u(1 << b)).collect(),
            )
            .s("w", u(w))
            .s("wq", u(wq))
            .s("sq", u(sq))
            .s("sq_last", u(sq - 1))
            .s("sk", u(sk))
            .s("sk_last", u(sk - 1))
            .s("sq_sk", u(sq * sk))
            .s("sq_dv", u(sq * dv))
            .s("ninf", literal(f64::NEG_INFINITY, DType::F32))
            .b("unroll", unroll)
            .l("keys_at", keys_at);
        for d in 0..dk.max(dv) {
            env = env.n(&format!("dl{d}"), d * lanes);
        }
        let mut holes = |gen: &mut Self, hole: &str, args: &[String], env: &mut Env| -> R<()> {
            match hole {
                "offsets" => {
                    gen.batch_offsets(&batch, &[("qoff", &q), ("koff", &k), ("voff", &v)], env)
                }
                "load_q" => gen.load_query(&q, dk, lanes, &env.get("qoff")?)?,
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
                    let y = cast(&format!("(acc[{c}] / l)"), DType::F32, gen.meta(o).dtype);
                    gen.store_to(o, &env.get("oi")?, &y)?;
                }
                "forget" => gen.memo.clear(),
                _ => return Err(bug(format!("attention template: no hole `{hole}`"))),
            }
            Ok(())
        };
        template::ATTENTION.render(self, &mut env, &mut holes)?;
        let grid = [sq.div_ceil(wq) as u32, nb as u32, 1];
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
