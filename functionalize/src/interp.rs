//! The eager reference interpreter: runs a graph on the CPU with real
//! storage sharing, the meaning every other backend is checked against.
//!
//! Views share storage; in-place ops compute their functional form and write
//! it through the mutated view, so every alias sees the change. Writes whose
//! result would depend on the order elements are visited in (a view whose
//! elements overlap, an input that overlaps the written tensor at other
//! positions) are refused, as eager PyTorch refuses most of them.

use crate::error::{Error, Result};
use crate::graph::{Graph, NodeId, ValueId};
use crate::meta::Meta;
use crate::ops::{self, args::metas, OpKind, Rule};
use crate::schema::Arg;
use crate::tensor::{buffer_bytes, RTensor, Storage};
use crate::text::{fmt_node, Names};
use std::collections::{HashMap, HashSet};
use std::rc::{Rc, Weak};

/// What a run returns.
pub struct RunResult {
    pub outputs: Vec<RTensor>,
    /// Every parameter's final value (mutations included).
    pub inputs: Vec<RTensor>,
    /// The most bytes of storage alive at once, as eager execution holds
    /// them: a storage is freed when no live value refers to it.
    pub peak_bytes: usize,
}

/// Runs `g` on `inputs` (one per parameter, matching its dtype and shape).
/// The reference holds every element as an f64: a result needing more
/// than the machine's memory is refused before anything is allocated.
fn check_memory(m: &Meta) -> std::result::Result<(), String> {
    let bytes = m.storage_numel.saturating_mul(8);
    let limit = memory_limit();
    if bytes > limit {
        return Err(format!(
            "the result {} needs {} of memory in the reference interpreter (8 bytes an element); \
             this machine has {}",
            m.type_string(),
            human_bytes(bytes),
            human_bytes(limit)
        ));
    }
    Ok(())
}

/// Physical memory (Linux: `MemTotal`), else 16 GiB.
fn memory_limit() -> usize {
    static LIMIT: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *LIMIT.get_or_init(|| {
        std::fs::read_to_string("/proc/meminfo")
            .ok()
            .and_then(|t| {
                let line = t.lines().find(|l| l.starts_with("MemTotal:"))?;
                let kib: usize = line.split_whitespace().nth(1)?.parse().ok()?;
                kib.checked_mul(1024)
            })
            .unwrap_or(16 << 30)
    })
}

fn human_bytes(b: usize) -> String {
    const GIB: f64 = (1u64 << 30) as f64;
    if b as f64 >= GIB {
        format!("{:.1} GiB", b as f64 / GIB)
    } else {
        format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64)
    }
}

pub fn run(g: &Graph, inputs: Vec<RTensor>) -> Result<RunResult> {
    if inputs.len() != g.inputs.len() {
        return Err(Error::Input {
            name: g.name.clone(),
            msg: format!(
                "the graph takes {} inputs, {} were given",
                g.inputs.len(),
                inputs.len()
            ),
        });
    }
    let names = Names::of(g);
    let mut env: HashMap<ValueId, RTensor> = HashMap::new();
    let mut live = Tracker::default();
    for (&v, t) in g.inputs.iter().zip(&inputs) {
        let want = &g.values[v].meta;
        if t.meta.dtype != want.dtype || t.meta.sizes != want.sizes {
            return Err(Error::Input {
                name: names.get(v),
                msg: format!(
                    "expected {}, got {}",
                    want.type_string(),
                    t.meta.type_string()
                ),
            });
        }
        live.add(&t.storage);
        env.insert(v, t.clone());
    }
    let last = g.last_uses();
    let keep: HashSet<ValueId> = g.inputs.iter().chain(&g.outputs).copied().collect();
    let mut peak = live.bytes();
    for (pos, &n) in g.order.iter().enumerate() {
        let node = &g.nodes[n];
        let args: Vec<Arg<RTensor>> = node
            .args
            .iter()
            .map(|a| a.map(&mut |v| env[v].clone()))
            .collect();
        for &r in &node.results {
            check_memory(g.meta(r)).map_err(|msg| Error::Runtime {
                line: node.line,
                stmt: fmt_node(g, n, &names),
                msg,
            })?;
        }
        let outs = eval_node(g, n, &args).map_err(|msg| Error::Runtime {
            line: node.line,
            stmt: fmt_node(g, n, &names),
            msg,
        })?;
        drop(args);
        for (&r, t) in node.results.iter().zip(outs) {
            live.add(&t.storage);
            env.insert(r, t);
        }
        peak = peak.max(live.bytes());
        // Drop values nobody reads any more.
        for v in node
            .inputs()
            .into_iter()
            .chain(node.results.iter().copied())
        {
            if !keep.contains(&v) && last.get(v).is_none_or(|&l| l <= pos) {
                env.remove(&v);
            }
        }
    }
    let outputs = g.outputs.iter().map(|v| env[v].clone()).collect();
    let inputs = g.inputs.iter().map(|v| env[v].clone()).collect();
    Ok(RunResult {
        outputs,
        inputs,
        peak_bytes: peak,
    })
}

/// The peak bytes of live storage eager execution of `g` holds, computed
/// from the graph alone (the same accounting as `run`'s `peak_bytes`:
/// views and in-place results share their input's storage; a storage is
/// freed when no live value refers to it).
pub fn eager_peak_bytes(g: &Graph) -> usize {
    let mut storage: HashMap<ValueId, usize> = HashMap::new();
    let mut bytes: Vec<usize> = vec![];
    let fresh = |m: &Meta, bytes: &mut Vec<usize>| {
        bytes.push(buffer_bytes(m.storage_numel, m.dtype));
        bytes.len() - 1
    };
    for &v in &g.inputs {
        let s = fresh(g.meta(v), &mut bytes);
        storage.insert(v, s);
    }
    let last = g.last_uses();
    let keep: HashSet<ValueId> = g.inputs.iter().chain(&g.outputs).copied().collect();
    let mut refs: HashMap<usize, usize> = HashMap::new();
    for v in g.inputs.iter() {
        *refs.entry(storage[v]).or_default() += 1;
    }
    let live = |refs: &HashMap<usize, usize>, bytes: &[usize]| {
        refs.iter()
            .filter(|(_, &c)| c > 0)
            .map(|(&s, _)| bytes[s])
            .sum::<usize>()
    };
    let mut peak = live(&refs, &bytes);
    for (pos, &n) in g.order.iter().enumerate() {
        let node = &g.nodes[n];
        let def = node.op.def();
        let aliases = match &def.rule {
            Rule::View(_) | Rule::InPlace(_) => true,
            Rule::ViewOrCopy(f) => {
                let m: Vec<Arg<&Meta>> = node
                    .args
                    .iter()
                    .map(|a| a.map(&mut |v| g.meta(*v)))
                    .collect();
                f(&m).map(|r| r.1).unwrap_or(false)
            }
            _ => false,
        };
        for &r in &node.results {
            let s = match (aliases, node.args.first()) {
                (true, Some(Arg::Tensor(t))) => {
                    // `resize_` grows the storage.
                    let m = g.meta(r);
                    let s = storage[t];
                    bytes[s] = bytes[s].max(buffer_bytes(m.storage_numel, m.dtype));
                    s
                }
                _ => fresh(g.meta(r), &mut bytes),
            };
            storage.insert(r, s);
            *refs.entry(s).or_default() += 1;
        }
        peak = peak.max(live(&refs, &bytes));
        let mut dead: Vec<ValueId> = node.inputs().into_vec();
        dead.extend(node.results.iter().copied());
        dead.sort();
        dead.dedup();
        for v in dead {
            if !keep.contains(&v) && last.get(v).is_none_or(|&l| l <= pos) {
                if let Some(s) = storage.remove(&v) {
                    *refs.entry(s).or_default() -= 1;
                }
            }
        }
    }
    peak
}

/// Storages still referenced by some value.
#[derive(Default)]
struct Tracker(Vec<Weak<Storage>>);

impl Tracker {
    fn add(&mut self, s: &Rc<Storage>) {
        if !self.0.iter().any(|w| w.as_ptr() == Rc::as_ptr(s)) {
            self.0.push(Rc::downgrade(s));
        }
    }
    fn bytes(&mut self) -> usize {
        self.0.retain(|w| w.strong_count() > 0);
        self.0
            .iter()
            .filter_map(|w| w.upgrade())
            .map(|s| s.bytes())
            .sum()
    }
}

/// Evaluates one node on runtime tensors.
pub fn eval_node(
    g: &Graph,
    n: NodeId,
    args: &[Arg<RTensor>],
) -> std::result::Result<Vec<RTensor>, String> {
    let node = &g.nodes[n];
    let outs: Vec<Meta> = node
        .results
        .iter()
        .map(|&r| (*g.values[r].meta).clone())
        .collect();
    eval(node.op, args, &outs)
}

/// Evaluates `op` on bound arguments whose results have metas `outs`.
pub fn eval(
    op: ops::OpId,
    args: &[Arg<RTensor>],
    outs: &[Meta],
) -> std::result::Result<Vec<RTensor>, String> {
    let def = op.def();
    let this = || match args.first() {
        Some(Arg::Tensor(t)) => Ok(t.clone()),
        _ => Err("internal error: op without a tensor self".to_string()),
    };
    match &def.rule {
        Rule::View(_) => {
            let t = this()?;
            // `resize_` beyond the storage grows it, for every alias.
            let need = outs.iter().map(|m| m.storage_numel).max().unwrap_or(0);
            let mut data = t.storage.data.borrow_mut();
            if data.len() < need {
                data.resize(need, 0.0);
            }
            drop(data);
            Ok(outs.iter().map(|m| t.view(m.clone())).collect())
        }
        Rule::ViewOrCopy(f) => {
            let t = this()?;
            let (m, aliases) = f(&metas(args))?;
            Ok(vec![if aliases {
                t.view(m)
            } else {
                RTensor::from_values(m, &t.values())
            }])
        }
        Rule::Pointwise(plan) => {
            let am = metas(args);
            let p = plan(&am)?;
            let vals = run_pointwise(&p, args, &outs[0].sizes)?;
            Ok(vec![RTensor::from_values(outs[0].clone(), &vals)])
        }
        Rule::ViewCopy(v) => {
            let am = metas(args);
            let views = eval(*v, args, &ops::infer(*v, &am)?)?;
            Ok(views
                .into_iter()
                .zip(outs)
                .map(|(t, om)| RTensor::from_values(om.clone(), &t.values()))
                .collect())
        }
        Rule::Scatter(view) => ops::kernels::scatter_eval(args, outs, *view),
        Rule::Composite(f) => ops::composite::eval(op, *f, args, outs, &|o, a, m| eval(o, a, m)),
        Rule::InPlace(f) => {
            let t = this()?;
            check_hazards(&t, args, *f)?;
            let am = metas(args);
            let fouts = ops::infer(*f, &am)?;
            let r = eval(*f, args, &fouts)?;
            t.write(&r[0].values());
            Ok(vec![t])
        }
        Rule::Kernel { eval, .. } => {
            debug_assert!(def.kind != OpKind::View);
            eval(args, outs)
        }
        Rule::Custom => {
            let f = def
                .custom
                .as_ref()
                .ok_or("internal error: a custom op without its function")?;
            // The forward sees copies, and may not write them: custom
            // functions are functional.
            let copies: Vec<Arg<RTensor>> = args
                .iter()
                .map(|a| {
                    a.map(&mut |t: &RTensor| {
                        RTensor::new(t.dtype(), t.sizes().to_vec(), &t.values())
                    })
                })
                .collect();
            let r = f.forward(&copies)?;
            let bits = |t: &RTensor| t.values().iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            for (j, (a, c)) in args.iter().zip(&copies).enumerate() {
                // Every tensor of the argument, lists included.
                let (mut given, mut seen) = (vec![], vec![]);
                a.each_tensor(&mut |t| given.push(t));
                c.each_tensor(&mut |t| seen.push(t));
                if given.iter().zip(&seen).any(|(t, c)| bits(t) != bits(c)) {
                    return Err(format!(
                        "custom function {}: forward wrote its argument {j}; custom functions are \
                         functional (return a new tensor instead)",
                        def.name
                    ));
                }
            }
            if r.len() != outs.len()
                || r.iter()
                    .zip(outs)
                    .any(|(t, m)| t.dtype() != m.dtype || t.sizes() != &m.sizes[..])
            {
                return Err(format!(
                    "custom function {}: forward returned {:?}, its shape rule says {:?}",
                    def.name,
                    r.iter().map(|t| t.meta.type_string()).collect::<Vec<_>>(),
                    outs.iter().map(|m| m.type_string()).collect::<Vec<_>>()
                ));
            }
            // Fresh contiguous results, whatever layout forward made.
            Ok(r.iter()
                .zip(outs)
                .map(|(t, m)| RTensor::from_values(m.clone(), &t.values()))
                .collect())
        }
    }
}

/// Reads every operand broadcast to `shape` and applies the plan.
pub fn run_pointwise(
    p: &ops::pointwise::PwPlan,
    args: &[Arg<RTensor>],
    shape: &[usize],
) -> std::result::Result<Vec<f64>, String> {
    use crate::ops::pointwise::Src;
    let n = crate::meta::numel(shape);
    let cols: Vec<Vec<f64>> = p
        .operands
        .iter()
        .map(|o| match o.src {
            Src::Arg(i) => match &args[i] {
                Arg::Tensor(t) => Ok(t
                    .values_broadcast(shape)
                    .into_iter()
                    .map(|v| o.cast.cast(v))
                    .collect()),
                _ => Err("internal error: pointwise operand is not a tensor".to_string()),
            },
            Src::Const { value, .. } => Ok(vec![value; n]),
        })
        .collect::<std::result::Result<_, _>>()?;
    let mut xs = vec![0.0; cols.len()];
    let mut out = Vec::with_capacity(n);
    for i in 0..n {
        for (x, c) in xs.iter_mut().zip(&cols) {
            *x = c[i];
        }
        out.push(p.out_dtype.cast((p.f)(&xs)?));
    }
    Ok(out)
}

/// Runs `ops::write_hazard` for every tensor operand that shares `this`'s
/// storage.
fn check_hazards(
    this: &RTensor,
    args: &[Arg<RTensor>],
    functional: ops::OpId,
) -> std::result::Result<(), String> {
    let gathered = ops::reads_gathered(functional);
    for a in args.iter().skip(1) {
        for t in a.tensors() {
            if t.shares_storage(this) && ops::write_hazard(&this.meta, &t.meta, gathered) {
                return Err(ops::HAZARD_MESSAGE.into());
            }
        }
    }
    Ok(())
}
