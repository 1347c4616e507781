//! Function transforms from program to program (`docs/transforms.md`):
//! `vjp`, `jvp`, `grad` and `vmap`, each the meaning of its `torch.func`
//! namesake for the function a program computes. A program is first
//! functionalized (views and mutations removed, a `copy_` epilogue for
//! mutated parameters); the transform rewrites the pure body with each
//! op's rules from the op table (`ops::derivatives`, `ops::batching`) and
//! puts the epilogue back. Results are programs like any other, so
//! transforms compose (`vmap(grad(f))`), and fuse, run and export.

pub mod emit;

use crate::error::{Error, Result};
use crate::graph::{Graph, NodeId, Results, ValueId};
use crate::ops::OpId;
use crate::pass::{functionalize_decomposed, Remove};
use crate::schema::Arg;
use emit::{t, Emitter, R};

pub use crate::rule::{Batch, BatchFn, Call, Emit, Grads, JvpFn, Tangents, VjpFn};
use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};

/// A program prepared for a transform: functionalized, its `copy_`
/// epilogue held apart as (parameter index, final value).
struct Prepared {
    g: Graph,
    body: Vec<NodeId>,
    epilogue: Vec<(usize, ValueId)>,
}

impl Prepared {
    fn new(g: &Graph) -> Result<Prepared> {
        let f = functionalize_decomposed(g, Remove::MutationsAndViews)?;
        let g = f.graph;
        let copy_ = crate::ops::lookup("copy_").expect("copy_ is in the table");
        let mut body = vec![];
        let mut epilogue = vec![];
        for &n in &g.order {
            let node = &g.nodes[n];
            let param = match node.args.first() {
                Some(Arg::Tensor(v)) => g.inputs.iter().position(|p| p == v),
                _ => None,
            };
            match (node.op == copy_, param, node.args.get(1)) {
                (true, Some(i), Some(Arg::Tensor(v))) => epilogue.push((i, *v)),
                _ => body.push(n),
            }
        }
        Ok(Prepared { g, body, epilogue })
    }

    fn param_name(&self, i: usize) -> String {
        self.g.values[self.g.inputs[i]]
            .name
            .as_deref()
            .map_or_else(|| format!("#{i}"), str::to_string)
    }

    /// Parameter indices for `--wrt` names (default: every floating one).
    fn wrt(&self, transform: &str, names: Option<&[String]>) -> Result<Vec<usize>> {
        let err = |msg: String| Error::Statement {
            line: None,
            stmt: format!("{transform} --wrt"),
            msg,
        };
        let Some(names) = names else {
            return Ok((0..self.g.inputs.len())
                .filter(|&i| self.g.meta(self.g.inputs[i]).dtype.is_float())
                .collect());
        };
        let mut out = vec![];
        for n in names {
            let i = (0..self.g.inputs.len())
                .find(|&i| self.param_name(i) == *n)
                .ok_or_else(|| {
                    let all: Vec<String> = (0..self.g.inputs.len())
                        .map(|i| self.param_name(i))
                        .collect();
                    err(format!(
                        "no parameter `{n}` (parameters: {})",
                        all.join(", ")
                    ))
                })?;
            let d = self.g.meta(self.g.inputs[i]).dtype;
            if !d.is_float() {
                return Err(err(format!(
                    "parameter `{n}` is {d}: only floating point (f32, f16) parameters have derivatives"
                )));
            }
            if out.contains(&i) {
                return Err(err(format!("parameter `{n}` is named twice")));
            }
            out.push(i);
        }
        Ok(out)
    }

    /// An error about body node `n` of this program.
    fn node_error(&self, n: NodeId, transform: &str, msg: String) -> Error {
        let names = crate::text::Names::of(&self.g);
        Error::Statement {
            line: self.g.nodes[n].line,
            stmt: crate::text::fmt_node(&self.g, n, &names),
            msg: format!("{transform}: {msg}"),
        }
    }
}

/// The prepared program's parameters and body copied into a new graph:
/// the value map and, per emitted node, the source node it came from.
struct Copied {
    e: Emitter,
    map: HashMap<ValueId, ValueId>,
    origin: HashMap<NodeId, NodeId>,
}

fn copy_params(p: &Prepared, name: &str, metas: impl Fn(usize) -> crate::meta::Meta) -> Copied {
    let mut e = Emitter::new(name);
    let mut map = HashMap::default();
    for (i, &v) in p.g.inputs.iter().enumerate() {
        let nv = e.g.add_input(p.g.values[v].name.clone(), metas(i));
        map.insert(v, nv);
    }
    Copied {
        e,
        map,
        origin: HashMap::default(),
    }
}

fn mapped_args(map: &HashMap<ValueId, ValueId>, args: &[Arg<ValueId>]) -> Vec<Arg<ValueId>> {
    args.iter().map(|a| a.map(&mut |v| map[v])).collect()
}

impl Copied {
    /// Emits source node `n` (or finds its equal): its results.
    fn node(&mut self, p: &Prepared, n: NodeId) -> Result<Results> {
        let node = &p.g.nodes[n];
        let args = mapped_args(&self.map, &node.args);
        let rs = self
            .e
            .call_id(node.op, args)
            .map_err(|m| p.node_error(n, "transform", m))?;
        for (&old, &new) in node.results.iter().zip(&rs) {
            self.map.insert(old, new);
            if self.e.g.values[new].name.is_none() {
                self.e.g.values[new].name = p.g.values[old].name.clone();
            }
        }
        if let Some(nn) = self.e.g.node_of(rs[0]) {
            self.origin.entry(nn).or_insert(n);
        }
        Ok(rs)
    }

    /// Adds a parameter named `name` (a fresh name if taken).
    fn param(&mut self, name: &str, meta: crate::meta::Meta) -> ValueId {
        self.e.g.add_input(Some(name.into()), meta)
    }

    /// The epilogue back: `copy_(param, value)` for each mutated parameter.
    fn epilogue(
        &mut self,
        p: &Prepared,
        value: impl Fn(&mut Self, usize, ValueId) -> Result<ValueId>,
    ) -> Result<()> {
        for &(i, v) in &p.epilogue {
            let nv = value(self, i, self.map[&v])?;
            let param = self.e.g.inputs[i];
            self.e
                .call("copy_", vec![t(param), t(nv)])
                .map_err(|m| Error::Statement {
                    line: None,
                    stmt: "copy_ epilogue".into(),
                    msg: m,
                })?;
        }
        Ok(())
    }

    fn finish(mut self, outputs: Vec<ValueId>) -> Graph {
        self.e.g.outputs = outputs;
        crate::simplify::eliminate_dead_code(&mut self.e.g);
        self.e.g
    }
}

/// Values that depend on the parameters in `wrt` through floating values.
fn active(e: &Emitter, roots: &[ValueId]) -> HashSet<ValueId> {
    let mut act: HashSet<ValueId> = roots.iter().copied().collect();
    for &n in &e.g.order {
        let node = &e.g.nodes[n];
        if node.inputs().iter().any(|v| act.contains(v)) {
            for &r in &node.results {
                if e.meta(r).dtype.is_float() {
                    act.insert(r);
                }
            }
        }
    }
    act
}

/// Reverse mode over the copied body: gradients of the active values from
/// the seeds (value, cotangent).
fn backward(
    p: &Prepared,
    c: &mut Copied,
    transform: &str,
    seeds: &[(ValueId, ValueId)],
    act: &HashSet<ValueId>,
) -> Result<HashMap<ValueId, ValueId>> {
    let mut grads: HashMap<ValueId, ValueId> = HashMap::default();
    let accumulate =
        |e: &mut Emitter, grads: &mut HashMap<ValueId, ValueId>, v: ValueId, g: ValueId| -> R<()> {
            let g = if e.sizes(g) != e.sizes(v) || e.dtype(g) != e.dtype(v) {
                e.sum_like(g, v)?
            } else {
                g
            };
            let sum = match grads.get(&v) {
                Some(&old) => e.add(old, g)?,
                None => g,
            };
            grads.insert(v, sum);
            Ok(())
        };
    for &(v, ct) in seeds {
        if act.contains(&v) {
            accumulate(&mut c.e, &mut grads, v, ct).map_err(|m| Error::Statement {
                line: None,
                stmt: "output".into(),
                msg: m,
            })?;
        }
    }
    let forward: Vec<NodeId> = c.e.g.order.clone();
    for &n in forward.iter().rev() {
        let node = c.e.g.nodes[n].clone();
        let gs: Vec<Option<ValueId>> = node.results.iter().map(|r| grads.get(r).copied()).collect();
        if gs.iter().all(Option::is_none) || !node.inputs().iter().any(|v| act.contains(v)) {
            continue;
        }
        let src = c.origin.get(&n).copied();
        let fail = |m: String| match src {
            Some(s) => p.node_error(s, transform, m),
            None => Error::Statement {
                line: None,
                stmt: node.op.name().into(),
                msg: format!("{transform}: {m}"),
            },
        };
        let call = Call {
            op: node.op,
            overload: node.overload,
            args: &node.args,
            outs: &node.results,
        };
        let out = match &node.op.def().custom {
            Some(f) => custom_vjp(&mut c.e, f.as_ref(), &call, &gs).map_err(&fail)?,
            None => {
                let rule = node.op.def().rules.vjp.ok_or_else(|| {
                    fail(format!(
                        "`{}` has no derivative rule (its gradient is not implemented)",
                        node.op.name()
                    ))
                })?;
                rule(&mut c.e, &call, &gs).map_err(&fail)?
            }
        };
        for (pos, j, g) in out {
            let v = match (&node.args[pos], j) {
                (Arg::Tensor(v), None) => *v,
                (Arg::TensorList(l), Some(j)) => match l.get(j).copied().flatten() {
                    Some(v) => v,
                    None => continue,
                },
                _ => {
                    return Err(fail(
                        "internal error: a gradient for a non-tensor argument".into(),
                    ))
                }
            };
            if act.contains(&v) {
                accumulate(&mut c.e, &mut grads, v, g).map_err(&fail)?;
            }
        }
    }
    Ok(grads)
}

/// A custom function's VJP: `setup_context`, then its `backward`.
fn custom_vjp(
    e: &mut Emitter,
    f: &dyn crate::function::Function,
    c: &Call,
    gs: &[Option<ValueId>],
) -> R<Grads> {
    let mut ctx = crate::function::Ctx::default();
    f.setup_context(&mut ctx, c.args, c.outs)?;
    for (k, g) in gs.iter().enumerate() {
        if g.is_some() && ctx.is_non_differentiable(k) {
            return Err(format!(
                "custom function `{}`: output {k} is marked non-differentiable but a gradient flows into it",
                c.op.name()
            ));
        }
    }
    let grads = f.backward(e, &ctx, gs).ok_or_else(|| {
        format!(
            "custom function `{}` has no backward rule (needed by vjp and grad)",
            c.op.name()
        )
    })??;
    if grads.len() != c.args.len() {
        return Err(format!(
            "custom function `{}`: backward returned {} gradients for {} arguments",
            c.op.name(),
            grads.len(),
            c.args.len()
        ));
    }
    let mut out = vec![];
    for (pos, g) in grads.into_iter().enumerate() {
        if let (Some(g), Arg::Tensor(_)) = (g, &c.args[pos]) {
            out.push((pos, None, g));
        }
    }
    Ok(out)
}

/// A custom function's JVP: `setup_context`, then its `jvp`.
fn custom_jvp(
    e: &mut Emitter,
    f: &dyn crate::function::Function,
    c: &Call,
    ts: &Tangents,
) -> R<Vec<Option<ValueId>>> {
    let mut ctx = crate::function::Ctx::default();
    f.setup_context(&mut ctx, c.args, c.outs)?;
    let per_arg: Vec<Option<ValueId>> = (0..c.args.len()).map(|i| ts.get(i)).collect();
    let r = f.jvp(e, &ctx, &per_arg).ok_or_else(|| {
        format!(
            "custom function `{}` has no jvp rule (needed by jvp)",
            c.op.name()
        )
    })??;
    if r.len() != c.outs.len() {
        return Err(format!(
            "custom function `{}`: jvp returned {} tangents for {} outputs",
            c.op.name(),
            r.len(),
            c.outs.len()
        ));
    }
    Ok(r)
}

fn floating_outputs(g: &Graph) -> Vec<usize> {
    (0..g.outputs.len())
        .filter(|&k| g.meta(g.outputs[k]).dtype.is_float())
        .collect()
}

/// `vjp`: parameters, then `%ct_K` per floating output K; returns the
/// outputs, then the gradient of each `wrt` parameter.
pub fn vjp(g: &Graph, wrt: Option<&[String]>) -> Result<Graph> {
    let p = Prepared::new(g)?;
    let wrt = p.wrt("vjp", wrt)?;
    let mut c = copy_params(&p, &g.name, |i| (*p.g.values[p.g.inputs[i]].meta).clone());
    let cts: Vec<(usize, ValueId)> = floating_outputs(&p.g)
        .into_iter()
        .map(|k| {
            let m = (*p.g.values[p.g.outputs[k]].meta).clone();
            (
                k,
                c.param(
                    &format!("ct_{k}"),
                    crate::meta::Meta::contiguous(m.dtype, m.sizes),
                ),
            )
        })
        .collect();
    for &n in &p.body {
        c.node(&p, n)?;
    }
    let roots: Vec<ValueId> = wrt.iter().map(|&i| c.e.g.inputs[i]).collect();
    let act = active(&c.e, &roots);
    let seeds: Vec<(ValueId, ValueId)> = cts
        .iter()
        .map(|&(k, ct)| (c.map[&p.g.outputs[k]], ct))
        .collect();
    let grads = backward(&p, &mut c, "vjp", &seeds, &act)?;
    let mut outs: Vec<ValueId> = p.g.outputs.iter().map(|v| c.map[v]).collect();
    for &r in &roots {
        outs.push(gradient_or_zeros(&mut c, &grads, r)?);
    }
    c.epilogue(&p, |_, _, v| Ok(v))?;
    Ok(c.finish(outs))
}

fn gradient_or_zeros(
    c: &mut Copied,
    grads: &HashMap<ValueId, ValueId>,
    r: ValueId,
) -> Result<ValueId> {
    let g = match grads.get(&r) {
        Some(&g) => g,
        None => c.e.zeros_like(r).map_err(|m| Error::Statement {
            line: None,
            stmt: "gradient".into(),
            msg: m,
        })?,
    };
    Ok(g)
}

/// `grad`: the gradient of the first output (0-d floating) for each `wrt`
/// parameter; with `has_aux`, then the other outputs.
pub fn grad(g: &Graph, wrt: Option<&[String]>, has_aux: bool) -> Result<Graph> {
    let p = Prepared::new(g)?;
    let wrt = p.wrt("grad", wrt)?;
    let refuse = |msg: String| Error::Statement {
        line: None,
        stmt: "grad".into(),
        msg,
    };
    let Some(&out0) = p.g.outputs.first() else {
        return Err(refuse(
            "the program returns nothing: grad needs a 0-d floating point first output".into(),
        ));
    };
    let m = p.g.meta(out0);
    if m.dim() != 0 || !m.dtype.is_float() {
        return Err(refuse(format!(
            "grad needs the first output to be a 0-d floating point tensor (a loss); it is {}",
            m.type_string()
        )));
    }
    let dtype = m.dtype;
    let mut c = copy_params(&p, &g.name, |i| (*p.g.values[p.g.inputs[i]].meta).clone());
    for &n in &p.body {
        c.node(&p, n)?;
    }
    let roots: Vec<ValueId> = wrt.iter().map(|&i| c.e.g.inputs[i]).collect();
    let act = active(&c.e, &roots);
    let one =
        c.e.call("ones", vec![Arg::IntList(vec![]), Arg::Dtype(dtype)])
            .map_err(refuse)?;
    let loss = c.map[&out0];
    let grads = backward(&p, &mut c, "grad", &[(loss, one)], &act)?;
    let mut outs = vec![];
    for &r in &roots {
        outs.push(gradient_or_zeros(&mut c, &grads, r)?);
    }
    if has_aux {
        outs.extend(p.g.outputs[1..].iter().map(|v| c.map[v]));
    }
    c.epilogue(&p, |_, _, v| Ok(v))?;
    Ok(c.finish(outs))
}

/// `jvp`: parameters, then `%t_NAME` per `wrt` parameter; returns the
/// outputs, then a tangent per floating output.
pub fn jvp(g: &Graph, wrt: Option<&[String]>) -> Result<Graph> {
    let p = Prepared::new(g)?;
    let wrt = p.wrt("jvp", wrt)?;
    let mut c = copy_params(&p, &g.name, |i| (*p.g.values[p.g.inputs[i]].meta).clone());
    let mut tan: HashMap<ValueId, ValueId> = HashMap::default();
    for &i in &wrt {
        let m = (*p.g.values[p.g.inputs[i]].meta).clone();
        let tv = c.param(&format!("t_{}", p.param_name(i)), m);
        tan.insert(c.e.g.inputs[i], tv);
    }
    for &n in &p.body {
        let rs = c.node(&p, n)?;
        if rs.iter().any(|r| tan.contains_key(r)) {
            continue; // an equal node was emitted (and differentiated) before
        }
        let node = &p.g.nodes[n];
        let args = mapped_args(&c.map, &node.args);
        if !args
            .iter()
            .any(|a| a.tensors().iter().any(|v| tan.contains_key(v)))
        {
            continue;
        }
        if !rs.iter().any(|&r| c.e.dtype(r).is_float()) {
            continue;
        }
        let call = Call {
            op: node.op,
            overload: node.overload,
            args: &args,
            outs: &rs,
        };
        let tangents = Tangents::new(&tan, &args);
        let ts = match &node.op.def().custom {
            Some(f) => custom_jvp(&mut c.e, f.as_ref(), &call, &tangents),
            None => {
                let rule = node.op.def().rules.jvp.ok_or_else(|| {
                    p.node_error(
                        n,
                        "jvp",
                        format!("`{}` has no forward derivative rule", node.op.name()),
                    )
                })?;
                rule(&mut c.e, &call, &tangents)
            }
        }
        .map_err(|m| p.node_error(n, "jvp", m))?;
        for (&r, tv) in rs.iter().zip(ts) {
            if let Some(tv) = tv {
                if c.e.dtype(r).is_float() {
                    let tv = c.e.fit(tv, r).map_err(|m| p.node_error(n, "jvp", m))?;
                    tan.insert(r, tv);
                }
            }
        }
    }
    let mut outs: Vec<ValueId> = p.g.outputs.iter().map(|v| c.map[v]).collect();
    for k in floating_outputs(&p.g) {
        let r = c.map[&p.g.outputs[k]];
        outs.push(gradient_or_zeros(&mut c, &tan, r)?);
    }
    c.epilogue(&p, |_, _, v| Ok(v))?;
    Ok(c.finish(outs))
}

/// Builds batched programs: values carry the batch dimension at 0 or not
/// at all; `call` runs an op's batching rule when an argument is batched.
pub struct Batcher {
    pub e: Emitter,
    pub size: usize,
    batched: HashSet<ValueId>,
}

impl Batch for Batcher {
    fn e(&mut self) -> &mut dyn Emit {
        &mut self.e
    }
    fn e_ref(&self) -> &dyn Emit {
        &self.e
    }
    fn size(&self) -> usize {
        self.size
    }
    fn is_batched(&self, v: ValueId) -> bool {
        self.batched.contains(&v)
    }
    fn mark(&mut self, v: ValueId, batched: bool) -> ValueId {
        if batched {
            self.batched.insert(v);
        }
        v
    }
    /// `op(args)`: the op itself when nothing is batched, else its rule.
    fn call_id(&mut self, op: OpId, args: Vec<Arg<ValueId>>) -> R<Vec<(ValueId, bool)>> {
        let any = args
            .iter()
            .any(|a| a.tensors().iter().any(|v| self.is_batched(**v)));
        if !any {
            let rs = self.e.call_id(op, args)?;
            return Ok(rs.into_iter().map(|r| (r, false)).collect());
        }
        let (overload, args) = crate::ops::bind(op, &args)?;
        if let Some(f) = &op.def().custom {
            return self.custom_batch(f.as_ref(), op, &args);
        }
        let rule = op
            .def()
            .rules
            .batch
            .ok_or_else(|| format!("`{}` has no batching rule", op.name()))?;
        let outs: Vec<ValueId> = vec![];
        let call = Call {
            op,
            overload,
            args: &args,
            outs: &outs,
        };
        let rs = rule(self, &call)?;
        for &(r, b) in &rs {
            self.mark(r, b);
        }
        Ok(rs)
    }

    fn call_all(&mut self, name: &str, args: Vec<Arg<ValueId>>) -> R<Vec<(ValueId, bool)>> {
        let op = crate::ops::lookup(name).ok_or_else(|| format!("internal error: no op {name}"))?;
        self.call_id(op, args)
    }
}

impl Batcher {
    /// A custom function's call: its own `vmap` rule, or its forward
    /// written with Kiln ops batched (`generate_vmap_rule`).
    fn custom_batch(
        &mut self,
        f: &dyn crate::function::Function,
        op: OpId,
        args: &[Arg<ValueId>],
    ) -> R<Vec<(ValueId, bool)>> {
        let in_dims: Vec<Option<usize>> = args
            .iter()
            .map(|a| match a {
                Arg::Tensor(v) if self.is_batched(*v) => Some(0),
                _ => None,
            })
            .collect();
        let info = crate::function::VmapInfo {
            batch_size: self.size,
        };
        if let Some(r) = f.vmap(self, &info, &in_dims, args) {
            let (outs, dims) = r?;
            if outs.len() != dims.len() {
                return Err(format!(
                    "{}: the vmap rule returned {} outputs and {} out-dims",
                    op.name(),
                    outs.len(),
                    dims.len()
                ));
            }
            let mut res = vec![];
            for (v, d) in outs.into_iter().zip(dims) {
                res.push(match d {
                    Some(d) => {
                        let v0 = self.movedim(v, d, 0)?;
                        (self.mark(v0, true), true)
                    }
                    None => (v, false),
                });
            }
            return Ok(res);
        }
        if f.generate_vmap_rule() {
            let outs = f.forward_ops(self, args).ok_or_else(|| {
                format!(
                    "{}: generate_vmap_rule needs a forward written with Kiln ops (forward_ops)",
                    op.name()
                )
            })??;
            return Ok(outs.into_iter().map(|v| (v, self.is_batched(v))).collect());
        }
        Err(format!(
            "custom function `{}` has no vmap rule: give it `vmap` or set `generate_vmap_rule`",
            op.name()
        ))
    }
}

/// `vmap` with one in-dim per parameter (`None`: not batched) and an
/// out-dim per output (default 0).
pub fn vmap(
    g: &Graph,
    in_dims: &[Option<i64>],
    size: usize,
    out_dims: Option<&[i64]>,
) -> Result<Graph> {
    let p = Prepared::new(g)?;
    let refuse = |msg: String| Error::Statement {
        line: None,
        stmt: "vmap".into(),
        msg,
    };
    let n = p.g.inputs.len();
    if in_dims.len() != n {
        return Err(refuse(format!(
            "{} in-dims given for {n} parameters: give one per parameter (an integer or none)",
            in_dims.len()
        )));
    }
    if size == 0 {
        return Err(refuse("the batch size must be at least 1".into()));
    }
    let mut dims = vec![None; n];
    for (i, d) in in_dims.iter().enumerate() {
        if let Some(d) = *d {
            let r = p.g.meta(p.g.inputs[i]).dim();
            let w = crate::meta::wrap_dim(d, r + 1)
                .map_err(|m| refuse(format!("in-dim of parameter `{}`: {m}", p.param_name(i))))?;
            dims[i] = Some(w);
        }
    }
    if dims.iter().all(Option::is_none) {
        return Err(refuse(
            "vmap needs at least one batched parameter (every in-dim is none)".into(),
        ));
    }
    let c = copy_params(&p, &g.name, |i| {
        let m = p.g.meta(p.g.inputs[i]);
        let mut s = m.sizes.to_vec();
        if let Some(d) = dims[i] {
            s.insert(d, size);
        }
        crate::meta::Meta::contiguous(m.dtype, s)
    });
    let Copied { e, mut map, .. } = c;
    let mut b = Batcher {
        e,
        size,
        batched: HashSet::default(),
    };
    for (i, &d) in dims.iter().enumerate() {
        if let Some(d) = d {
            let v = b.e.g.inputs[i];
            let v0 = b.movedim(v, d, 0).map_err(refuse)?;
            b.mark(v0, true);
            map.insert(p.g.inputs[i], v0);
        }
    }
    for &nid in &p.body {
        let node = &p.g.nodes[nid];
        let args = mapped_args(&map, &node.args);
        let rs = b
            .call_id(node.op, args)
            .map_err(|m| p.node_error(nid, "vmap", m))?;
        for (&old, &(new, _)) in node.results.iter().zip(&rs) {
            map.insert(old, new);
        }
    }
    let out_dims: Vec<i64> = match out_dims {
        Some(o) if o.len() == p.g.outputs.len() => o.to_vec(),
        Some(o) if o.len() == 1 => vec![o[0]; p.g.outputs.len()],
        Some(o) => {
            return Err(refuse(format!(
                "{} out-dims given for {} outputs: give one per output, or one for all",
                o.len(),
                p.g.outputs.len()
            )))
        }
        None => vec![0; p.g.outputs.len()],
    };
    let mut outs = vec![];
    for (k, &v) in p.g.outputs.iter().enumerate() {
        let nv = map[&v];
        let r = b.lrank(nv);
        let od = crate::meta::wrap_dim(out_dims[k], r + 1)
            .map_err(|m| refuse(format!("out-dim of output {k}: {m}")))?;
        let x = b
            .materialize(nv)
            .and_then(|x| b.movedim(x, 0, od))
            .map_err(refuse)?;
        outs.push(x);
    }
    for &(i, v) in &p.epilogue {
        let nv = map[&v];
        let value = match dims[i] {
            Some(d) => b.materialize(nv).and_then(|x| b.movedim(x, 0, d)).map_err(refuse)?,
            None if b.is_batched(nv) => {
                return Err(refuse(format!(
                    "parameter `{}` is not batched (in-dim none) but the program writes a batched value into it; \
                     batch it (give it an in-dim) or do not mutate it",
                    p.param_name(i)
                )))
            }
            None => nv,
        };
        let param = b.e.g.inputs[i];
        b.e.call("copy_", vec![t(param), t(value)])
            .map_err(refuse)?;
    }
    let mut g = b.e.g;
    g.outputs = outs;
    crate::simplify::eliminate_dead_code(&mut g);
    Ok(g)
}

/// Appends `callee`'s statements to `g` with its parameters bound to
/// `args` (a program called from a program): the values of its outputs.
/// A `copy_` epilogue of the callee writes into the argument it was given.
pub fn inline(g: &mut Graph, callee: &Graph, args: &[ValueId]) -> R<Vec<ValueId>> {
    let mut e = Emitter::wrap(std::mem::take(g));
    let r = inline_into(&mut e, callee, args);
    *g = e.g;
    r
}

fn inline_into(e: &mut Emitter, g: &Graph, args: &[ValueId]) -> R<Vec<ValueId>> {
    let mut map: HashMap<ValueId, ValueId> =
        g.inputs.iter().copied().zip(args.iter().copied()).collect();
    for &n in &g.order {
        let node = &g.nodes[n];
        let a = mapped_args(&map, &node.args);
        let rs = e.call_id(node.op, a)?;
        for (&old, &new) in node.results.iter().zip(&rs) {
            map.insert(old, new);
        }
    }
    Ok(g.outputs.iter().map(|v| map[v]).collect())
}

/// `n` by `n` identity of `dtype`, viewed as `[n, *shape]`.
fn basis(e: &mut Emitter, shape: &[usize], dtype: crate::DType) -> R<ValueId> {
    let n: usize = shape.iter().product();
    let i = e.call(
        "arange",
        vec![emit::int(n as i64), Arg::Dtype(crate::DType::I64)],
    )?;
    let col = e.view(i, &[n, 1])?;
    let row = e.view(i, &[1, n])?;
    let eye = e.call("eq", vec![t(col), t(row)])?;
    let eye = e.cast(eye, dtype)?;
    let mut s = vec![n];
    s.extend_from_slice(shape);
    e.view(eye, &s)
}

fn jacobian_error(m: String) -> Error {
    Error::Statement {
        line: None,
        stmt: "jacobian".into(),
        msg: m,
    }
}

/// A new program over `g`'s parameters: the emitter and the parameters.
fn over_params(g: &Graph) -> (Emitter, Vec<ValueId>) {
    let mut e = Emitter::new(&g.name);
    let params = g
        .inputs
        .iter()
        .map(|&x| {
            e.g.add_input(g.values[x].name.clone(), (*g.values[x].meta).clone())
        })
        .collect();
    (e, params)
}

/// `prog` (over the parameters, then one extra parameter per `seeds`:
/// cotangents or tangents) batched over a basis of seed `which`, the other
/// seeds zero, inlined into `e`: its outputs, batch first.
fn over_basis(
    e: &mut Emitter,
    prog: &Graph,
    params: &[ValueId],
    seeds: &[crate::Meta],
    which: usize,
) -> Result<Vec<ValueId>> {
    let n: usize = seeds[which].sizes.iter().product();
    let mut dims = vec![None; params.len() + seeds.len()];
    dims[params.len() + which] = Some(0);
    let b = vmap(prog, &dims, n.max(1), None)?;
    let mut args = params.to_vec();
    for (k, m) in seeds.iter().enumerate() {
        let seed = if k == which {
            basis(e, &m.sizes, m.dtype)
        } else {
            e.zeros(&m.sizes, m.dtype)
        };
        args.push(seed.map_err(jacobian_error)?);
    }
    inline_into(e, &b, &args).map_err(jacobian_error)
}

/// The Jacobians of `g` by reverse mode (`torch.func.jacrev`): for each
/// floating output K and each `wrt` parameter P, in that order, a tensor of
/// shape `out_K.shape + P.shape`. Built as `vmap(vjp)` over a basis of
/// cotangents.
pub fn jacrev(g: &Graph, wrt: Option<&[String]>) -> Result<Graph> {
    let v = vjp(g, wrt)?;
    let p = Prepared::new(g)?;
    let wrt_idx = p.wrt("jacrev", wrt)?;
    let outs: Vec<crate::Meta> = floating_outputs(&p.g)
        .iter()
        .map(|&k| p.g.meta(p.g.outputs[k]).clone())
        .collect();
    let (mut e, params) = over_params(g);
    let mut jac = vec![];
    for (j, om) in outs.iter().enumerate() {
        let r = over_basis(&mut e, &v, &params, &outs, j)?;
        for (w, &i) in wrt_idx.iter().enumerate() {
            let mut s = om.sizes.to_vec();
            s.extend(g.meta(g.inputs[i]).sizes.iter());
            jac.push(e.view(r[g.outputs.len() + w], &s).map_err(jacobian_error)?);
        }
    }
    e.g.outputs = jac;
    crate::simplify::eliminate_dead_code(&mut e.g);
    Ok(e.g)
}

/// The Jacobians of `g` by forward mode (`torch.func.jacfwd`), in
/// `jacrev`'s order and shapes: `vmap(jvp)` over a basis of tangents.
pub fn jacfwd(g: &Graph, wrt: Option<&[String]>) -> Result<Graph> {
    let j = jvp(g, wrt)?;
    let p = Prepared::new(g)?;
    let wrt_idx = p.wrt("jacfwd", wrt)?;
    let tangents: Vec<crate::Meta> = wrt_idx
        .iter()
        .map(|&i| g.meta(g.inputs[i]).clone())
        .collect();
    let (mut e, params) = over_params(g);
    // cols[w][j]: the Jacobian of floating output j by parameter w, `[n_w, *out]`.
    let mut cols = vec![];
    for w in 0..wrt_idx.len() {
        cols.push(over_basis(&mut e, &j, &params, &tangents, w)?[g.outputs.len()..].to_vec());
    }
    let mut jac = vec![];
    for (jj, &k) in floating_outputs(&p.g).iter().enumerate() {
        let om = p.g.meta(p.g.outputs[k]).clone();
        for (w, pm) in tangents.iter().enumerate() {
            // [n, *out] -> [*out, n] -> [*out, *param]
            let c = cols[w][jj];
            let r = e.rank(c);
            let perm: Vec<usize> = (1..r).chain([0]).collect();
            let moved = e.permute(c, &perm).map_err(jacobian_error)?;
            let mut s = om.sizes.to_vec();
            s.extend(pm.sizes.iter());
            jac.push(e.view(moved, &s).map_err(jacobian_error)?);
        }
    }
    e.g.outputs = jac;
    crate::simplify::eliminate_dead_code(&mut e.g);
    Ok(e.g)
}

/// The Hessian of a program whose first output is a 0-d loss
/// (`torch.func.hessian`): `jacfwd(jacrev)`, one `[*P, *Q]` block per pair
/// of `wrt` parameters.
pub fn hessian(g: &Graph, wrt: Option<&[String]>) -> Result<Graph> {
    let gr = grad(g, wrt, false)?;
    jacfwd(&gr, wrt)
}

/// A training step (SGD): `grad` of the loss (`g`'s first output, 0-d)
/// with respect to `wrt`, then `w.sub_(grad, alpha=lr)` on each of those
/// parameters — in-place writes that functionalization turns into the
/// `copy_` epilogue, so a runtime keeps the updated weights where they
/// are. The step's parameters are `g`'s; it returns the loss.
pub fn sgd_step(g: &Graph, wrt: &[String], lr: f64) -> Result<Graph> {
    // The loss twice: `grad` returns the second (aux) copy beside the
    // gradients.
    let mut l = g.clone();
    let loss = *l.outputs.first().ok_or_else(|| Error::Statement {
        line: None,
        stmt: "sgd_step".into(),
        msg: "the program returns nothing: a training step needs a 0-d loss first".into(),
    })?;
    l.outputs = vec![loss, loss];
    let gr = grad(&l, Some(wrt), true)?;
    let (mut step, params) = {
        let (e, params) = over_params(g);
        (e.g, params)
    };
    step.name = format!("{}_sgd_step", g.name);
    let fail = |m: String| Error::Statement {
        line: None,
        stmt: "sgd_step".into(),
        msg: m,
    };
    let r = inline(&mut step, &gr, &params).map_err(fail)?;
    let p = Prepared::new(g)?;
    let idx = p.wrt("sgd_step", Some(wrt))?;
    let sub_ = crate::ops::lookup("sub_").ok_or_else(|| fail("no sub_ op".into()))?;
    for (k, &i) in idx.iter().enumerate() {
        step.call(sub_, &[t(params[i]), t(r[k]), Arg::Float(lr)])
            .map_err(fail)?;
    }
    step.outputs = vec![r[idx.len()]];
    Ok(step)
}

impl crate::function::Ops for Emitter {
    fn op(&mut self, name: &str, args: Vec<Arg<ValueId>>) -> R<Vec<ValueId>> {
        Ok(self.call_all(name, args)?.to_vec())
    }
}

impl crate::function::Ops for Batcher {
    fn op(&mut self, name: &str, args: Vec<Arg<ValueId>>) -> R<Vec<ValueId>> {
        Ok(self
            .call_all(name, args)?
            .into_iter()
            .map(|(v, _)| v)
            .collect())
    }
}
