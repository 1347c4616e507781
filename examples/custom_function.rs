//! The three examples of PyTorch's "Extending torch.func with
//! autograd.Function" as Kiln custom functions: `NumpySort` (sorted values
//! and the non-differentiable `ind`, `ind_inv`; backward through
//! `NumpyTake`; a `jvp`; a hand-written `vmap` rule), `NumpyTake` (backward
//! through itself) and `MyCube` (`x^3` and `dx = 3x^2`, a backward that is
//! itself differentiable, so `grad(grad)` works; also with
//! `generate_vmap_rule`). Each forward has a WGSL kernel of its own (the
//! sort ranks each element in its line). Prints the values the page
//! computes, run on the GPU (`--reference`: the reference interpreter);
//! `--json` prints them as one JSON object.
//!
//!     cargo run --example custom_function [-- --json] [--reference]

use kiln::functionalize::custom::{
    self, Batch, Ctx, Emit, Function, GpuKernel, Ops, Rule, VmapInfo,
};
use kiln::functionalize::meta::{wrap_dim, Meta};
use kiln::functionalize::schema::Arg;
use kiln::functionalize::transform::emit::R;
use kiln::functionalize::transform::{grad, inline, jvp, vmap};
use kiln::functionalize::{parse, DType, Graph, RTensor, ValueId};
use std::sync::Arc;

fn tensor<T>(args: &[Arg<T>], i: usize) -> R<&T> {
    match args.get(i) {
        Some(Arg::Tensor(t)) => Ok(t),
        _ => Err(format!("argument {i} is not a tensor")),
    }
}

fn int(args: &[Arg<impl Sized>], i: usize) -> R<i64> {
    match args.get(i) {
        Some(Arg::Int(d)) => Ok(*d),
        _ => Err(format!("argument {i} is not an integer")),
    }
}

/// Row-major strides of `sizes`.
fn strides(sizes: &[usize]) -> Vec<usize> {
    let mut s = vec![1; sizes.len()];
    for d in (0..sizes.len().saturating_sub(1)).rev() {
        s[d] = s[d + 1] * sizes[d + 1];
    }
    s
}

/// Calls `f(line)` for every line along `dim`: the flat indices of its
/// elements.
fn lines(sizes: &[usize], dim: usize, mut f: impl FnMut(&[usize])) {
    let st = strides(sizes);
    let n: usize = sizes.iter().product();
    let len = sizes[dim];
    for start in 0..n {
        if !(start / st[dim]).is_multiple_of(len) {
            continue;
        }
        let idx: Vec<usize> = (0..len).map(|k| start + k * st[dim]).collect();
        f(&idx);
    }
}

/// `np.take_along_axis(x, ind, dim)` on host tensors.
fn take_along(x: &RTensor, ind: &RTensor, dim: usize) -> R<RTensor> {
    let (xv, iv) = (x.values(), ind.values());
    let (xs, is) = (strides(x.sizes()), strides(ind.sizes()));
    let mut out = Vec::with_capacity(iv.len());
    for (k, &i) in iv.iter().enumerate() {
        if i < 0.0 || i as usize >= x.sizes()[dim] {
            return Err(format!(
                "numpy_take: index {i} is out of range for size {}",
                x.sizes()[dim]
            ));
        }
        let (mut rem, mut off) = (k, 0);
        for d in 0..is.len() {
            let c = rem / is[d];
            rem %= is[d];
            off += if d == dim { i as usize } else { c } * xs[d];
        }
        out.push(xv[off]);
    }
    Ok(RTensor::new(x.dtype(), ind.sizes().to_vec(), &out))
}

/// A line along `dim` of `x`: its length and the stride between its
/// elements.
fn line(x: &Meta, dim: i64) -> Option<(usize, usize)> {
    if x.dim() == 0 {
        return Some((1, 1));
    }
    let d = wrap_dim(dim, x.dim()).ok()?;
    Some((x.sizes[d], x.sizes[d + 1..].iter().product()))
}

/// `NumpySort`: sorted values, `ind` (argsort) and `ind_inv` (its inverse).
struct NumpySort;

impl Function for NumpySort {
    fn schema(&self) -> String {
        "mylib::numpy_sort(Tensor x, int dim) -> (Tensor, Tensor, Tensor)".into()
    }
    fn infer(&self, args: &[Arg<&Meta>]) -> R<Vec<Meta>> {
        let x = *tensor(args, 0)?;
        wrap_dim(int(args, 1)?, x.dim().max(1))?;
        let s = x.sizes.to_vec();
        Ok(vec![
            Meta::contiguous(x.dtype, s.clone()),
            Meta::contiguous(DType::I64, s.clone()),
            Meta::contiguous(DType::I64, s),
        ])
    }
    fn forward(&self, args: &[Arg<RTensor>]) -> R<Vec<RTensor>> {
        let x = tensor(args, 0)?;
        let dim = wrap_dim(int(args, 1)?, x.sizes().len().max(1))?;
        let xv = x.values();
        let (mut ind, mut inv) = (vec![0.0; xv.len()], vec![0.0; xv.len()]);
        let mut vals = vec![0.0; xv.len()];
        lines(x.sizes(), dim, |idx| {
            let mut order: Vec<usize> = (0..idx.len()).collect();
            order.sort_by(|&a, &b| xv[idx[a]].total_cmp(&xv[idx[b]]));
            for (k, &o) in order.iter().enumerate() {
                ind[idx[k]] = o as f64;
                inv[idx[o]] = k as f64;
                vals[idx[k]] = xv[idx[o]];
            }
        });
        let s = x.sizes().to_vec();
        Ok(vec![
            RTensor::new(x.dtype(), s.clone(), &vals),
            RTensor::new(DType::I64, s.clone(), &ind),
            RTensor::new(DType::I64, s, &inv),
        ])
    }
    /// Each element's rank in its line (ties by position), then a store
    /// at the rank: the values, `ind` there, `ind_inv` at the element.
    fn wgsl(&self, args: &[Arg<&Meta>], _outputs: &[Meta]) -> Option<GpuKernel> {
        let x = *tensor(args, 0).ok()?;
        let (len, inner) = line(x, int(args, 1).ok()?)?;
        Some(GpuKernel {
            source: format!(
                "fn kiln_kernel(gid: u32) {{
    let k = (gid / {inner}u) % {len}u;
    let base = gid - k * {inner}u;
    let x = kiln_in0(gid);
    var rank = 0u;
    for (var j = 0u; j < {len}u; j = j + 1u) {{
        let y = kiln_in0(base + j * {inner}u);
        if (y < x || (y == x && j < k)) {{ rank = rank + 1u; }}
    }}
    kiln_out0(base + rank * {inner}u, x);
    kiln_out1(base + rank * {inner}u, i32(k));
    kiln_out2(gid, i32(rank));
}}"
            ),
            invocations: x.numel(),
        })
    }
    fn setup_context(&self, ctx: &mut Ctx, inputs: &[Arg<ValueId>], outputs: &[ValueId]) -> R<()> {
        ctx.mark_non_differentiable(&[1, 2]);
        ctx.save_for_backward(&[outputs[1], outputs[2]]);
        ctx.save_for_forward(&[outputs[1], outputs[2]]);
        ctx.set("dim", inputs[1].clone());
        Ok(())
    }
    fn backward(
        &self,
        e: &mut dyn Emit,
        ctx: &Ctx,
        grads: &[Option<ValueId>],
    ) -> Rule<Vec<Option<ValueId>>> {
        Some((|| {
            let (ind, ind_inv) = (ctx.saved_tensors()[0], ctx.saved_tensors()[1]);
            let g = match grads[0] {
                Some(g) => g,
                None => return Ok(vec![None, None]),
            };
            let r = e.call(
                "mylib::numpy_take",
                vec![
                    Arg::Tensor(g),
                    Arg::Tensor(ind_inv),
                    Arg::Tensor(ind),
                    ctx.get("dim")?.clone(),
                ],
            )?;
            Ok(vec![Some(r), None])
        })())
    }
    fn jvp(
        &self,
        e: &mut dyn Emit,
        ctx: &Ctx,
        tangents: &[Option<ValueId>],
    ) -> Rule<Vec<Option<ValueId>>> {
        Some((|| {
            let (ind, ind_inv) = (ctx.saved_for_forward()[0], ctx.saved_for_forward()[1]);
            let Some(t) = tangents[0] else {
                return Ok(vec![None, None, None]);
            };
            let r = e.call(
                "mylib::numpy_take",
                vec![
                    Arg::Tensor(t),
                    Arg::Tensor(ind),
                    Arg::Tensor(ind_inv),
                    ctx.get("dim")?.clone(),
                ],
            )?;
            Ok(vec![Some(r), None, None])
        })())
    }
    fn vmap(
        &self,
        b: &mut dyn Batch,
        _info: &VmapInfo,
        in_dims: &[Option<usize>],
        args: &[Arg<ValueId>],
    ) -> Rule<(Vec<ValueId>, Vec<Option<usize>>)> {
        Some((|| {
            // x's batch dimension is at in_dims[0] (0): sort one dimension
            // further in, unbatched (`b.e()`).
            let x = *tensor(args, 0)?;
            let _ = in_dims;
            let logical = b.e().rank(x) - 1;
            let dim = wrap_dim(int(args, 1)?, logical.max(1))? as i64;
            let r = b
                .e()
                .call_all("mylib::numpy_sort", vec![Arg::Tensor(x), Arg::Int(dim + 1)])?;
            Ok((r.to_vec(), vec![Some(0); 3]))
        })())
    }
}

/// `NumpyTake`: `np.take_along_axis(x, ind, dim)`.
struct NumpyTake;

impl Function for NumpyTake {
    fn schema(&self) -> String {
        "mylib::numpy_take(Tensor x, Tensor ind, Tensor ind_inv, int dim) -> Tensor".into()
    }
    fn infer(&self, args: &[Arg<&Meta>]) -> R<Vec<Meta>> {
        let (x, ind) = (*tensor(args, 0)?, *tensor(args, 1)?);
        if ind.sizes != x.sizes || ind.dtype != DType::I64 {
            return Err(format!(
                "numpy_take: ind must be i64 of x's shape {:?}, it is {}",
                x.sizes.to_vec(),
                ind.type_string()
            ));
        }
        Ok(vec![Meta::contiguous(x.dtype, ind.sizes.to_vec())])
    }
    fn forward(&self, args: &[Arg<RTensor>]) -> R<Vec<RTensor>> {
        let (x, ind) = (tensor(args, 0)?, tensor(args, 1)?);
        let dim = wrap_dim(int(args, 3)?, x.sizes().len().max(1))?;
        Ok(vec![take_along(x, ind, dim)?])
    }
    fn wgsl(&self, args: &[Arg<&Meta>], _outputs: &[Meta]) -> Option<GpuKernel> {
        let x = *tensor(args, 0).ok()?;
        let (len, inner) = line(x, int(args, 3).ok()?)?;
        Some(GpuKernel {
            source: format!(
                "fn kiln_kernel(gid: u32) {{
    let k = (gid / {inner}u) % {len}u;
    let src = gid - k * {inner}u + u32(clamp(kiln_in1(gid), 0i, {last}i)) * {inner}u;
    kiln_out0(gid, kiln_in0(src));
}}",
                last = len as i64 - 1
            ),
            invocations: x.numel(),
        })
    }
    fn setup_context(&self, ctx: &mut Ctx, inputs: &[Arg<ValueId>], _outputs: &[ValueId]) -> R<()> {
        let (ind, ind_inv) = (*tensor(inputs, 1)?, *tensor(inputs, 2)?);
        ctx.save_for_backward(&[ind, ind_inv]);
        ctx.save_for_forward(&[ind, ind_inv]);
        ctx.set("dim", inputs[3].clone());
        Ok(())
    }
    fn backward(
        &self,
        e: &mut dyn Emit,
        ctx: &Ctx,
        grads: &[Option<ValueId>],
    ) -> Rule<Vec<Option<ValueId>>> {
        Some((|| {
            let (ind, ind_inv) = (ctx.saved_tensors()[0], ctx.saved_tensors()[1]);
            let Some(g) = grads[0] else {
                return Ok(vec![None; 4]);
            };
            let r = e.call(
                "mylib::numpy_take",
                vec![
                    Arg::Tensor(g),
                    Arg::Tensor(ind_inv),
                    Arg::Tensor(ind),
                    ctx.get("dim")?.clone(),
                ],
            )?;
            Ok(vec![Some(r), None, None, None])
        })())
    }
    fn jvp(
        &self,
        e: &mut dyn Emit,
        ctx: &Ctx,
        tangents: &[Option<ValueId>],
    ) -> Rule<Vec<Option<ValueId>>> {
        Some((|| {
            let (ind, ind_inv) = (ctx.saved_for_forward()[0], ctx.saved_for_forward()[1]);
            let Some(t) = tangents[0] else {
                return Ok(vec![None]);
            };
            let r = e.call(
                "mylib::numpy_take",
                vec![
                    Arg::Tensor(t),
                    Arg::Tensor(ind),
                    Arg::Tensor(ind_inv),
                    ctx.get("dim")?.clone(),
                ],
            )?;
            Ok(vec![Some(r)])
        })())
    }
    fn vmap(
        &self,
        b: &mut dyn Batch,
        _info: &VmapInfo,
        in_dims: &[Option<usize>],
        args: &[Arg<ValueId>],
    ) -> Rule<(Vec<ValueId>, Vec<Option<usize>>)> {
        Some((|| {
            // Every tensor given the batch at the front, the dimension
            // shifted past it.
            let x = *tensor(args, 0)?;
            let logical = b.e().rank(x) - in_dims[0].is_some() as usize;
            let dim = wrap_dim(int(args, 3)?, logical.max(1))? as i64;
            let mut a = vec![];
            for i in 0..3 {
                a.push(Arg::Tensor(b.materialize(*tensor(args, i)?)?));
            }
            a.push(Arg::Int(dim + 1));
            let r = b.e().call("mylib::numpy_take", a)?;
            Ok((vec![r], vec![Some(0)]))
        })())
    }
}

/// `MyCube`: `x^3` and `dx = 3x^2`.
struct MyCube {
    generated: bool,
}

impl Function for MyCube {
    fn schema(&self) -> String {
        let name = if self.generated {
            "my_cube_generated"
        } else {
            "my_cube"
        };
        format!("mylib::{name}(Tensor x) -> (Tensor, Tensor)")
    }
    fn infer(&self, args: &[Arg<&Meta>]) -> R<Vec<Meta>> {
        let x = *tensor(args, 0)?;
        if !x.dtype.is_float() {
            return Err("my_cube takes a floating point tensor".into());
        }
        Ok(vec![Meta::contiguous(x.dtype, x.sizes.to_vec()); 2])
    }
    fn forward(&self, args: &[Arg<RTensor>]) -> R<Vec<RTensor>> {
        let x = tensor(args, 0)?;
        let v = x.values();
        let s = x.sizes().to_vec();
        Ok(vec![
            RTensor::new(
                x.dtype(),
                s.clone(),
                &v.iter().map(|a| a * a * a).collect::<Vec<_>>(),
            ),
            RTensor::new(
                x.dtype(),
                s,
                &v.iter().map(|a| 3.0 * a * a).collect::<Vec<_>>(),
            ),
        ])
    }
    fn wgsl(&self, args: &[Arg<&Meta>], _outputs: &[Meta]) -> Option<GpuKernel> {
        let x = *tensor(args, 0).ok()?;
        Some(GpuKernel {
            source: "fn kiln_kernel(gid: u32) {
    let x = kiln_in0(gid);
    kiln_out0(gid, x * x * x);
    kiln_out1(gid, 3.0 * x * x);
}"
            .into(),
            invocations: x.numel(),
        })
    }
    fn forward_ops(&self, e: &mut dyn Ops, args: &[Arg<ValueId>]) -> Rule<Vec<ValueId>> {
        Some((|| {
            let x = *tensor(args, 0)?;
            let r = e.op("pow", vec![Arg::Tensor(x), Arg::Int(3)])?[0];
            let x2 = e.op("pow", vec![Arg::Tensor(x), Arg::Int(2)])?[0];
            let dx = e.op("mul", vec![Arg::Tensor(x2), Arg::Int(3)])?[0];
            Ok(vec![r, dx])
        })())
    }
    fn has_forward_ops(&self) -> bool {
        true
    }
    fn generate_vmap_rule(&self) -> bool {
        self.generated
    }
    fn setup_context(&self, ctx: &mut Ctx, inputs: &[Arg<ValueId>], outputs: &[ValueId]) -> R<()> {
        ctx.save_for_backward(&[*tensor(inputs, 0)?, outputs[1]]);
        Ok(())
    }
    fn backward(
        &self,
        e: &mut dyn Emit,
        ctx: &Ctx,
        grads: &[Option<ValueId>],
    ) -> Rule<Vec<Option<ValueId>>> {
        Some((|| {
            // grad_output * dx + grad_dx * 6 * x
            let (x, dx) = (ctx.saved_tensors()[0], ctx.saved_tensors()[1]);
            let a = match grads[0] {
                Some(g) => Some(e.mul(g, dx)?),
                None => None,
            };
            let b = match grads[1] {
                Some(gd) => {
                    let six = e.scale(x, 6.0)?;
                    Some(e.mul(gd, six)?)
                }
                None => None,
            };
            Ok(vec![e.add_opt(a, b)?])
        })())
    }
}

/// Registers the four functions (once per process).
pub fn register() -> R<()> {
    static DONE: std::sync::OnceLock<R<()>> = std::sync::OnceLock::new();
    DONE.get_or_init(|| {
        custom::register(Arc::new(NumpySort))?;
        custom::register(Arc::new(NumpyTake))?;
        custom::register(Arc::new(MyCube { generated: false }))?;
        custom::register(Arc::new(MyCube { generated: true }))?;
        Ok(())
    })
    .clone()
}

/// Where the example's programs run.
#[derive(Clone, Copy, PartialEq)]
pub enum Backend {
    Reference,
    Gpu,
}

fn run_on(
    engine: &std::cell::RefCell<Option<kiln::engine::Engine>>,
    g: &Graph,
    ins: &[RTensor],
) -> R<Vec<RTensor>> {
    let ins: Vec<RTensor> = ins
        .iter()
        .map(|t| RTensor::new(t.dtype(), t.sizes().to_vec(), &t.values()))
        .collect();
    match engine.borrow_mut().as_mut() {
        None => kiln::run(g, ins)
            .map(|r| r.outputs)
            .map_err(|e| e.to_string()),
        Some(e) => e
            .run(g, ins)
            .map(|r| r.outputs)
            .map_err(|err| err.to_string()),
    }
}

fn prog(src: &str) -> R<Graph> {
    parse(src).map_err(|e| e.to_string())
}

/// The page's values, by name, each a `[2, 4]` f32 result.
pub fn values(backend: Backend) -> R<Vec<(&'static str, RTensor)>> {
    register()?;
    let engine = std::cell::RefCell::new(match backend {
        Backend::Reference => None,
        Backend::Gpu => Some(kiln::engine::Engine::new().map_err(|e| e.to_string())?),
    });
    let run = |g: &Graph, ins: &[RTensor]| run_on(&engine, g, ins);
    let x = RTensor::new(
        DType::F32,
        vec![2, 4],
        &[0.5, -1.0, 2.0, 0.25, 3.0, 1.5, -0.5, 0.0],
    );
    let w = RTensor::new(
        DType::I64,
        vec![2, 4],
        &(0..8).map(|i| i as f64).collect::<Vec<_>>(),
    );
    let t = RTensor::new(
        DType::F32,
        vec![2, 4],
        &(0..8).map(|i| i as f64 / 10.0).collect::<Vec<_>>(),
    );
    let sort =
        prog("graph sort(%x: f32[2, 4]) { %v, %i, %j = mylib::numpy_sort(%x, 1) return (%v) }")?;
    let sort_loss = prog("graph sort_loss(%x: f32[2, 4], %w: i64[2, 4]) { %v, %i, %j = mylib::numpy_sort(%x, 1) %p = mul(%v, %w) %s = sum(%p) return (%s) }")?;
    let row_sort =
        prog("graph row_sort(%r: f32[4]) { %v, %i, %j = mylib::numpy_sort(%r, 0) return (%v) }")?;
    let row_loss = prog("graph row_loss(%r: f32[4], %wr: i64[4]) { %v, %i, %j = mylib::numpy_sort(%r, 0) %p = mul(%v, %wr) %s = sum(%p) return (%s) }")?;
    let cube = prog("graph cube(%x: f32[2, 4]) { %y, %dx = mylib::my_cube(%x) return (%y) }")?;
    let cube_loss = prog(
        "graph cube_loss(%x: f32[2, 4]) { %y, %dx = mylib::my_cube(%x) %s = sum(%y) return (%s) }",
    )?;
    let cube_row =
        prog("graph cube_row(%r: f32[4]) { %y, %dx = mylib::my_cube_generated(%r) return (%y) }")?;
    let e = |r: kiln::functionalize::Result<Graph>| r.map_err(|e| e.to_string());
    // Output `k` of `g` run on `ins`.
    let out = |g: &Graph, ins: &[&RTensor], k: usize| -> R<RTensor> {
        let ins: Vec<RTensor> = ins.iter().map(|t| (*t).clone()).collect();
        run(g, &ins)?
            .into_iter()
            .nth(k)
            .ok_or_else(|| "no output".to_string())
    };
    let per_row = e(grad(&row_loss, Some(&["r".into()]), false))?;
    let g1 = e(grad(&cube_loss, None, false))?;
    // grad(lambda x: grad(lambda y: my_cube(y)[0].sum())(x).sum())(x)
    let mut outer = Graph::new("cube_grad_sum");
    let xin = outer.add_input(Some("x".into()), Meta::contiguous(DType::F32, vec![2, 4]));
    let inner = inline(&mut outer, &g1, &[xin])?;
    let sum = kiln::functionalize::ops::lookup("sum").ok_or("no sum")?;
    let s = outer.call(sum, &[Arg::Tensor(inner[0])])?[0];
    outer.outputs = vec![s];
    Ok(vec![
        ("sort", out(&sort, &[&x], 0)?),
        (
            "sort_grad",
            out(
                &e(grad(&sort_loss, Some(&["x".into()]), false))?,
                &[&x, &w],
                0,
            )?,
        ),
        ("sort_jvp", out(&e(jvp(&sort, None))?, &[&x, &t], 1)?),
        (
            "sort_vmap",
            out(&e(vmap(&row_sort, &[Some(0)], 2, None))?, &[&x], 0)?,
        ),
        (
            "sort_vmap_grad",
            out(
                &e(vmap(&per_row, &[Some(0), Some(0)], 2, None))?,
                &[&x, &w],
                0,
            )?,
        ),
        ("cube", out(&cube, &[&x], 0)?),
        ("cube_grad", out(&g1, &[&x], 0)?),
        (
            "cube_grad_grad",
            out(&e(grad(&outer, None, false))?, &[&x], 0)?,
        ),
        (
            "cube_vmap_generated",
            out(&e(vmap(&cube_row, &[Some(0)], 2, None))?, &[&x], 0)?,
        ),
    ])
}

#[allow(dead_code)]
fn main() -> R<()> {
    let backend = if std::env::args().any(|a| a == "--reference") {
        Backend::Reference
    } else {
        Backend::Gpu
    };
    let vals = values(backend)?;
    let rows = |t: &RTensor| -> Vec<Vec<f64>> {
        t.values()
            .chunks(t.sizes()[1])
            .map(|c| c.to_vec())
            .collect()
    };
    if std::env::args().any(|a| a == "--json") {
        let m: serde_json::Map<String, serde_json::Value> = vals
            .iter()
            .map(|(k, t)| (k.to_string(), serde_json::json!(rows(t))))
            .collect();
        println!("{}", serde_json::Value::Object(m));
        return Ok(());
    }
    for (k, t) in &vals {
        println!("{k:20} {:?}", rows(t));
    }
    Ok(())
}
