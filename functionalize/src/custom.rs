//! Custom functions: user ops whose forward the transforms cannot see
//! into, with their own rules for each transform — `torch.autograd.Function`
//! for Kiln (`docs/custom-functions.md`).
//!
//! A `Function` gives a schema (`mylib::numpy_sort(Tensor x, int dim) ->
//! (Tensor, Tensor, Tensor)`), a shape and dtype rule, a reference forward
//! on host tensors, and optionally `setup_context`, `backward`, `jvp`,
//! `vmap` (or a forward written with Kiln ops and `generate_vmap_rule`).
//! `register` adds it to the op table: programs call it by its qualified
//! name, it prints and parses like any op, functionalization passes it
//! through (it is functional: a schema that writes an argument is
//! refused), and every transform uses its rules and never looks into its
//! forward — a missing rule is refused naming the function and the rule.

pub use crate::function::{Ctx, Function, GpuKernel, Ops, Rule, VmapInfo};
/// Where `backward`, `jvp` and `vmap` emit ops.
pub use crate::rule::{Batch, Emit};
use std::sync::Arc;

/// Adds `f` to the op table under its schema's name; programs parsed or
/// traced afterwards may call it. Registering the same name again is an
/// error (names are global, as `torch.library`'s are).
pub fn register(f: Arc<dyn Function>) -> Result<crate::ops::OpId, String> {
    crate::ops::register_custom(f)
}
