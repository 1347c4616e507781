//! Random programs of views, in-place ops and elementwise ops, for property
//! tests and benchmarks. Every statement goes through `Graph::call`, so a
//! program is always well-typed; calls the op table refuses are skipped.
//!
//! Choices come from a [`Choices`] source: a seeded generator for
//! benchmarks, or a list proptest can shrink.

use crate::dtype::DType;
use crate::graph::{Graph, ValueId};
use crate::meta::Meta;
use crate::ops;
use crate::schema::Arg;

/// Where the generator's decisions come from.
pub trait Choices {
    /// A number in `0..n` (`n > 0`).
    fn pick(&mut self, n: usize) -> usize;
}

/// SplitMix64: small, fast, deterministic.
pub struct Seeded(pub u64);

impl Choices for Seeded {
    fn pick(&mut self, n: usize) -> usize {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        ((z ^ (z >> 31)) % n as u64) as usize
    }
}

/// A fixed list of choices (then zeros): what proptest generates and
/// shrinks.
pub struct Listed<'a> {
    pub list: &'a [u32],
    pub pos: usize,
}

impl Choices for Listed<'_> {
    fn pick(&mut self, n: usize) -> usize {
        let v = self.list.get(self.pos).copied().unwrap_or(0) as usize;
        self.pos += 1;
        v % n
    }
}

struct Gen<'c, C: Choices> {
    c: &'c mut C,
    g: Graph,
    /// Values and how many view steps separate each from a fresh tensor.
    vals: Vec<(ValueId, usize)>,
    /// Which storage each value lives in, to skip writes eager refuses.
    storage: std::collections::HashMap<ValueId, usize>,
    opts: Options,
}

/// What random programs may contain beyond the default mix.
#[derive(Clone, Copy, Debug)]
pub struct Options {
    /// Constructs eager PyTorch runs but its functionalize refuses (so
    /// programs for comparing with it leave them out): `as_strided` (it
    /// refuses a mutation through one, and one past a view's own bounds),
    /// `unfold` windows that overlap (it refuses mutating a tensor with
    /// internal overlap) and `view` (in `mutations` mode its result can
    /// have another layout than eager's, where a later `view` fails;
    /// `reshape` stands in).
    pub torch_refusals: bool,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            torch_refusals: true,
        }
    }
}

const SHAPES: [&[usize]; 6] = [&[4, 6], &[6], &[2, 3, 4], &[4, 1], &[3, 3], &[1, 6]];
const MAX_DEPTH: usize = 6;
const MAX_NUMEL: usize = 256;

impl<C: Choices> Gen<'_, C> {
    fn pick(&mut self, n: usize) -> usize {
        self.c.pick(n)
    }

    fn int(&mut self, lo: i64, hi: i64) -> i64 {
        lo + self.pick((hi - lo + 1).max(1) as usize) as i64
    }

    /// A recent value more often than an old one.
    fn value(&mut self) -> (ValueId, usize) {
        let n = self.vals.len();
        let back = if self.pick(4) == 0 {
            self.pick(n)
        } else {
            self.pick(n.min(6))
        };
        self.vals[n - 1 - back]
    }

    fn meta(&self, v: ValueId) -> Meta {
        self.g.meta(v).clone()
    }

    fn storage_of(&mut self, v: ValueId) -> usize {
        let n = self.storage.len();
        *self.storage.entry(v).or_insert(n)
    }

    fn aliases_input(&self, id: ops::OpId, args: &[Arg<ValueId>]) -> bool {
        let ops::Rule::ViewOrCopy(rule) = &id.def().rule else {
            return false;
        };
        let metas: Vec<Arg<&Meta>> = args
            .iter()
            .map(|a| a.map(&mut |v| self.g.meta(*v)))
            .collect();
        rule(&metas).is_ok_and(|(_, aliases)| aliases)
    }

    fn call(&mut self, op: &str, args: Vec<Arg<ValueId>>, depth: usize) {
        use ops::OpKind::*;
        let id = ops::lookup(op).expect("generator uses table ops");
        let kind = id.def().kind;
        let this = match args.first() {
            Some(Arg::Tensor(v)) => Some(*v),
            _ => None,
        };
        if let (Some(t), ops::Rule::InPlace(f)) = (this, &id.def().rule) {
            // Skip writes whose result would depend on visiting order.
            let s = self.storage_of(t);
            for a in &args[1..] {
                for &o in a.tensors() {
                    let hazard =
                        ops::write_hazard(self.g.meta(t), self.g.meta(o), ops::reads_gathered(*f));
                    if self.storage_of(o) == s && hazard {
                        return;
                    }
                }
            }
        }
        let aliases = matches!(kind, View | MultiView | InPlace)
            || (kind == ViewOrCopy && self.aliases_input(id, &args));
        let Ok(res) = self.g.call(id, &args) else {
            return;
        };
        for r in res {
            match (aliases, this) {
                (true, Some(t)) => {
                    let s = self.storage_of(t);
                    self.storage.insert(r, s);
                }
                _ => {
                    self.storage_of(r);
                }
            }
            let d = match kind {
                View | MultiView | ViewOrCopy => depth + 1,
                InPlace => depth,
                _ => 0,
            };
            // Only small values are reused, so tensors do not grow with the
            // program (chained expands would) and costs stay linear.
            let numel = self.g.meta(r).numel();
            if numel > 0 && numel <= MAX_NUMEL {
                self.vals.push((r, d));
            }
        }
    }

    fn dim(&mut self, m: &Meta) -> i64 {
        let n = m.dim().max(1) as i64;
        self.int(-n, n - 1)
    }

    fn scalar(&mut self) -> Arg<ValueId> {
        match self.pick(3) {
            0 => Arg::Int(self.int(-2, 3)),
            _ => Arg::Float([0.5, -1.5, 2.0, 0.25][self.pick(4)]),
        }
    }

    fn view_step(&mut self, v: ValueId, depth: usize) {
        let m = self.meta(v);
        let t = Arg::Tensor(v);
        let il = |l: Vec<i64>| Arg::IntList(l);
        match self.pick(15) {
            0 => {
                let n = m.numel() as i64;
                let a = [1, 2, 3, 4, 6]
                    .into_iter()
                    .filter(|d| n % d == 0)
                    .collect::<Vec<i64>>();
                let k = a[self.pick(a.len())];
                let op = if self.pick(2) == 0 && self.opts.torch_refusals {
                    "view"
                } else {
                    "reshape"
                };
                self.call(op, vec![t, il(vec![k, -1])], depth);
            }
            1 => {
                let (d, s, e, st) = (
                    self.dim(&m),
                    self.int(-2, 2),
                    self.int(-1, 6),
                    self.int(1, 3),
                );
                self.call(
                    "slice",
                    vec![t, Arg::Int(d), Arg::Int(s), Arg::Int(e), Arg::Int(st)],
                    depth,
                );
            }
            2 => {
                let (d, i) = (self.dim(&m), self.int(-2, 2));
                self.call("select", vec![t, Arg::Int(d), Arg::Int(i)], depth);
            }
            3 => {
                let (a, b) = (self.dim(&m), self.dim(&m));
                self.call("transpose", vec![t, Arg::Int(a), Arg::Int(b)], depth);
            }
            4 => self.call("t", vec![t], depth),
            5 => {
                let mut p: Vec<i64> = (0..m.dim() as i64).collect();
                if p.len() > 1 {
                    let i = self.pick(p.len());
                    p.swap(0, i);
                }
                self.call("permute", vec![t, il(p)], depth);
            }
            6 => {
                let mut s: Vec<i64> = m
                    .sizes
                    .iter()
                    .map(|&x| if x == 1 { 3 } else { x as i64 })
                    .collect();
                if self.pick(2) == 0 {
                    s.insert(0, 2);
                }
                self.call("expand", vec![t, il(s)], depth);
            }
            7 => {
                let o = self.int(-1, 1);
                self.call("diagonal", vec![t, Arg::Int(o)], depth);
            }
            8 => {
                let d = self.int(0, m.dim() as i64);
                self.call("unsqueeze", vec![t, Arg::Int(d)], depth);
            }
            9 => self.call("squeeze", vec![t], depth),
            10 => {
                let (d, s, l) = (self.dim(&m), self.int(-2, 1), self.int(0, 2));
                self.call(
                    "narrow",
                    vec![t, Arg::Int(d), Arg::Int(s), Arg::Int(l)],
                    depth,
                );
            }
            11 => {
                let (d, size, mut step) = (self.dim(&m), self.int(1, 2), self.int(1, 2));
                if !self.opts.torch_refusals {
                    step = step.max(size);
                }
                self.call(
                    "unfold",
                    vec![t, Arg::Int(d), Arg::Int(size), Arg::Int(step)],
                    depth,
                );
            }
            12 => {
                let (d, k) = (self.dim(&m), self.int(1, 3));
                let op = ["split", "chunk"][self.pick(2)];
                self.call(op, vec![t, Arg::Int(k), Arg::Int(d)], depth);
            }
            13 => {
                let d = self.dim(&m);
                self.call("unbind", vec![t, Arg::Int(d)], depth);
            }
            _ => {
                // A window of the storage, addressed in storage coordinates.
                let len = m.storage_numel as i64;
                let n = self.int(1, 3.min(len));
                let off = self.int(0, len - n);
                if self.pick(2) == 0 && self.opts.torch_refusals {
                    self.call(
                        "as_strided",
                        vec![t, il(vec![n]), il(vec![1]), Arg::Int(off)],
                        depth,
                    );
                } else {
                    self.call("alias", vec![t], depth);
                }
            }
        }
    }

    fn mutation(&mut self, v: ValueId, depth: usize) {
        let t = Arg::Tensor(v);
        match self.pick(9) {
            0..=2 => {
                let op = ["add_", "mul_", "sub_", "div_"][self.pick(4)];
                let other = if self.pick(2) == 0 {
                    self.scalar()
                } else {
                    Arg::Tensor(self.value().0)
                };
                self.call(op, vec![t, other], depth);
            }
            3 => {
                let s = self.scalar();
                self.call("fill_", vec![t, s], depth);
            }
            4 => self.call("zero_", vec![t], depth),
            5 => {
                let src = self.value().0;
                self.call("copy_", vec![t, Arg::Tensor(src)], depth);
            }
            6 => {
                let (mv, _) = self.value();
                let id = ops::lookup("gt").unwrap();
                if let Ok(mask) = self.g.call(id, &[Arg::Tensor(mv), Arg::Float(0.0)]) {
                    let s = self.scalar();
                    self.call("masked_fill_", vec![t, Arg::Tensor(mask[0]), s], depth);
                }
            }
            7 => {
                let op = ["neg_", "relu_", "tanh_", "abs_"][self.pick(4)];
                self.call(op, vec![t], depth);
            }
            _ => {
                let (lo, hi) = (Arg::Float(-0.5), Arg::Float(1.0));
                self.call("clamp_", vec![t, lo, hi], depth);
            }
        }
    }

    fn functional(&mut self, v: ValueId) {
        let t = Arg::Tensor(v);
        match self.pick(9) {
            0 | 1 => {
                let op = ["add", "mul", "sub", "maximum"][self.pick(4)];
                let other = Arg::Tensor(self.value().0);
                self.call(op, vec![t, other], 0);
            }
            2 => {
                let s = self.scalar();
                self.call("mul", vec![t, s], 0);
            }
            3 => {
                let op = ["exp", "tanh", "sigmoid", "neg", "relu"][self.pick(5)];
                self.call(op, vec![t], 0);
            }
            4 => {
                let op = ["clone", "contiguous"][self.pick(2)];
                self.call(op, vec![t], 0);
            }
            5 => {
                let m = self.meta(v);
                let d = self.dim(&m);
                let keep = Arg::Bool(self.pick(2) == 0);
                self.call("sum", vec![t, Arg::IntList(vec![d]), keep], 0);
            }
            6 => {
                // Joins of this value with itself or another of its shape.
                let m = self.meta(v);
                let (w, _) = self.value();
                let w = if self.meta(w).sizes == m.sizes { w } else { v };
                let d = self.dim(&m);
                let list = Arg::TensorList(vec![Some(v), Some(w)]);
                let op = ["cat", "stack"][self.pick(2)];
                self.call(op, vec![list, Arg::Int(d)], 0);
            }
            7 => {
                let m = self.meta(v);
                match self.pick(4) {
                    0 if m.dim() >= 2 => {
                        let op = ["tril", "triu"][self.pick(2)];
                        let k = Arg::Int(self.pick(3) as i64 - 1);
                        self.call(op, vec![t, k], 0);
                    }
                    1 => self.call("_to_copy", vec![t, Arg::Dtype(crate::DType::F16)], 0),
                    _ => self.call("silu", vec![t], 0),
                }
            }
            _ => {
                let (a, _) = self.value();
                let id = ops::lookup("lt").unwrap();
                if let Ok(c) = self.g.call(id, &[Arg::Tensor(a), Arg::Float(0.5)]) {
                    self.call("where", vec![Arg::Tensor(c[0]), t, Arg::Float(-1.0)], 0);
                }
            }
        }
    }
}

impl<C: Choices> Gen<'_, C> {
    /// i64 indices in range by construction (a sort or an argmax of a
    /// value of `v`'s shape) feeding the index ops, functional or in place
    /// (through whatever views `v` is).
    fn selection(&mut self, v: ValueId, depth: usize) {
        let m = self.meta(v);
        if m.dim() == 0 || m.numel() == 0 {
            return;
        }
        let d = self.dim(&m);
        let (w, _) = self.value();
        let w = if self.meta(w).sizes == m.sizes { w } else { v };
        let t = Arg::Tensor(v);
        let sort = ops::lookup("sort").unwrap();
        let desc = Arg::Bool(self.pick(2) == 0);
        let Ok(sorted) = self.g.call(sort, &[Arg::Tensor(w), Arg::Int(d), desc]) else {
            return;
        };
        let idx = Arg::Tensor(sorted[1]);
        self.vals.push((sorted[0], 0));
        match self.pick(7) {
            0 => self.call("gather", vec![t, Arg::Int(d), idx], 0),
            1 => self.call("take_along_dim", vec![t, idx, Arg::Int(d)], 0),
            2 => {
                let op = ["scatter", "scatter_add"][self.pick(2)];
                self.call(op, vec![t, Arg::Int(d), idx, Arg::Tensor(w)], 0);
            }
            3 => {
                let op = ["scatter_", "scatter_add_"][self.pick(2)];
                self.call(op, vec![t, Arg::Int(d), idx, Arg::Tensor(w)], depth);
            }
            4 => {
                let op = ["argmax", "argmin"][self.pick(2)];
                let keep = Arg::Bool(self.pick(2) == 0);
                self.call(op, vec![t, Arg::Int(d), keep], 0);
            }
            5 => {
                let op = ["max", "min"][self.pick(2)];
                self.call(op, vec![t, Arg::Int(d), Arg::Bool(false)], 0);
            }
            _ => {
                // A row permutation written back row by row.
                let len = m.sizes[crate::meta::wrap_dim(d, m.dim()).unwrap_or(0)];
                let ar = ops::lookup("arange").unwrap();
                let Ok(r) = self.g.call(ar, &[Arg::Int(len as i64)]) else {
                    return;
                };
                let flip = ops::lookup("flip").unwrap();
                let Ok(p) = self
                    .g
                    .call(flip, &[Arg::Tensor(r[0]), Arg::IntList(vec![0])])
                else {
                    return;
                };
                let op = ["index_copy", "index_copy_"][self.pick(2)];
                self.call(
                    op,
                    vec![t, Arg::Int(d), Arg::Tensor(p[0]), Arg::Tensor(w)],
                    depth,
                );
            }
        }
    }
}

/// A random program over 1-3 f32 (now and then i64) parameters with about `statements`
/// statements (views, in-place and elementwise ops mixed), returning a few
/// of its values.
pub fn random_program(c: &mut impl Choices, statements: usize) -> Graph {
    random_program_with(c, statements, Options::default())
}

/// `random_program` with `opts` saying what it may contain.
pub fn random_program_with(c: &mut impl Choices, statements: usize, opts: Options) -> Graph {
    let mut gen = Gen {
        c,
        g: Graph::new("random"),
        vals: vec![],
        storage: Default::default(),
        opts,
    };
    let n_inputs = 1 + gen.pick(3);
    for i in 0..n_inputs {
        let shape = SHAPES[gen.pick(SHAPES.len())].to_vec();
        // Now and then an i64 parameter (small integers), PyTorch's index
        // and default integer type.
        let dtype = if i > 0 && gen.pick(4) == 0 {
            DType::I64
        } else {
            DType::F32
        };
        let v = gen
            .g
            .add_input(Some(format!("x{i}").into()), Meta::contiguous(dtype, shape));
        gen.vals.push((v, 0));
    }
    // Calls the op table refuses add nothing: bound the attempts.
    let mut attempts = 0;
    while gen.g.order.len() < statements && attempts < 20 * statements + 100 {
        attempts += 1;
        let (v, depth) = gen.value();
        match gen.pick(10) {
            0..=3 if depth < MAX_DEPTH => gen.view_step(v, depth),
            4..=6 => gen.mutation(v, depth),
            7 if gen.pick(3) == 0 => gen.selection(v, depth),
            _ => gen.functional(v),
        }
        // Keep the pool small, so values are reused and chains stay short.
        if gen.vals.len() > 64 {
            gen.vals.drain(..32);
        }
    }
    let n = gen.vals.len();
    let k = 1 + gen.pick(3.min(n));
    gen.g.outputs = gen.vals[n - k..].iter().map(|v| v.0).collect();
    gen.g
}

/// Deterministic inputs for `g`'s parameters: values uniform in
/// `[-scale, scale)` (multiples of `scale / 1000`).
pub fn random_inputs(g: &Graph, seed: u64, scale: f64) -> Vec<crate::RTensor> {
    let mut s = seed;
    g.inputs
        .iter()
        .map(|&v| {
            let m = g.meta(v);
            let vals: Vec<f64> = (0..m.numel())
                .map(|_| {
                    s = s
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    (((s >> 33) % 2000) as f64 / 1000.0 - 1.0) * scale
                })
                .collect();
            crate::RTensor::new(m.dtype, m.sizes.to_vec(), &vals)
        })
        .collect()
}
