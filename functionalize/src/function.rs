//! What a custom function is (`custom` registers them): the `Function`
//! trait and the context its rules share. Declared below the op table,
//! which holds registered functions, and written against the rules' API
//! (`rule::Emit`, `rule::Batch`), so neither needs the transforms.

use crate::id::ValueId;
use crate::meta::Meta;
use crate::rule::{Batch, Emit, R};
use crate::schema::Arg;
use crate::tensor::RTensor;
use std::collections::HashMap;

/// What `setup_context` keeps for `backward` and `jvp`: tensors of the
/// program being built (inputs or outputs of the call), named values
/// (a `dim`), and which outputs carry no derivative.
#[derive(Default, Debug, Clone)]
pub struct Ctx {
    saved: Vec<ValueId>,
    saved_for_forward: Vec<ValueId>,
    values: HashMap<String, Arg<ValueId>>,
    non_differentiable: Vec<usize>,
}

impl Ctx {
    /// `ctx.save_for_backward(*tensors)`.
    pub fn save_for_backward(&mut self, tensors: &[ValueId]) {
        self.saved = tensors.to_vec();
    }
    /// `ctx.saved_tensors`.
    pub fn saved_tensors(&self) -> &[ValueId] {
        &self.saved
    }
    /// `ctx.save_for_forward(*tensors)`.
    pub fn save_for_forward(&mut self, tensors: &[ValueId]) {
        self.saved_for_forward = tensors.to_vec();
    }
    pub fn saved_for_forward(&self) -> &[ValueId] {
        &self.saved_for_forward
    }
    /// A non-tensor value (`ctx.dim = dim`).
    pub fn set(&mut self, name: &str, value: Arg<ValueId>) {
        self.values.insert(name.to_string(), value);
    }
    pub fn get(&self, name: &str) -> R<&Arg<ValueId>> {
        self.values
            .get(name)
            .ok_or_else(|| format!("the context holds no `{name}` (set it in setup_context)"))
    }
    /// An integer saved with `set`.
    pub fn int(&self, name: &str) -> R<i64> {
        match self.get(name)? {
            Arg::Int(i) => Ok(*i),
            other => Err(format!(
                "`{name}` in the context is {}, not an integer",
                other.kind_name()
            )),
        }
    }
    /// `ctx.mark_non_differentiable(...)`, by output index.
    pub fn mark_non_differentiable(&mut self, outputs: &[usize]) {
        self.non_differentiable.extend_from_slice(outputs);
    }
    pub fn is_non_differentiable(&self, output: usize) -> bool {
        self.non_differentiable.contains(&output)
    }
}

/// A custom function's GPU kernel: WGSL defining `fn kiln_kernel(gid: u32)`,
/// run for every `gid` below `invocations`. Kiln adds, for argument tensor
/// `j` (counting tensor arguments only), `fn kiln_in{j}(i: u32) -> T`
/// reading its element `i` (row-major), and for output `k`
/// `fn kiln_out{k}(i: u32, x: T)` writing its element `i`; `T` is `f32`
/// for f32 and f16, `i32` for i32 and i64 (held in 32 bits on the GPU),
/// `u32`, `bool`. The kernel may call the prelude's helpers
/// (`shaders/prelude.wgsl`); it must not declare bindings. One dispatch
/// computes one output (the others' stores do nothing there), so a
/// kernel writes every output it can.
#[derive(Clone, Debug)]
pub struct GpuKernel {
    pub source: String,
    pub invocations: usize,
}

/// `torch.func` rules' result: `None` when the function gives no rule.
pub type Rule<T> = Option<R<T>>;

/// The batch positions of a custom function's `vmap` rule.
pub struct VmapInfo {
    pub batch_size: usize,
}

/// A user op (see the module docs). Implementations hold no graph state:
/// one `Function` serves every program that calls it.
pub trait Function: Send + Sync + 'static {
    /// ATen-style schema with a qualified name:
    /// `mylib::numpy_take(Tensor x, Tensor ind, Tensor ind_inv, int dim) -> Tensor`.
    fn schema(&self) -> String;
    /// Result dtypes and shapes (contiguous).
    fn infer(&self, args: &[Arg<&Meta>]) -> Result<Vec<Meta>, String>;
    /// The forward on host tensors, for the reference interpreter.
    fn forward(&self, args: &[Arg<RTensor>]) -> Result<Vec<RTensor>, String>;
    /// The forward on the GPU for these argument and output types (`None`:
    /// the GPU backend refuses programs that call the function).
    fn wgsl(&self, _args: &[Arg<&Meta>], _outputs: &[Meta]) -> Option<GpuKernel> {
        None
    }
    /// The forward written with Kiln ops, when it can be (needed by
    /// `generate_vmap_rule`).
    fn forward_ops(&self, _e: &mut dyn Ops, _args: &[Arg<ValueId>]) -> Rule<Vec<ValueId>> {
        None
    }
    /// `setup_context(ctx, inputs, output)`.
    fn setup_context(
        &self,
        _ctx: &mut Ctx,
        _inputs: &[Arg<ValueId>],
        _outputs: &[ValueId],
    ) -> R<()> {
        Ok(())
    }
    /// `backward(ctx, *grad_outputs)`: one gradient per argument (`None`
    /// for non-tensor and non-differentiable ones), written with Kiln ops
    /// or other custom functions.
    fn backward(
        &self,
        _e: &mut dyn Emit,
        _ctx: &Ctx,
        _grads: &[Option<ValueId>],
    ) -> Rule<Vec<Option<ValueId>>> {
        None
    }
    /// `jvp(ctx, *tangents)`: one tangent per output (tangents are given
    /// per argument).
    fn jvp(
        &self,
        _e: &mut dyn Emit,
        _ctx: &Ctx,
        _tangents: &[Option<ValueId>],
    ) -> Rule<Vec<Option<ValueId>>> {
        None
    }
    /// `vmap(info, in_dims, *args) -> (outputs, out_dims)`; `in_dims` per
    /// argument (the batch dimension is 0 where present).
    fn vmap(
        &self,
        _b: &mut dyn Batch,
        _info: &VmapInfo,
        _in_dims: &[Option<usize>],
        _args: &[Arg<ValueId>],
    ) -> Rule<(Vec<ValueId>, Vec<Option<usize>>)> {
        None
    }
    /// `generate_vmap_rule = True`: batch `forward_ops` instead (refused
    /// at `register` unless `has_forward_ops`).
    fn generate_vmap_rule(&self) -> bool {
        false
    }
    /// Does `forward_ops` write the forward with Kiln ops?
    fn has_forward_ops(&self) -> bool {
        false
    }
}

/// Where rules emit ops: a plain program (`Emitter`) or a batched one
/// (`Batcher`, which runs each op's batching rule), so a forward written
/// once with Kiln ops also batches.
pub trait Ops {
    fn op(&mut self, name: &str, args: Vec<Arg<ValueId>>) -> R<Vec<ValueId>>;
}
