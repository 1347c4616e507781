//! Tracing from Rust, the way `make_fx` traces Python: run a closure on
//! symbolic `Tensor`s and record every op into a graph.
//!
//! ```
//! use kiln_functionalize::{trace, DType, TensorSpec};
//! let g = trace("f", &[TensorSpec::new("x", DType::F32, &[2, 3])], |x| {
//!     let y = x[0].add(1.0);
//!     y.select(0, 1).mul_(2.0);
//!     vec![y]
//! })
//! .unwrap();
//! assert_eq!(g.order.len(), 3);
//! ```
//!
//! Ops record the same bound, type-checked nodes the text parser builds, so
//! tracing a closure and parsing the equivalent text give equal graphs. A
//! bad call does not panic: the first error is kept, later ops on its
//! result are skipped, and `trace` returns the error.

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::graph::{Graph, ValueId};
use crate::meta::Meta;
use crate::ops;
use crate::schema::Arg;
use std::cell::RefCell;
use std::rc::Rc;

/// A parameter of a traced program.
#[derive(Clone, Debug)]
pub struct TensorSpec {
    pub name: String,
    pub dtype: DType,
    pub sizes: Vec<usize>,
    /// Set for an input that shares another input's memory.
    pub view_of: Option<ViewOf>,
}

/// Where an aliasing input lives in its base input: element `i` (row-major
/// over the input's sizes) is the base's element `offset + Σ i_d strides_d`.
#[derive(Clone, Debug, PartialEq)]
pub struct ViewOf {
    pub base: String,
    pub strides: Vec<usize>,
    pub offset: usize,
}

impl TensorSpec {
    pub fn new(name: &str, dtype: DType, sizes: &[usize]) -> TensorSpec {
        TensorSpec {
            name: name.to_string(),
            dtype,
            sizes: sizes.to_vec(),
            view_of: None,
        }
    }

    /// An input that is a view of input `base` (a contiguous input of the
    /// same dtype, listed anywhere): the traced program takes only the
    /// base, and this input is `as_strided(base, sizes, strides, offset)`
    /// in it, so a write through one input shows in every input sharing
    /// its memory (a synthetic base, as in PyTorch's AOTAutograd).
    pub fn view(
        name: &str,
        base: &str,
        dtype: DType,
        sizes: &[usize],
        strides: &[usize],
        offset: usize,
    ) -> TensorSpec {
        TensorSpec {
            name: name.to_string(),
            dtype,
            sizes: sizes.to_vec(),
            view_of: Some(ViewOf {
                base: base.to_string(),
                strides: strides.to_vec(),
                offset,
            }),
        }
    }
}

struct State {
    graph: Graph,
    error: Option<Error>,
}

/// A traced tensor: a value of the graph being recorded.
#[derive(Clone)]
pub struct Tensor {
    state: Rc<RefCell<State>>,
    /// `None` once an earlier error poisoned this value.
    id: Option<ValueId>,
}

thread_local! {
    static CURRENT: RefCell<Option<Rc<RefCell<State>>>> = const { RefCell::new(None) };
}

/// Traces `f` over parameters `specs` into a graph named `name`.
pub fn trace(
    name: &str,
    specs: &[TensorSpec],
    f: impl FnOnce(&[Tensor]) -> Vec<Tensor>,
) -> Result<Graph> {
    let state = Rc::new(RefCell::new(State {
        graph: Graph::new(name),
        error: None,
    }));
    // Parameters: the inputs that are not views of another.
    let mut params: Vec<Option<ValueId>> = vec![None; specs.len()];
    for (i, s) in specs.iter().enumerate() {
        if s.view_of.is_none() {
            params[i] = Some(state.borrow_mut().graph.add_input(
                Some(s.name.as_str().into()),
                Meta::contiguous(s.dtype, s.sizes.clone()),
            ));
        }
    }
    let mut inputs: Vec<Tensor> = vec![];
    for (i, s) in specs.iter().enumerate() {
        let id = match (&s.view_of, params[i]) {
            (_, Some(v)) => v,
            (Some(view), None) => synthetic_view(&state, specs, &params, s, view)?,
            (None, None) => unreachable!("parameters were added above"),
        };
        inputs.push(Tensor {
            state: state.clone(),
            id: Some(id),
        });
    }
    let prev = CURRENT.with(|c| c.replace(Some(state.clone())));
    let outs = f(&inputs);
    CURRENT.with(|c| *c.borrow_mut() = prev);
    drop(inputs);
    let mut st = state.borrow_mut();
    if let Some(e) = st.error.take() {
        return Err(e);
    }
    let mut outputs = vec![];
    for t in &outs {
        if !Rc::ptr_eq(&t.state, &state) {
            return Err(Error::Statement {
                line: None,
                stmt: "return".into(),
                msg: "a returned tensor belongs to another trace".into(),
            });
        }
        outputs.push(t.id.expect("errors are returned above"));
    }
    st.graph.outputs = outputs;
    Ok(std::mem::take(&mut st.graph))
}

/// Aliasing input `s` as `as_strided` of its base parameter.
fn synthetic_view(
    state: &Rc<RefCell<State>>,
    specs: &[TensorSpec],
    params: &[Option<ValueId>],
    s: &TensorSpec,
    view: &ViewOf,
) -> Result<ValueId> {
    let err = |msg: String| Error::Input {
        name: s.name.clone(),
        msg,
    };
    let b = specs
        .iter()
        .position(|x| x.name == view.base)
        .ok_or_else(|| err(format!("its base `{}` is not an input", view.base)))?;
    let base = params[b].ok_or_else(|| {
        err(format!(
            "its base `{}` is itself a view; name the input that owns the memory",
            view.base
        ))
    })?;
    if specs[b].dtype != s.dtype {
        return Err(err(format!(
            "a {} view of the {} input `{}`; views keep their base's dtype",
            s.dtype, specs[b].dtype, view.base
        )));
    }
    if view.strides.len() != s.sizes.len() {
        return Err(err(format!(
            "{} sizes but {} strides",
            s.sizes.len(),
            view.strides.len()
        )));
    }
    let ints = |v: &[usize]| Arg::IntList(v.iter().map(|&x| x as i64).collect());
    let id = ops::lookup("as_strided").expect("as_strided is in the table");
    let args = [
        Arg::Tensor(base),
        ints(&s.sizes),
        ints(&view.strides),
        Arg::Int(view.offset as i64),
    ];
    let mut st = state.borrow_mut();
    let r = st.graph.call(id, &args).map_err(err)?;
    st.graph.values[r[0]].name = Some(s.name.as_str().into());
    Ok(r[0])
}

/// Calls any op of the table by name on the trace in progress (for
/// factories, which have no tensor to hang off).
pub fn call(op: &str, args: Vec<Arg<Tensor>>) -> Vec<Tensor> {
    let state = CURRENT.with(|c| c.borrow().clone());
    match state {
        Some(s) => record(&s, op, args),
        None => {
            let msg = format!("`{op}` was called outside of `trace`");
            let s = State {
                graph: Graph::default(),
                error: Some(Error::Statement {
                    line: None,
                    stmt: op.into(),
                    msg,
                }),
            };
            vec![Tensor {
                state: Rc::new(RefCell::new(s)),
                id: None,
            }]
        }
    }
}

fn record(state: &Rc<RefCell<State>>, op: &str, args: Vec<Arg<Tensor>>) -> Vec<Tensor> {
    let poisoned = |n: usize| {
        (0..n.max(1))
            .map(|_| Tensor {
                state: state.clone(),
                id: None,
            })
            .collect()
    };
    let mut st = state.borrow_mut();
    if st.error.is_some() {
        return poisoned(1);
    }
    let mut ok = true;
    let ids: Vec<Arg<ValueId>> = args
        .iter()
        .map(|a| {
            a.map(&mut |t: &Tensor| {
                ok &= t.id.is_some() && Rc::ptr_eq(&t.state, state);
                t.id.unwrap_or_default()
            })
        })
        .collect();
    if !ok {
        st.error.get_or_insert(Error::Statement {
            line: None,
            stmt: op.to_string(),
            msg: "an argument comes from another trace or a failed op".into(),
        });
        return poisoned(1);
    }
    let Some(id) = ops::lookup(op) else {
        st.error = Some(Error::Statement {
            line: None,
            stmt: op.to_string(),
            msg: format!("unknown op `{op}`"),
        });
        return poisoned(1);
    };
    match st.graph.call(id, &ids) {
        Ok(res) => res
            .into_iter()
            .map(|v| Tensor {
                state: state.clone(),
                id: Some(v),
            })
            .collect(),
        Err(msg) => {
            let names = crate::text::Names::of(&st.graph);
            let args: Vec<String> = ids
                .iter()
                .map(|a| crate::text::fmt_arg(a, &|v| names.get(v)))
                .collect();
            st.error = Some(Error::Statement {
                line: None,
                stmt: format!("{op}({})", args.join(", ")),
                msg,
            });
            poisoned(1)
        }
    }
}

impl From<&Tensor> for Arg<Tensor> {
    fn from(t: &Tensor) -> Self {
        Arg::Tensor(t.clone())
    }
}
impl From<Tensor> for Arg<Tensor> {
    fn from(t: Tensor) -> Self {
        Arg::Tensor(t)
    }
}
impl From<i64> for Arg<Tensor> {
    fn from(x: i64) -> Self {
        Arg::Int(x)
    }
}
impl From<i32> for Arg<Tensor> {
    fn from(x: i32) -> Self {
        Arg::Int(x as i64)
    }
}
impl From<f64> for Arg<Tensor> {
    fn from(x: f64) -> Self {
        Arg::Float(x)
    }
}
impl From<bool> for Arg<Tensor> {
    fn from(x: bool) -> Self {
        Arg::Bool(x)
    }
}
impl From<&str> for Arg<Tensor> {
    fn from(x: &str) -> Self {
        Arg::Str(x.to_string())
    }
}
impl From<DType> for Arg<Tensor> {
    fn from(x: DType) -> Self {
        Arg::Dtype(x)
    }
}
impl From<&[i64]> for Arg<Tensor> {
    fn from(x: &[i64]) -> Self {
        Arg::IntList(x.to_vec())
    }
}
impl<const N: usize> From<[i64; N]> for Arg<Tensor> {
    fn from(x: [i64; N]) -> Self {
        Arg::IntList(x.to_vec())
    }
}
impl From<Vec<Option<&Tensor>>> for Arg<Tensor> {
    fn from(x: Vec<Option<&Tensor>>) -> Self {
        Arg::TensorList(x.into_iter().map(|t| t.cloned()).collect())
    }
}
impl<T: Into<Arg<Tensor>>> From<Option<T>> for Arg<Tensor> {
    fn from(x: Option<T>) -> Self {
        x.map_or(Arg::None, Into::into)
    }
}

/// `args![a, b, ...]`: a list of op arguments of mixed kinds.
#[macro_export]
macro_rules! args {
    ($($a:expr),* $(,)?) => { vec![$($crate::schema::Arg::<$crate::trace::Tensor>::from($a)),*] };
}

macro_rules! unary_methods {
    ($($name:ident),*) => {$(
        pub fn $name(&self) -> Tensor { self.op(stringify!($name), vec![self.into()]) }
    )*};
}

macro_rules! binary_methods {
    ($($name:ident),*) => {$(
        pub fn $name(&self, other: impl Into<Arg<Tensor>>) -> Tensor {
            self.op(stringify!($name), vec![self.into(), other.into()])
        }
    )*};
}

impl Tensor {
    /// Records `op(args)` and returns its results.
    pub fn call(&self, op: &str, args: Vec<Arg<Tensor>>) -> Vec<Tensor> {
        record(&self.state, op, args)
    }

    /// Records a single-result op.
    pub fn op(&self, op: &str, args: Vec<Arg<Tensor>>) -> Tensor {
        let mut r = self.call(op, args);
        if r.len() != 1 {
            let mut st = self.state.borrow_mut();
            let msg = format!(
                "returns {} tensors; use `call` for ops with several results",
                r.len()
            );
            st.error.get_or_insert(Error::Statement {
                line: None,
                stmt: op.into(),
                msg,
            });
            return Tensor {
                state: self.state.clone(),
                id: None,
            };
        }
        r.remove(0)
    }

    /// The value's metadata (`None` after an error).
    pub fn meta(&self) -> Option<Meta> {
        self.id
            .map(|v| (*self.state.borrow().graph.values[v].meta).clone())
    }

    pub fn sizes(&self) -> Vec<usize> {
        self.meta().map(|m| m.sizes.to_vec()).unwrap_or_default()
    }

    pub fn dtype(&self) -> Option<DType> {
        self.meta().map(|m| m.dtype)
    }

    pub fn id(&self) -> Option<ValueId> {
        self.id
    }

    // Views.
    pub fn view(&self, shape: &[i64]) -> Tensor {
        self.op("view", args![self, shape])
    }
    pub fn reshape(&self, shape: &[i64]) -> Tensor {
        self.op("reshape", args![self, shape])
    }
    pub fn slice(&self, dim: i64, start: Option<i64>, end: Option<i64>, step: i64) -> Tensor {
        self.op("slice", args![self, dim, start, end, step])
    }
    pub fn select(&self, dim: i64, index: i64) -> Tensor {
        self.op("select", args![self, dim, index])
    }
    pub fn transpose(&self, d0: i64, d1: i64) -> Tensor {
        self.op("transpose", args![self, d0, d1])
    }
    pub fn t(&self) -> Tensor {
        self.op("t", args![self])
    }
    pub fn permute(&self, dims: &[i64]) -> Tensor {
        self.op("permute", args![self, dims])
    }
    pub fn expand(&self, size: &[i64]) -> Tensor {
        self.op("expand", args![self, size])
    }
    pub fn diagonal(&self, offset: i64, d1: i64, d2: i64) -> Tensor {
        self.op("diagonal", args![self, offset, d1, d2])
    }
    pub fn as_strided(&self, size: &[i64], stride: &[i64], offset: Option<i64>) -> Tensor {
        self.op("as_strided", args![self, size, stride, offset])
    }
    pub fn unsqueeze(&self, dim: i64) -> Tensor {
        self.op("unsqueeze", args![self, dim])
    }
    pub fn squeeze(&self, dim: Option<i64>) -> Tensor {
        match dim {
            Some(d) => self.op("squeeze", args![self, d]),
            None => self.op("squeeze", args![self]),
        }
    }
    pub fn alias(&self) -> Tensor {
        self.op("alias", args![self])
    }
    pub fn narrow(&self, dim: i64, start: i64, len: i64) -> Tensor {
        self.op("narrow", args![self, dim, start, len])
    }
    pub fn unfold(&self, dim: i64, size: i64, step: i64) -> Tensor {
        self.op("unfold", args![self, dim, size, step])
    }
    pub fn split(&self, size: i64, dim: i64) -> Vec<Tensor> {
        self.call("split", args![self, size, dim])
    }
    pub fn chunk(&self, chunks: i64, dim: i64) -> Vec<Tensor> {
        self.call("chunk", args![self, chunks, dim])
    }
    pub fn unbind(&self, dim: i64) -> Vec<Tensor> {
        self.call("unbind", args![self, dim])
    }
    pub fn contiguous(&self) -> Tensor {
        self.op("contiguous", args![self])
    }
    pub fn clone_tensor(&self) -> Tensor {
        self.op("clone", args![self])
    }

    binary_methods!(add, sub, mul, div, pow, maximum, minimum, eq, ne, lt, le, gt, ge);
    binary_methods!(
        add_, sub_, mul_, div_, pow_, maximum_, minimum_, eq_, ne_, lt_, le_, gt_, ge_, copy_,
        fill_
    );
    unary_methods!(
        neg,
        exp,
        log,
        sqrt,
        rsqrt,
        abs,
        relu,
        sigmoid,
        tanh,
        gelu,
        logical_not,
        sin,
        cos,
        reciprocal,
        erf,
        zero_
    );
    unary_methods!(
        neg_,
        exp_,
        log_,
        sqrt_,
        rsqrt_,
        abs_,
        relu_,
        sigmoid_,
        tanh_,
        gelu_,
        logical_not_,
        sin_,
        cos_,
        reciprocal_,
        erf_
    );

    pub fn masked_fill_(&self, mask: &Tensor, value: impl Into<Arg<Tensor>>) -> Tensor {
        self.op("masked_fill_", args![self, mask, value.into()])
    }
    pub fn masked_fill(&self, mask: &Tensor, value: impl Into<Arg<Tensor>>) -> Tensor {
        self.op("masked_fill", args![self, mask, value.into()])
    }
    pub fn index_put_(
        &self,
        indices: Vec<Option<&Tensor>>,
        values: &Tensor,
        accumulate: bool,
    ) -> Tensor {
        self.op("index_put_", args![self, indices, values, accumulate])
    }
    pub fn clamp(&self, min: Option<f64>, max: Option<f64>) -> Tensor {
        self.op("clamp", args![self, min, max])
    }

    // Reductions and layers.
    pub fn sum(&self, dims: &[i64], keepdim: bool) -> Tensor {
        self.op("sum", args![self, dims, keepdim])
    }
    pub fn mean(&self, dims: &[i64], keepdim: bool) -> Tensor {
        self.op("mean", args![self, dims, keepdim])
    }
    pub fn amax(&self, dims: &[i64], keepdim: bool) -> Tensor {
        self.op("amax", args![self, dims, keepdim])
    }
    pub fn softmax(&self, dim: i64) -> Tensor {
        self.op("softmax", args![self, dim])
    }
    pub fn matmul(&self, other: &Tensor) -> Tensor {
        self.op("matmul", args![self, other])
    }
    pub fn linear(&self, weight: &Tensor, bias: Option<&Tensor>) -> Tensor {
        self.op("linear", args![self, weight, bias])
    }
    pub fn layer_norm(
        &self,
        shape: &[i64],
        weight: Option<&Tensor>,
        bias: Option<&Tensor>,
        eps: f64,
    ) -> Tensor {
        self.op("layer_norm", args![self, shape, weight, bias, eps])
    }
}

/// Factories, recorded into the trace in progress.
pub fn zeros(size: &[i64], dtype: DType) -> Tensor {
    call("zeros", args![size, dtype]).remove(0)
}
pub fn ones(size: &[i64], dtype: DType) -> Tensor {
    call("ones", args![size, dtype]).remove(0)
}
pub fn full(size: &[i64], value: impl Into<Arg<Tensor>>, dtype: DType) -> Tensor {
    call("full", args![size, value.into(), dtype]).remove(0)
}

macro_rules! operator {
    ($tr:ident, $m:ident, $op:literal) => {
        impl std::ops::$tr<&Tensor> for &Tensor {
            type Output = Tensor;
            fn $m(self, rhs: &Tensor) -> Tensor {
                self.op($op, args![self, rhs])
            }
        }
        impl std::ops::$tr<f64> for &Tensor {
            type Output = Tensor;
            fn $m(self, rhs: f64) -> Tensor {
                self.op($op, args![self, rhs])
            }
        }
    };
}
operator!(Add, add, "add");
operator!(Sub, sub, "sub");
operator!(Mul, mul, "mul");
operator!(Div, div, "div");

impl std::ops::Neg for &Tensor {
    type Output = Tensor;
    fn neg(self) -> Tensor {
        self.op("neg", args![self])
    }
}
