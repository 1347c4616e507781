//! What derivative, tangent and batching rules and custom functions are
//! written against, below the op table that declares them: the call a
//! rule sees (`Call`), where it emits ops (`Emit`: a program under
//! construction; `Batch`: a batched one), and the small vocabulary rules
//! are written in (`sum_to`, `fit`, `materialize`, ...). The transforms
//! implement `Emit` and `Batch` (`transform::emit::Emitter`,
//! `transform::Batcher`), so the table needs nothing from them.

use crate::dtype::DType;
use crate::id::{OpId, Results, ValueId};
use crate::meta::Meta;
use crate::schema::Arg;
use rustc_hash::FxHashMap as HashMap;

pub type R<T> = Result<T, String>;

/// Shorthands for arguments.
pub fn t(v: ValueId) -> Arg<ValueId> {
    Arg::Tensor(v)
}
pub fn int(i: i64) -> Arg<ValueId> {
    Arg::Int(i)
}
pub fn ints(l: &[i64]) -> Arg<ValueId> {
    Arg::IntList(l.to_vec())
}
pub fn float(x: f64) -> Arg<ValueId> {
    Arg::Float(x)
}
pub fn sizes_arg(s: &[usize]) -> Arg<ValueId> {
    Arg::IntList(s.iter().map(|&x| x as i64).collect())
}

/// Where a rule emits ops: every helper emits ATen ops of the table by
/// name, so rules stay readable programs.
pub trait Emit {
    fn meta(&self, v: ValueId) -> &Meta;

    /// `op(args)`, all results.
    fn call_id(&mut self, op: OpId, args: Vec<Arg<ValueId>>) -> R<Results>;

    /// `name(args)`, all results.
    fn call_all(&mut self, name: &str, args: Vec<Arg<ValueId>>) -> R<Results>;

    fn sizes(&self, v: ValueId) -> Vec<usize> {
        self.meta(v).sizes.to_vec()
    }

    fn dtype(&self, v: ValueId) -> DType {
        self.meta(v).dtype
    }

    fn rank(&self, v: ValueId) -> usize {
        self.meta(v).dim()
    }

    /// `name(args)`, its only result.
    fn call(&mut self, name: &str, args: Vec<Arg<ValueId>>) -> R<ValueId> {
        Ok(self.call_all(name, args)?[0])
    }

    fn add(&mut self, a: ValueId, b: ValueId) -> R<ValueId> {
        self.call("add", vec![t(a), t(b)])
    }
    fn sub(&mut self, a: ValueId, b: ValueId) -> R<ValueId> {
        self.call("sub", vec![t(a), t(b)])
    }
    fn mul(&mut self, a: ValueId, b: ValueId) -> R<ValueId> {
        self.call("mul", vec![t(a), t(b)])
    }
    fn div(&mut self, a: ValueId, b: ValueId) -> R<ValueId> {
        self.call("div", vec![t(a), t(b)])
    }
    fn neg(&mut self, a: ValueId) -> R<ValueId> {
        self.call("neg", vec![t(a)])
    }
    /// `a * s` for a Python scalar `s` (keeps `a`'s dtype); `a` itself for 1.
    fn scale(&mut self, a: ValueId, s: f64) -> R<ValueId> {
        if s == 1.0 {
            return Ok(a);
        }
        self.call("mul", vec![t(a), float(s)])
    }
    fn add_scalar(&mut self, a: ValueId, s: f64) -> R<ValueId> {
        self.call("add", vec![t(a), float(s)])
    }
    /// `s - a` for a Python scalar `s`.
    fn rsub_scalar(&mut self, s: f64, a: ValueId) -> R<ValueId> {
        let n = self.neg(a)?;
        self.add_scalar(n, s)
    }
    fn where_(&mut self, c: ValueId, a: ValueId, b: ValueId) -> R<ValueId> {
        self.call("where", vec![t(c), t(a), t(b)])
    }
    /// `where(c, a, 0)` (in `a`'s dtype).
    fn keep_where(&mut self, c: ValueId, a: ValueId) -> R<ValueId> {
        self.call("where", vec![t(c), t(a), float(0.0)])
    }

    /// `a + b` where either may be structurally zero.
    fn add_opt(&mut self, a: Option<ValueId>, b: Option<ValueId>) -> R<Option<ValueId>> {
        Ok(match (a, b) {
            (Some(a), Some(b)) => Some(self.add(a, b)?),
            (x, None) | (None, x) => x,
        })
    }

    fn zeros(&mut self, sizes: &[usize], dtype: DType) -> R<ValueId> {
        self.call("zeros", vec![sizes_arg(sizes), Arg::Dtype(dtype)])
    }
    fn zeros_like(&mut self, v: ValueId) -> R<ValueId> {
        let (s, d) = (self.sizes(v), self.dtype(v));
        self.zeros(&s, d)
    }
    /// `v`, or zeros shaped like `like` where `v` is structurally zero.
    fn or_zeros(&mut self, v: Option<ValueId>, like: ValueId) -> R<ValueId> {
        match v {
            Some(v) => Ok(v),
            None => self.zeros_like(like),
        }
    }

    fn view(&mut self, v: ValueId, sizes: &[usize]) -> R<ValueId> {
        if self.sizes(v) == sizes {
            return Ok(v);
        }
        self.call("view_copy", vec![t(v), sizes_arg(sizes)])
    }
    fn expand(&mut self, v: ValueId, sizes: &[usize]) -> R<ValueId> {
        if self.sizes(v) == sizes {
            return Ok(v);
        }
        self.call("expand_copy", vec![t(v), sizes_arg(sizes)])
    }
    fn transpose(&mut self, v: ValueId, d0: i64, d1: i64) -> R<ValueId> {
        self.call("transpose_copy", vec![t(v), int(d0), int(d1)])
    }
    fn permute(&mut self, v: ValueId, perm: &[usize]) -> R<ValueId> {
        if perm.iter().enumerate().all(|(i, &p)| i == p) {
            return Ok(v);
        }
        let p: Vec<i64> = perm.iter().map(|&x| x as i64).collect();
        self.call("permute_copy", vec![t(v), ints(&p)])
    }
    fn unsqueeze(&mut self, v: ValueId, d: i64) -> R<ValueId> {
        self.call("unsqueeze_copy", vec![t(v), int(d)])
    }
    /// `sum(v, dims, keepdim)`; `v` itself when `dims` is empty.
    fn sum_dims(&mut self, v: ValueId, dims: &[usize], keepdim: bool) -> R<ValueId> {
        if dims.is_empty() {
            return Ok(v);
        }
        let d: Vec<i64> = dims.iter().map(|&x| x as i64).collect();
        self.call("sum", vec![t(v), ints(&d), Arg::Bool(keepdim)])
    }
    fn cast(&mut self, v: ValueId, dtype: DType) -> R<ValueId> {
        if self.dtype(v) == dtype {
            return Ok(v);
        }
        self.call("_to_copy", vec![t(v), Arg::Dtype(dtype)])
    }

    /// Reduces a gradient of a broadcast result to the shape and dtype of
    /// the operand that was broadcast (ATen's `sum_to_size`, then a cast).
    fn sum_to(&mut self, g: ValueId, sizes: &[usize], dtype: DType) -> R<ValueId> {
        let gs = self.sizes(g);
        let lead = gs.len().saturating_sub(sizes.len());
        let mut v = self.sum_dims(g, &(0..lead).collect::<Vec<_>>(), false)?;
        let ones: Vec<usize> = (0..sizes.len())
            .filter(|&i| sizes[i] == 1 && gs[lead + i] != 1)
            .collect();
        v = self.sum_dims(v, &ones, true)?;
        let v = self.view(v, sizes)?;
        self.cast(v, dtype)
    }
    /// `sum_to` the shape and dtype of `like`.
    fn sum_like(&mut self, g: ValueId, like: ValueId) -> R<ValueId> {
        let (s, d) = (self.sizes(like), self.dtype(like));
        self.sum_to(g, &s, d)
    }

    /// A tangent brought to the shape and dtype of `like` (broadcast up,
    /// or summed down where it is larger).
    fn fit(&mut self, v: ValueId, like: ValueId) -> R<ValueId> {
        let (s, d) = (self.sizes(like), self.dtype(like));
        let vs = self.sizes(v);
        let v = if vs != s && crate::meta::broadcast_shapes(&vs, &s).is_ok_and(|b| b[..] == s[..]) {
            self.expand(v, &s)?
        } else if vs != s {
            self.sum_to(v, &s, d)?
        } else {
            v
        };
        self.cast(v, d)
    }
}

/// A node as a rule sees it, in the graph being built: op, bound
/// arguments, results.
pub struct Call<'a> {
    pub op: OpId,
    pub overload: usize,
    pub args: &'a [Arg<ValueId>],
    pub outs: &'a [ValueId],
}

impl Call<'_> {
    /// The tensor in argument `i`.
    pub fn tensor(&self, i: usize) -> R<ValueId> {
        match self.args.get(i) {
            Some(Arg::Tensor(v)) => Ok(*v),
            _ => Err(format!(
                "internal error: argument {i} of {} is not a tensor",
                self.op.name()
            )),
        }
    }
    pub fn opt_tensor(&self, i: usize) -> Option<ValueId> {
        match self.args.get(i) {
            Some(Arg::Tensor(v)) => Some(*v),
            _ => None,
        }
    }
    /// The tensors of list argument `i` (`None` for absent entries).
    pub fn list(&self, i: usize) -> Vec<Option<ValueId>> {
        match self.args.get(i) {
            Some(Arg::TensorList(l)) => l.clone(),
            _ => vec![],
        }
    }
    /// The overload name of the schema that bound the call (`Tensor`,
    /// `Scalar`, `dim_IntList`, ... or empty).
    pub fn overload_name(&self) -> &'static str {
        &self.op.def().schemas[self.overload].overload
    }
}

/// Where a gradient goes: argument position, and the index in a tensor
/// list argument.
pub type Grads = Vec<(usize, Option<usize>, ValueId)>;

/// Tangents of a call's tensor arguments (`None`: structurally zero).
pub struct Tangents<'a> {
    map: &'a HashMap<ValueId, ValueId>,
    args: &'a [Arg<ValueId>],
}

impl<'a> Tangents<'a> {
    /// The tangents `map` gives the tensors of `args`.
    pub fn new(map: &'a HashMap<ValueId, ValueId>, args: &'a [Arg<ValueId>]) -> Self {
        Tangents { map, args }
    }
    pub fn get(&self, i: usize) -> Option<ValueId> {
        match self.args.get(i) {
            Some(Arg::Tensor(v)) => self.map.get(v).copied(),
            _ => None,
        }
    }
    pub fn get_in(&self, i: usize, j: usize) -> Option<ValueId> {
        match self.args.get(i) {
            Some(Arg::TensorList(l)) => l
                .get(j)
                .copied()
                .flatten()
                .and_then(|v| self.map.get(&v).copied()),
            _ => None,
        }
    }
}

/// `(emitter, call, gradient per result) -> gradients of the arguments`.
pub type VjpFn = fn(&mut dyn Emit, &Call, &[Option<ValueId>]) -> R<Grads>;
/// `(emitter, call, tangents of the arguments) -> tangent per result`.
pub type JvpFn = fn(&mut dyn Emit, &Call, &Tangents) -> R<Vec<Option<ValueId>>>;
/// `(batcher, call with batched arguments) -> results, batched or not`.
pub type BatchFn = fn(&mut dyn Batch, &Call) -> R<Vec<(ValueId, bool)>>;

/// Where a batching rule emits ops: a batched program whose values carry
/// the batch dimension at 0 or not at all. `call` runs an op's batching
/// rule when an argument is batched; `e` emits ops as they are.
pub trait Batch {
    /// The program being built, to emit unbatched ops into.
    fn e(&mut self) -> &mut dyn Emit;
    fn e_ref(&self) -> &dyn Emit;
    /// The batch size.
    fn size(&self) -> usize;
    fn is_batched(&self, v: ValueId) -> bool;
    /// Records whether `v` is batched; returns it.
    fn mark(&mut self, v: ValueId, batched: bool) -> ValueId;
    /// `op(args)`: the op itself when nothing is batched, else its rule.
    fn call_id(&mut self, op: OpId, args: Vec<Arg<ValueId>>) -> R<Vec<(ValueId, bool)>>;
    fn call_all(&mut self, name: &str, args: Vec<Arg<ValueId>>) -> R<Vec<(ValueId, bool)>>;

    /// `v`'s shape without the batch dimension.
    fn logical(&self, v: ValueId) -> Vec<usize> {
        let s = self.e_ref().sizes(v);
        if self.is_batched(v) {
            s[1..].to_vec()
        } else {
            s
        }
    }

    fn lrank(&self, v: ValueId) -> usize {
        self.logical(v).len()
    }

    /// `name(args)`, its only result.
    fn call(&mut self, name: &str, args: Vec<Arg<ValueId>>) -> R<ValueId> {
        Ok(self.call_all(name, args)?[0].0)
    }

    /// A batched value with the batch dimension at 0 (an unbatched one
    /// expanded to the batch size).
    fn materialize(&mut self, v: ValueId) -> R<ValueId> {
        if self.is_batched(v) {
            return Ok(v);
        }
        let mut s = self.e_ref().sizes(v);
        s.insert(0, 1);
        let u = self.e().view(v, &s)?;
        s[0] = self.size();
        let x = self.e().expand(u, &s)?;
        Ok(self.mark(x, true))
    }

    /// A batched `v` with its logical shape padded with leading 1s to
    /// `rank` (so it broadcasts against unbatched values as in the
    /// unbatched program); unbatched values as they are.
    fn align(&mut self, v: ValueId, rank: usize) -> R<ValueId> {
        let l = self.logical(v);
        if !self.is_batched(v) || l.len() >= rank {
            return Ok(v);
        }
        let mut s = vec![self.size()];
        s.extend(std::iter::repeat_n(1, rank - l.len()));
        s.extend(l);
        let x = self.e().view(v, &s)?;
        Ok(self.mark(x, true))
    }

    /// Moves dimension `from` of `v` to `to` (a `permute_copy`).
    fn movedim(&mut self, v: ValueId, from: usize, to: usize) -> R<ValueId> {
        let n = self.e_ref().rank(v);
        let mut perm: Vec<usize> = (0..n).filter(|&d| d != from).collect();
        perm.insert(to, from);
        self.e().permute(v, &perm)
    }
}
