//! Building a transformed program: calls by op name into a graph, with
//! common subexpressions emitted once, and the small vocabulary derivative
//! and batching rules are written in (`sum_to`, `expand_to`, ...). Every
//! helper emits ATen ops of the table, so rules stay readable programs.

use crate::dtype::DType;
use crate::graph::{Graph, Results, ValueId};
use crate::meta::Meta;
use crate::ops::{self, OpId};
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

/// A graph under construction with hash-consing: a call equal to an earlier
/// one (same op, same arguments) returns the earlier results.
pub struct Emitter {
    pub g: Graph,
    seen: HashMap<(OpId, String), Results>,
}

impl Emitter {
    pub fn new(name: &str) -> Emitter {
        Emitter {
            g: Graph::new(name),
            seen: HashMap::default(),
        }
    }

    /// Continues building `g` (common subexpressions are found among what
    /// is emitted from now on).
    pub fn wrap(g: Graph) -> Emitter {
        Emitter {
            g,
            seen: HashMap::default(),
        }
    }

    pub fn meta(&self, v: ValueId) -> &Meta {
        self.g.meta(v)
    }

    pub fn sizes(&self, v: ValueId) -> Vec<usize> {
        self.meta(v).sizes.to_vec()
    }

    pub fn dtype(&self, v: ValueId) -> DType {
        self.meta(v).dtype
    }

    pub fn rank(&self, v: ValueId) -> usize {
        self.meta(v).dim()
    }

    /// `op(args)`, all results.
    pub fn call_id(&mut self, op: OpId, args: Vec<Arg<ValueId>>) -> R<Results> {
        // Bit-exact floats: `Arg`'s Debug prints them exactly.
        let key = (op, format!("{args:?}"));
        if let Some(r) = self.seen.get(&key) {
            return Ok(r.clone());
        }
        let r = self
            .g
            .call(op, &args)
            .map_err(|e| format!("{}: {e}", op.name()))?;
        self.seen.insert(key, r.clone());
        Ok(r)
    }

    /// `name(args)`, all results.
    pub fn call_all(&mut self, name: &str, args: Vec<Arg<ValueId>>) -> R<Results> {
        let op = ops::lookup(name).ok_or_else(|| format!("internal error: no op {name}"))?;
        self.call_id(op, args)
    }

    /// `name(args)`, its only result.
    pub fn call(&mut self, name: &str, args: Vec<Arg<ValueId>>) -> R<ValueId> {
        Ok(self.call_all(name, args)?[0])
    }

    pub fn add(&mut self, a: ValueId, b: ValueId) -> R<ValueId> {
        self.call("add", vec![t(a), t(b)])
    }
    pub fn sub(&mut self, a: ValueId, b: ValueId) -> R<ValueId> {
        self.call("sub", vec![t(a), t(b)])
    }
    pub fn mul(&mut self, a: ValueId, b: ValueId) -> R<ValueId> {
        self.call("mul", vec![t(a), t(b)])
    }
    pub fn div(&mut self, a: ValueId, b: ValueId) -> R<ValueId> {
        self.call("div", vec![t(a), t(b)])
    }
    pub fn neg(&mut self, a: ValueId) -> R<ValueId> {
        self.call("neg", vec![t(a)])
    }
    /// `a * s` for a Python scalar `s` (keeps `a`'s dtype); `a` itself for 1.
    pub fn scale(&mut self, a: ValueId, s: f64) -> R<ValueId> {
        if s == 1.0 {
            return Ok(a);
        }
        self.call("mul", vec![t(a), float(s)])
    }
    pub fn add_scalar(&mut self, a: ValueId, s: f64) -> R<ValueId> {
        self.call("add", vec![t(a), float(s)])
    }
    /// `s - a` for a Python scalar `s`.
    pub fn rsub_scalar(&mut self, s: f64, a: ValueId) -> R<ValueId> {
        let n = self.neg(a)?;
        self.add_scalar(n, s)
    }
    pub fn where_(&mut self, c: ValueId, a: ValueId, b: ValueId) -> R<ValueId> {
        self.call("where", vec![t(c), t(a), t(b)])
    }
    /// `where(c, a, 0)` (in `a`'s dtype).
    pub fn keep_where(&mut self, c: ValueId, a: ValueId) -> R<ValueId> {
        self.call("where", vec![t(c), t(a), float(0.0)])
    }

    /// `a + b` where either may be structurally zero.
    pub fn add_opt(&mut self, a: Option<ValueId>, b: Option<ValueId>) -> R<Option<ValueId>> {
        Ok(match (a, b) {
            (Some(a), Some(b)) => Some(self.add(a, b)?),
            (x, None) | (None, x) => x,
        })
    }

    pub fn zeros(&mut self, sizes: &[usize], dtype: DType) -> R<ValueId> {
        self.call("zeros", vec![sizes_arg(sizes), Arg::Dtype(dtype)])
    }
    pub fn zeros_like(&mut self, v: ValueId) -> R<ValueId> {
        let (s, d) = (self.sizes(v), self.dtype(v));
        self.zeros(&s, d)
    }
    /// `v`, or zeros shaped like `like` where `v` is structurally zero.
    pub fn or_zeros(&mut self, v: Option<ValueId>, like: ValueId) -> R<ValueId> {
        match v {
            Some(v) => Ok(v),
            None => self.zeros_like(like),
        }
    }

    pub fn view(&mut self, v: ValueId, sizes: &[usize]) -> R<ValueId> {
        if self.sizes(v) == sizes {
            return Ok(v);
        }
        self.call("view_copy", vec![t(v), sizes_arg(sizes)])
    }
    pub fn expand(&mut self, v: ValueId, sizes: &[usize]) -> R<ValueId> {
        if self.sizes(v) == sizes {
            return Ok(v);
        }
        self.call("expand_copy", vec![t(v), sizes_arg(sizes)])
    }
    pub fn transpose(&mut self, v: ValueId, d0: i64, d1: i64) -> R<ValueId> {
        self.call("transpose_copy", vec![t(v), int(d0), int(d1)])
    }
    pub fn permute(&mut self, v: ValueId, perm: &[usize]) -> R<ValueId> {
        if perm.iter().enumerate().all(|(i, &p)| i == p) {
            return Ok(v);
        }
        let p: Vec<i64> = perm.iter().map(|&x| x as i64).collect();
        self.call("permute_copy", vec![t(v), ints(&p)])
    }
    pub fn unsqueeze(&mut self, v: ValueId, d: i64) -> R<ValueId> {
        self.call("unsqueeze_copy", vec![t(v), int(d)])
    }
    /// `sum(v, dims, keepdim)`; `v` itself when `dims` is empty.
    pub fn sum_dims(&mut self, v: ValueId, dims: &[usize], keepdim: bool) -> R<ValueId> {
        if dims.is_empty() {
            return Ok(v);
        }
        let d: Vec<i64> = dims.iter().map(|&x| x as i64).collect();
        self.call("sum", vec![t(v), ints(&d), Arg::Bool(keepdim)])
    }
    pub fn cast(&mut self, v: ValueId, dtype: DType) -> R<ValueId> {
        if self.dtype(v) == dtype {
            return Ok(v);
        }
        self.call("_to_copy", vec![t(v), Arg::Dtype(dtype)])
    }

    /// Reduces a gradient of a broadcast result to the shape and dtype of
    /// the operand that was broadcast (ATen's `sum_to_size`, then a cast).
    pub fn sum_to(&mut self, g: ValueId, sizes: &[usize], dtype: DType) -> R<ValueId> {
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
    pub fn sum_like(&mut self, g: ValueId, like: ValueId) -> R<ValueId> {
        let (s, d) = (self.sizes(like), self.dtype(like));
        self.sum_to(g, &s, d)
    }

    /// A tangent brought to the shape and dtype of `like` (broadcast up,
    /// or summed down where it is larger).
    pub fn fit(&mut self, v: ValueId, like: ValueId) -> R<ValueId> {
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
