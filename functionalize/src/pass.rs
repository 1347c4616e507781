//! Functionalization: rewrite a graph with views and in-place mutations into
//! one that computes the same outputs and the same final inputs with no
//! mutation (but a `copy_` epilogue into mutated inputs) and, in
//! `MutationsAndViews` mode, no view (every tensor contiguous).
//!
//! Every tensor of the source graph is an *alias*: a storage plus the chain
//! of view steps from the storage's base. A storage has a generation that
//! each mutation bumps; an alias remembers the value it had at the last
//! generation it saw.
//!
//! - A view extends the chain (in views mode its value is a `<view>_copy`).
//! - A mutation `op_(v, ...)` computes the functional op on `v`'s current
//!   value, writes it back into the base by walking the chain backwards
//!   with each step's inverse (`slice` -> `slice_scatter`, `transpose` ->
//!   `transpose`, ...), and bumps the generation.
//! - A read of an alias that is behind regenerates it from the base.
//! - Chains PyTorch's inverses get wrong (through `expand`, overlapping
//!   `unfold`, `as_strided` on a view) are written back in storage
//!   coordinates with one `as_strided_scatter`: `as_strided` offsets always
//!   refer to the whole storage, and in the new graph a base keeps the
//!   layout (strides, offset, storage size) it had in the source graph.

use crate::error::{Error, Result};
use crate::graph::{Graph, Name, NodeId, ValueId, ValueMap};
use crate::meta::{wrap_dim, Meta};
use crate::ops::layout::is_non_overlapping_and_dense;
use crate::ops::{self, Inverse, OpId, OpKind, Rule};
use crate::schema::Arg;
use crate::text::{fmt_node, Names};
use rustc_hash::FxHashMap as HashMap;
use std::rc::Rc;
use std::sync::Arc;

// The mode lives with the verifier, which checks what each mode leaves
// (so the pass depends on the verifier, not both ways).
pub use crate::verify::Remove;

/// A parameter the program mutates, and the value holding its final
/// contents (for runtimes that write inputs back themselves instead of
/// running the `copy_` epilogue).
#[derive(Clone, Debug, PartialEq)]
pub struct MutatedInput {
    pub input: usize,
    pub value: ValueId,
}

#[derive(Debug)]
pub struct Functionalized {
    pub graph: Graph,
    pub mutated_inputs: Vec<MutatedInput>,
}

/// A view chain: the steps from a storage's base to a view, as a list of
/// links from the view back to the base. Chains share their prefixes:
/// extending one allocates a single link.
#[derive(Clone, Debug, Default)]
struct Chain(Option<Rc<Link>>);

#[derive(Debug)]
struct Link {
    step: Step,
    parent: Chain,
    /// The interned id of the chain ending here (`Pass::extend_prefix`).
    id: u32,
}

impl Chain {
    fn is_empty(&self) -> bool {
        self.0.is_none()
    }

    /// The chain's id: 0 for the empty chain.
    fn id(&self) -> u32 {
        self.0.as_ref().map_or(0, |l| l.id)
    }

    /// `self` extended by `step`, whose chain has id `id`.
    fn push(&self, step: Step, id: u32) -> Chain {
        Chain(Some(Rc::new(Link {
            step,
            parent: self.clone(),
            id,
        })))
    }

    /// The links from the base on: `links()[k - 1].id` is the id of the
    /// first `k` steps.
    fn links(&self) -> smallvec::SmallVec<[&Link; 8]> {
        let mut out = smallvec::SmallVec::new();
        let mut c = self;
        while let Some(l) = &c.0 {
            out.push(&**l);
            c = &l.parent;
        }
        out.reverse();
        out
    }
}

/// One view step: the op, its non-self arguments, which result it takes.
#[derive(Clone, Debug)]
struct Step {
    op: OpId,
    /// Shared by the steps of one multi-result view.
    args: Rc<[Arg<ValueId>]>,
    index: usize,
    /// The result's metadata in the source graph (shared with it).
    meta: Arc<Meta>,
    /// The source call this step copies (None: synthesized).
    source: Option<Rc<Source>>,
    /// The interned id of the call, op and arguments (`Pass::step_sig`):
    /// equal calls have equal ids.
    sig: u32,
}

/// A source view call, as far as emitting a copy of it needs: the overload
/// that bound it, its input's metadata and its results' (reused when the
/// copy's input has the same).
#[derive(Debug)]
struct Source {
    overload: usize,
    input: Arc<Meta>,
    results: smallvec::SmallVec<[Arc<Meta>; 2]>,
}

/// A view call's key among interned ones: its op, then its arguments'
/// `encode_arg` words (inline when short).
type StepKey = smallvec::SmallVec<[u64; 10]>;

impl Step {
    fn new(
        op: OpId,
        args: Rc<[Arg<ValueId>]>,
        index: usize,
        meta: Arc<Meta>,
        source: Option<Rc<Source>>,
        sig: u32,
    ) -> Step {
        Step {
            op,
            args,
            index,
            meta,
            source,
            sig,
        }
    }
}

/// Appends words that tell `a` apart from every other argument: a tag,
/// then the payload (floats by their bits, lists by length and items).
fn encode_arg(a: &Arg<ValueId>, k: &mut StepKey) {
    use slotmap::Key;
    match a {
        Arg::Tensor(v) => k.extend([0, v.data().as_ffi()]),
        Arg::TensorList(l) => {
            k.extend([1, l.len() as u64]);
            k.extend(l.iter().map(|x| x.map_or(0, |v| v.data().as_ffi())));
        }
        Arg::Int(i) => k.extend([2, *i as u64]),
        Arg::Float(f) => k.extend([3, f.to_bits()]),
        Arg::Bool(b) => k.extend([4, *b as u64]),
        Arg::Str(s) => {
            k.extend([5, s.len() as u64]);
            k.extend(s.bytes().map(u64::from));
        }
        Arg::Dtype(d) => k.extend([6, *d as u64]),
        Arg::IntList(l) => {
            k.extend([7, l.len() as u64]);
            k.extend(l.iter().map(|&i| i as u64));
        }
        Arg::None => k.push(8),
        Arg::List(l) => {
            k.extend([9, l.len() as u64]);
            for x in l {
                encode_arg(x, k);
            }
        }
    }
}

#[derive(Clone, Debug)]
struct Alias {
    storage: usize,
    chain: Chain,
    gen: u64,
    /// The value at generation `gen` (None: must be regenerated).
    current: Option<ValueId>,
}

struct StorageState {
    /// The base's value at the current generation, in the new graph.
    base: ValueId,
    /// The base's metadata in the source graph.
    base_meta: Arc<Meta>,
    gen: u64,
    input: Option<usize>,
    /// `Mutations` mode: the last value of the base laid out as in the
    /// source graph, when `base` is not (a write-back through a copy that
    /// changed the layout). Restored lazily, only when something reads it.
    layout: Option<ValueId>,
    /// A view of it was taken (`resize_` cannot grow it then).
    viewed: bool,
}

/// Views regenerated from a storage's base, by generation and chain
/// prefix. A write-back reads the old generation while it builds the new
/// one; older generations are dropped, so the cache stays as small as the
/// live views.
#[derive(Default)]
struct Cache(HashMap<usize, Generations>);

/// The newest generation cached, and values by (generation, prefix id).
type Generations = (u64, HashMap<(u64, u32), ValueId>);

impl Cache {
    fn get(&self, storage: usize, gen: u64, key: u32) -> Option<ValueId> {
        self.0
            .get(&storage)
            .and_then(|(_, m)| m.get(&(gen, key)).copied())
    }

    fn insert(&mut self, storage: usize, gen: u64, key: u32, v: ValueId) {
        let (newest, m) = self
            .0
            .entry(storage)
            .or_insert_with(|| (gen, HashMap::default()));
        if gen > *newest {
            *newest = gen;
            m.retain(|(g, _), _| g + 1 >= gen);
        }
        m.insert((gen, key), v);
    }
}

struct Pass {
    mode: Remove,
    out: Graph,
    aliases: ValueMap<Alias>,
    /// Interned view calls (`step_sig`).
    step_sigs: HashMap<StepKey, u32>,
    /// Interned view-chain prefixes by parent, call and result index
    /// (`extend_prefix`).
    prefixes: HashMap<(u32, u32, u32), u32>,
    storages: Vec<StorageState>,
    cache: Cache,
    /// FX-style result names: base name -> its slot in `uses` (ops sharing
    /// a base, `add` and `add_`, share a count).
    names: HashMap<Name, usize>,
    /// Per slot: the base name and the results named after it so far.
    uses: Vec<(Name, usize)>,
    /// Per op (by id): its base name's slot, plus one (0: not seen yet).
    op_slots: Vec<u32>,
    /// Emitted results' names as (slot in `uses` plus one, count), by value
    /// slot (`graph::slot_index`; 0: none): written once dead code is gone
    /// (most emitted values do not survive it).
    pending_names: Vec<(u32, u32)>,
    /// The source statement being rewritten, and its line (for messages).
    at: Option<NodeId>,
    at_line: Option<usize>,
    /// Composite ops are emitted as their parts.
    decompose: bool,
}

/// Functionalizes `g`. Errors name the statement that cannot be
/// functionalized (writes whose result would depend on visiting order).
/// Composite ops (`conv2d`, ...) stay, as in PyTorch's functionalization.
pub fn functionalize(g: &Graph, mode: Remove) -> Result<Functionalized> {
    run(Functionalizer::new(mode, g.order.len()), g)
}

/// `functionalize`, with every composite op replaced by its parts (nested
/// ones too): the program the compiler and the transforms read.
pub fn functionalize_decomposed(g: &Graph, mode: Remove) -> Result<Functionalized> {
    let mut f = Functionalizer::new(mode, g.order.len());
    f.pass.decompose = true;
    run(f, g)
}

fn run(mut f: Functionalizer, g: &Graph) -> Result<Functionalized> {
    for &n in &g.order {
        if !f.node(g, n) {
            break;
        }
    }
    f.finish(g)
}

/// Functionalization statement by statement, as a graph grows (see
/// `text::parse_with`): `node` for each node in program order, then
/// `finish` once the graph is whole.
pub struct Functionalizer {
    pass: Pass,
    started: bool,
    /// The first error, and the statement it is about.
    failed: Option<(Error, Option<NodeId>)>,
}

impl Functionalizer {
    /// For a graph of about `statements` statements.
    pub fn new(mode: Remove, statements: usize) -> Functionalizer {
        let pass = Pass {
            mode,
            out: Graph::with_capacity("", 2 * statements),
            // Sized up front: growing them copies every entry at each doubling.
            aliases: ValueMap::with_capacity(statements + statements / 4),
            step_sigs: HashMap::default(),
            prefixes: HashMap::default(),
            storages: Vec::with_capacity(statements / 2),
            cache: Cache::default(),
            names: HashMap::default(),
            uses: vec![],
            op_slots: vec![],
            pending_names: Vec::with_capacity(3 * statements),
            at: None,
            at_line: None,
            decompose: false,
        };
        Functionalizer {
            pass,
            started: false,
            failed: None,
        }
    }

    fn start(&mut self, g: &Graph) {
        if self.started {
            return;
        }
        self.started = true;
        let p = &mut self.pass;
        p.out.name = g.name.clone();
        for (i, &v) in g.inputs.iter().enumerate() {
            let meta = g.values[v].meta.clone();
            let nv = p.out.add_input(g.values[v].name.clone(), (*meta).clone());
            // Emitted results are named after ops: only given names can clash.
            if let Some(name) = &g.values[v].name {
                let slot = p.name_slot(name);
                p.uses[slot].1 = 1;
            }
            p.new_storage(v, nv, meta, Some(i));
        }
    }

    /// Functionalizes node `n` of `g`, the next in program order; false
    /// once a statement failed (the error comes from `finish`).
    pub fn node(&mut self, g: &Graph, n: NodeId) -> bool {
        if self.failed.is_some() {
            return false;
        }
        self.start(g);
        let p = &mut self.pass;
        p.at = Some(n);
        p.at_line = g.nodes[n].line;
        if let Err(e) = p.node(g, n) {
            self.failed = Some((e, Some(n)));
            return false;
        }
        true
    }

    /// The outputs, the `copy_` epilogue, dead code removed: the result
    /// for `g`, the graph whose nodes were all given to `node`.
    pub fn finish(self, g: &Graph) -> Result<Functionalized> {
        self.finish_pruned(g)?.verified()
    }

    /// `finish`, but dead nodes are only taken out of the order (see
    /// `Pruned`).
    pub fn finish_pruned(mut self, g: &Graph) -> Result<Pruned> {
        if let Some((e, at)) = self.failed {
            return Err(match (e, at) {
                // Named only now: the statement's names are those of the
                // whole graph.
                (Error::Statement { line, msg, .. }, Some(n)) => Error::Statement {
                    line,
                    stmt: fmt_node(g, n, &Names::of(g)),
                    msg,
                },
                (e, _) => e,
            });
        }
        self.start(g);
        let mut p = self.pass;
        p.at = None;
        p.at_line = None;
        // An output that is a base needs its values, not its source layout.
        let outputs = g
            .outputs
            .iter()
            .map(|&v| match p.alias(v)? {
                a if a.chain.is_empty() => Ok(p.storages[a.storage].base),
                _ => p.read(v),
            })
            .collect::<Result<Vec<_>>>()?;
        p.out.outputs = outputs;
        // The epilogue: write every mutated parameter's final value back.
        let mut mutated = vec![];
        for s in 0..p.storages.len() {
            if let (Some(i), true) = (p.storages[s].input, p.storages[s].gen > 0) {
                let value = p.storages[s].base;
                let input = p.out.inputs[i];
                p.emit("copy_", vec![Arg::Tensor(input), Arg::Tensor(value)])?;
                mutated.push(MutatedInput { input: i, value });
            }
        }
        let mut graph = p.out;
        let dead = crate::simplify::prune_dead_code(&mut graph);
        for &n in &graph.order {
            for &r in &graph.nodes[n].results {
                let name = p.pending_names.get(crate::graph::slot_index(r));
                if let Some(&(slot @ 1.., k)) = name {
                    let name = fx_name(&p.uses[slot as usize - 1].0, k);
                    graph.values[r].name = Some(name);
                }
            }
        }
        Ok(Pruned {
            graph,
            mutated_inputs: mutated,
            dead,
            mode: p.mode,
        })
    }
}

/// A functionalized graph whose dead nodes are out of the order but still
/// in the arena, not yet verified: `print` it, or make it a
/// `Functionalized` with `verified`. Freeing the dead nodes costs about as
/// much as printing, and a command that prints and exits need not.
#[derive(Debug)]
pub struct Pruned {
    graph: Graph,
    mutated_inputs: Vec<MutatedInput>,
    dead: Vec<NodeId>,
    mode: Remove,
}

impl Pruned {
    fn verify(&self) -> Result<()> {
        crate::verify::verify_functional(&self.graph, self.mode).map_err(|msg| Error::Statement {
            line: None,
            stmt: "functionalize".into(),
            msg: format!("internal error: the result fails verification: {msg}"),
        })
    }

    /// Verified, dead nodes freed.
    pub fn verified(self) -> Result<Functionalized> {
        self.verify()?;
        let mut graph = self.graph;
        crate::simplify::sweep(&mut graph, self.dead);
        Ok(Functionalized {
            graph,
            mutated_inputs: self.mutated_inputs,
        })
    }

    /// The program as text (`text::print`), once verified: for a large
    /// graph, verification and part of the printing run on a second thread.
    pub fn print(&self) -> Result<String> {
        let (text, verified) = crate::text::print_beside(&self.graph, || self.verify());
        verified?;
        Ok(text)
    }
}

/// Parses and functionalizes a program at once: each statement is
/// functionalized as soon as its node is built, while later ones are still
/// being parsed (`text::parse_with`). Errors as `parse`, then
/// `functionalize`, would give: a parse error anywhere comes first. Gives
/// the source graph and the result, to print or make `verified`.
pub fn parse_functionalized(src: &str, mode: Remove) -> Result<(Graph, Pruned)> {
    let lines = crate::text::line_count(src);
    let mut f = Functionalizer::new(mode, lines);
    let g = crate::text::parse_lines(src, lines, |g, n| {
        f.node(g, n);
    })?;
    let r = f.finish_pruned(&g)?;
    Ok((g, r))
}

/// Where a composite's decomposition emits: the pass's new graph.
struct Parts<'a>(&'a mut Pass);

impl crate::rule::Emit for Parts<'_> {
    fn meta(&self, v: ValueId) -> &Meta {
        self.0.out.meta(v)
    }
    fn call_id(
        &mut self,
        op: OpId,
        args: Vec<Arg<ValueId>>,
    ) -> std::result::Result<crate::graph::Results, String> {
        let p = &mut *self.0;
        let def = op.def();
        // Without views, a part that is a view is its copy (values are
        // contiguous, so `reshape` is `view_copy` and `contiguous` nothing).
        let (op, args) = match (p.mode, def.kind) {
            (_, OpKind::InPlace) => {
                return Err(format!(
                    "internal error: a decomposition writes with {}",
                    def.name
                ))
            }
            (Remove::MutationsAndViews, OpKind::View | OpKind::MultiView) => {
                p.view_call(op, args).map_err(|e| e.to_string())?
            }
            (Remove::MutationsAndViews, OpKind::ViewOrCopy) if def.name == "contiguous" => {
                return match args.first() {
                    Some(Arg::Tensor(v)) => Ok(smallvec::smallvec![*v]),
                    _ => Err("internal error: contiguous without a tensor".into()),
                };
            }
            (Remove::MutationsAndViews, OpKind::ViewOrCopy) => (p.view_op(op), args),
            _ => (op, args),
        };
        p.emit_as(op, None, args).map_err(|e| e.to_string())
    }
    fn call_all(
        &mut self,
        name: &str,
        args: Vec<Arg<ValueId>>,
    ) -> std::result::Result<crate::graph::Results, String> {
        let op = ops::lookup(name).ok_or_else(|| format!("internal error: no op {name}"))?;
        self.call_id(op, args)
    }
}

/// FX's name for the `k`-th value named after `base`: `base`, `base_1`, ...
fn fx_name(base: &str, k: u32) -> Name {
    if k == 0 {
        return Name::from(base);
    }
    let mut digits = itoa::Buffer::new();
    let digits = digits.format(k);
    // `base_k` built in place: one copy into the name.
    let mut buf = [0u8; 64];
    let n = base.len() + 1 + digits.len();
    match buf.get_mut(..n) {
        Some(b) => {
            b[..base.len()].copy_from_slice(base.as_bytes());
            b[base.len()] = b'_';
            b[base.len() + 1..].copy_from_slice(digits.as_bytes());
            Name::from_utf8(b).expect("ASCII name")
        }
        None => Name::from(format!("{base}_{digits}")),
    }
}

/// Traces `f` (see [`crate::trace`]) and functionalizes the result.
pub fn functionalize_traced(
    name: &str,
    specs: &[crate::trace::TensorSpec],
    f: impl FnOnce(&[crate::trace::Tensor]) -> Vec<crate::trace::Tensor>,
    mode: Remove,
) -> Result<Functionalized> {
    functionalize(&crate::trace::trace(name, specs, f)?, mode)
}

impl Pass {
    /// An error about the statement being rewritten (`Functionalizer`
    /// names it), or about the outputs.
    fn err(&self, msg: impl Into<String>) -> Error {
        match self.at {
            Some(_) => Error::Statement {
                line: self.at_line,
                stmt: String::new(),
                msg: msg.into(),
            },
            None => Error::Statement {
                line: None,
                stmt: "return".into(),
                msg: msg.into(),
            },
        }
    }

    fn new_storage(
        &mut self,
        src: ValueId,
        value: ValueId,
        base_meta: Arc<Meta>,
        input: Option<usize>,
    ) {
        self.storages.push(StorageState {
            base: value,
            base_meta,
            gen: 0,
            input,
            layout: None,
            viewed: false,
        });
        let a = Alias {
            storage: self.storages.len() - 1,
            chain: Chain::default(),
            gen: 0,
            current: Some(value),
        };
        self.aliases.insert(src, a);
    }

    /// Appends `op(args)` to the new graph, naming results FX-style.
    fn emit_id(&mut self, op: OpId, args: Vec<Arg<ValueId>>) -> Result<crate::graph::Results> {
        self.emit_as(op, None, args)
    }

    /// `emit_id`, with `args` already bound by overload `bound` when given
    /// (a source node's own arguments, read).
    fn emit_as(
        &mut self,
        op: OpId,
        bound: Option<usize>,
        args: Vec<Arg<ValueId>>,
    ) -> Result<crate::graph::Results> {
        if let (Rule::Composite(f), true) = (&op.def().rule, self.decompose) {
            return self.expand(op, *f, args);
        }
        let res = match bound {
            Some(overload) => self.out.call_bound(op, overload, args),
            None => self.out.call(op, &args),
        }
        .map_err(|m| self.err(format!("internal error while emitting {}: {m}", op.name())))?;
        self.finish_emit(op, &res);
        Ok(res)
    }

    /// Appends source node `n`'s call on `args` (its values replaced): when
    /// they have the metadata its own arguments had, its results' metadata
    /// is reused rather than inferred again.
    fn emit_copy_of(
        &mut self,
        src: &Graph,
        n: NodeId,
        args: Vec<Arg<ValueId>>,
    ) -> Result<crate::graph::Results> {
        let node = &src.nodes[n];
        let mut ins: smallvec::SmallVec<[&Arc<Meta>; 4]> = smallvec::SmallVec::new();
        for a in &node.args {
            a.each_tensor(&mut |&v| ins.push(&src.values[v].meta));
        }
        let results = node.results.iter().map(|&r| src.values[r].meta.clone());
        self.emit_copy(node.op, node.overload, args, &ins, results)
    }

    /// Appends `op(args)` bound by `overload`, a copy of a source call whose
    /// tensors had metadata `ins` and whose results `results`: those are
    /// reused when the tensors of `args` have the same, else inferred.
    fn emit_copy(
        &mut self,
        op: OpId,
        overload: usize,
        args: Vec<Arg<ValueId>>,
        ins: &[&Arc<Meta>],
        results: impl Iterator<Item = Arc<Meta>>,
    ) -> Result<crate::graph::Results> {
        if self.decompose && matches!(op.def().rule, Rule::Composite(_)) {
            return self.emit_as(op, Some(overload), args);
        }
        let results = if self.same_input_metas(ins, &args) {
            results.collect()
        } else if self.contiguous_pointwise(op, ins, &args) {
            self.contiguous_results(op, &args, results)
        } else {
            return self.emit_as(op, Some(overload), args);
        };
        Ok(self.emit_inferred(op, overload, args, results))
    }

    /// Composite `op`'s parts in its place (nested composites expand in
    /// turn): the program the compiler and the transforms read has none.
    fn expand(
        &mut self,
        op: OpId,
        f: ops::composite::DecompFn,
        args: Vec<Arg<ValueId>>,
    ) -> Result<crate::graph::Results> {
        let (overload, bound) = ops::bind(op, &args).map_err(|m| self.err(m))?;
        let name = &op.def().schemas[overload].overload;
        let mut parts = Parts(self);
        let res =
            f(&mut parts, name, &bound).map_err(|m| self.err(format!("{}: {m}", op.name())))?;
        Ok(res.into_iter().collect())
    }

    /// Appends `op(args)` bound by `overload`, with `results` known.
    fn emit_inferred(
        &mut self,
        op: OpId,
        overload: usize,
        args: Vec<Arg<ValueId>>,
        results: smallvec::SmallVec<[Arc<Meta>; 2]>,
    ) -> crate::graph::Results {
        let res = self.out.call_inferred(op, overload, args, results);
        self.finish_emit(op, &res);
        res
    }

    /// Do the tensors of `out_args` (new graph) have the metadata `src`, in
    /// order?
    fn same_input_metas(&self, src: &[&Arc<Meta>], out_args: &[Arg<ValueId>]) -> bool {
        let (mut i, mut same) = (0, true);
        for a in out_args {
            a.each_tensor(&mut |&v| {
                let m = &self.out.values[v].meta;
                same &= src.get(i).is_some_and(|s| Arc::ptr_eq(s, m) || ***s == **m);
                i += 1;
            });
        }
        same && i == src.len()
    }

    /// Views mode: is `op` elementwise, and are the tensors of `out_args`
    /// contiguous with the sizes and dtypes `src` had, in order? Then its
    /// results are the source call's, contiguous: TensorIterator lays the
    /// output out in the inputs' order.
    fn contiguous_pointwise(
        &self,
        op: OpId,
        src: &[&Arc<Meta>],
        out_args: &[Arg<ValueId>],
    ) -> bool {
        if self.mode != Remove::MutationsAndViews || !matches!(op.def().rule, Rule::Pointwise(_)) {
            return false;
        }
        let (mut i, mut ok) = (0, true);
        for a in out_args {
            a.each_tensor(&mut |&v| {
                let m = self.out.meta(v);
                ok &= m.is_dense_contiguous()
                    && src
                        .get(i)
                        .is_some_and(|s| s.sizes == m.sizes && s.dtype == m.dtype);
                i += 1;
            });
        }
        ok && i == src.len()
    }

    /// A source call's `results`, contiguous: those of `op(args)` when
    /// `contiguous_pointwise` or `is_copy_of` holds. Debug builds (the
    /// test suite) check them against inference.
    fn contiguous_results(
        &mut self,
        op: OpId,
        args: &[Arg<ValueId>],
        results: impl Iterator<Item = Arc<Meta>>,
    ) -> smallvec::SmallVec<[Arc<Meta>; 2]> {
        let out: smallvec::SmallVec<[Arc<Meta>; 2]> = results
            .map(|m| {
                if m.is_dense_contiguous() {
                    m
                } else {
                    self.out
                        .metas
                        .intern(Meta::contiguous(m.dtype, m.sizes.clone()))
                }
            })
            .collect();
        if cfg!(debug_assertions) {
            let metas: Vec<Arg<&Meta>> = args
                .iter()
                .map(|a| a.map(&mut |v| self.out.meta(*v)))
                .collect();
            let inferred = ops::infer(op, &metas);
            let same = inferred
                .as_ref()
                .is_ok_and(|i| i.iter().eq(out.iter().map(|m| &**m)));
            assert!(
                same,
                "{}: {inferred:?} inferred, {out:?} assumed",
                op.name()
            );
        }
        out
    }

    /// Names the results of the node just emitted and gives it the source
    /// statement's line.
    fn finish_emit(&mut self, op: OpId, res: &[ValueId]) {
        // What a statement becomes keeps its source line (for later errors).
        if let (Some(_), Some(node)) = (self.at, self.out.order.last()) {
            self.out.nodes[*node].line = self.at_line;
        }
        let i = op.0 as usize;
        if i >= self.op_slots.len() {
            self.op_slots.resize(i + 1, 0);
        }
        let slot = match self.op_slots[i] {
            0 => {
                // Named after the op (a custom function's name without its
                // namespace).
                let name = op.name();
                let base = match name.bytes().rposition(|b| b == b':') {
                    Some(i) => &name[i + 1..],
                    None => name,
                }
                .trim_end_matches('_');
                let slot = self.name_slot(base);
                self.op_slots[i] = slot as u32 + 1;
                slot
            }
            s => s as usize - 1,
        };
        for &r in res {
            let k = &mut self.uses[slot].1;
            let i = crate::graph::slot_index(r);
            if i >= self.pending_names.len() {
                let n = (i + 1).max(2 * self.pending_names.len());
                self.pending_names.resize(n, (0, 0));
            }
            self.pending_names[i] = (slot as u32 + 1, *k as u32);
            *k += 1;
        }
    }

    /// The slot counting the results named after `base`.
    fn name_slot(&mut self, base: &str) -> usize {
        let next = self.uses.len();
        let slot = *self.names.entry(Name::from(base)).or_insert(next);
        if slot == next {
            self.uses.push((Name::from(base), 0));
        }
        slot
    }

    fn emit(&mut self, op: &str, args: Vec<Arg<ValueId>>) -> Result<ValueId> {
        let id = ops::lookup(op).ok_or_else(|| self.err(format!("internal error: no op {op}")))?;
        Ok(self.emit_id(id, args)?.remove(0))
    }

    fn alias(&self, v: ValueId) -> Result<Alias> {
        self.aliases
            .get(v)
            .cloned()
            .ok_or_else(|| self.err("internal error: value read before it is defined"))
    }

    /// The op that computes a view step's value: the view itself, or its
    /// `_copy` form in views mode.
    fn view_op(&self, op: OpId) -> OpId {
        match self.mode {
            Remove::Mutations => op,
            Remove::MutationsAndViews => op.def().counterpart.unwrap_or(op),
        }
    }

    /// The op and arguments computing view `op` on `args`: the view itself,
    /// or in views mode its ATen `_copy` form. `chunk` and the list form of
    /// `split` have none of their own: `split_copy` by the chunk size, or
    /// `split_with_sizes_copy` by the pieces' sizes.
    fn view_call(&self, op: OpId, args: Vec<Arg<ValueId>>) -> Result<(OpId, Vec<Arg<ValueId>>)> {
        if self.mode == Remove::Mutations {
            return Ok((op, args));
        }
        let lookup =
            |n: &str| ops::lookup(n).ok_or_else(|| self.err(format!("internal error: no op {n}")));
        let def = op.def();
        let pieces_by_sizes =
            def.inverse == Some(Inverse::Piece) && matches!(args.get(1), Some(Arg::IntList(_)));
        match def.counterpart {
            // `chunk`: pieces with no copy of their own.
            None if def.kind == OpKind::MultiView => {
                let metas: Vec<Arg<&Meta>> = args
                    .iter()
                    .map(|a| a.map(&mut |v| self.out.meta(*v)))
                    .collect();
                let pieces = ops::infer(op, &metas).map_err(|m| self.err(m))?;
                let Some(Arg::Int(dim)) = args.get(2) else {
                    return Err(self.err("internal error: chunk without a dim"));
                };
                let d = wrap_dim(*dim, self.out.meta(*args[0].tensors()[0]).dim())
                    .map_err(|m| self.err(m))?;
                let sizes: Vec<i64> = pieces.iter().map(|m| m.sizes[d] as i64).collect();
                let first = sizes.first().copied().unwrap_or(0);
                let total: i64 = sizes.iter().sum();
                // `split_copy(x, s)` gives the same pieces when `s` is the
                // first piece's size (all but the last equal to it).
                let uniform = first > 0 && (total + first - 1) / first == sizes.len() as i64;
                let (name, size) = if uniform {
                    ("split_copy", Arg::Int(first))
                } else {
                    ("split_with_sizes_copy", Arg::IntList(sizes))
                };
                Ok((
                    lookup(name)?,
                    vec![args[0].clone(), size, Arg::Int(d as i64)],
                ))
            }
            // `split.sizes`.
            _ if pieces_by_sizes => Ok((lookup("split_with_sizes_copy")?, args)),
            _ => Ok((self.view_op(op), args)),
        }
    }

    /// The id of chain `parent` (an id) extended by `step` taking result
    /// `index` (interned: equal chains get equal ids; 0 is the empty chain).
    fn extend_prefix(&mut self, parent: u32, step: &Step, index: usize) -> u32 {
        let next = self.prefixes.len() as u32 + 1;
        *self
            .prefixes
            .entry((parent, step.sig, index as u32))
            .or_insert(next)
    }

    /// The id of view call `op(_, args...)`: equal calls get equal ids.
    fn step_sig(&mut self, op: OpId, args: &[Arg<ValueId>]) -> u32 {
        let mut k: StepKey = smallvec::smallvec![op.0 as u64];
        for a in args {
            encode_arg(a, &mut k);
        }
        let next = self.step_sigs.len() as u32;
        *self.step_sigs.entry(k).or_insert(next)
    }

    fn apply_step(
        &mut self,
        storage: usize,
        gen: u64,
        parent: u32,
        input: ValueId,
        step: &Step,
    ) -> Result<ValueId> {
        let mut args = Vec::with_capacity(1 + step.args.len());
        args.push(Arg::Tensor(input));
        args.extend(step.args.iter().cloned());
        let (op, args) = self.view_call(step.op, args)?;
        let res = match &step.source {
            Some(source) if op == step.op => self.emit_copy(
                op,
                source.overload,
                args,
                &[&source.input],
                source.results.iter().cloned(),
            )?,
            Some(source) if self.is_copy_of(op, step.op, &source.input, input) => {
                // The results are the view's, contiguous: no binding or
                // inference.
                let results = self.contiguous_results(op, &args, source.results.iter().cloned());
                self.emit_inferred(op, source.overload, args, results)
            }
            // A synthesized step, or its `_copy` form: bound afresh.
            _ => self.emit_as(op, None, args)?,
        };
        // Multi-output views give every piece at once: remember them all.
        for (j, &r) in res.iter().enumerate() {
            let key = self.extend_prefix(parent, step, j);
            self.cache.insert(storage, gen, key, r);
        }
        Ok(res[step.index])
    }

    /// Is `op` the `_copy` form of view `view` (same schemas, in order),
    /// applied to `input`, a value of the sizes and dtype the source view's
    /// input had? The view's result sizes depend on nothing else, so the
    /// copy's results are the source's, contiguous.
    fn is_copy_of(&self, op: OpId, view: OpId, src_input: &Meta, input: ValueId) -> bool {
        let m = self.out.meta(input);
        matches!(op.def().rule, Rule::ViewCopy(v) if v == view)
            && m.dtype == src_input.dtype
            && m.sizes == src_input.sizes
    }

    /// The value of the view `links` (a chain's, from the base on) over the
    /// current base: from the longest cached prefix on.
    fn regen(&mut self, storage: usize, links: &[&Link]) -> Result<ValueId> {
        let gen = self.storages[storage].gen;
        let mut j = links.len();
        let mut val = loop {
            if j == 0 {
                break self.base(storage)?;
            }
            if let Some(v) = self.cache.get(storage, gen, links[j - 1].id) {
                break v;
            }
            j -= 1;
        };
        for i in j..links.len() {
            let parent = if i == 0 { 0 } else { links[i - 1].id };
            val = self.apply_step(storage, gen, parent, val, &links[i].step)?;
        }
        Ok(val)
    }

    /// The up-to-date value of source value `v`.
    fn read(&mut self, v: ValueId) -> Result<ValueId> {
        let a = self.alias(v)?;
        let gen = self.storages[a.storage].gen;
        if let (Some(c), true) = (a.current, a.gen == gen) {
            return Ok(c);
        }
        let value = self.regen(a.storage, &a.chain.links())?;
        let e = self.aliases.get_mut(v).expect("alias exists");
        e.current = Some(value);
        e.gen = gen;
        Ok(value)
    }

    fn read_args(&mut self, args: &[Arg<ValueId>]) -> Result<Vec<Arg<ValueId>>> {
        let mut out = Vec::with_capacity(args.len());
        for a in args {
            out.push(match a {
                Arg::Tensor(v) => Arg::Tensor(self.read(*v)?),
                Arg::TensorList(l) => Arg::TensorList(
                    l.iter()
                        .map(|x| x.map(|v| self.read(v)).transpose())
                        .collect::<Result<Vec<_>>>()?,
                ),
                other => other.clone(),
            });
        }
        Ok(out)
    }

    fn node(&mut self, src: &Graph, n: NodeId) -> Result<()> {
        let node = &src.nodes[n];
        let def = node.op.def();
        match def.kind {
            OpKind::View | OpKind::MultiView => self.view(src, n),
            OpKind::ViewOrCopy => {
                let Rule::ViewOrCopy(rule) = &def.rule else {
                    unreachable!("ViewOrCopy ops have a ViewOrCopy rule")
                };
                let metas: Vec<Arg<&Meta>> = node
                    .args
                    .iter()
                    .map(|a| a.map(&mut |v| src.meta(*v)))
                    .collect();
                let (_, aliases) = rule(&metas).map_err(|m| self.err(m))?;
                match (aliases, def.name.as_str(), self.mode) {
                    // `contiguous` of a contiguous tensor is that tensor.
                    (true, "contiguous", _) => {
                        let a = self.alias(node.args[0].tensors()[0].to_owned())?;
                        self.aliases.insert(node.results[0], a);
                        Ok(())
                    }
                    (true, _, _) => self.view(src, n),
                    // A copy; in views mode every value is contiguous already.
                    (false, "contiguous", Remove::MutationsAndViews) => {
                        let v = self.read(*node.args[0].tensors()[0])?;
                        self.new_storage(
                            node.results[0],
                            v,
                            src.values[node.results[0]].meta.clone(),
                            None,
                        );
                        Ok(())
                    }
                    (false, _, _) => self.functional(src, n, self.view_op(node.op)),
                }
            }
            OpKind::InPlace => self.mutation(src, n),
            _ if self.mode == Remove::MutationsAndViews
                && ["as_strided_copy", "as_strided_scatter"].contains(&def.name.as_str()) =>
            {
                self.strided_without_views(src, n)
            }
            OpKind::Functional | OpKind::Factory => self.functional(src, n, node.op),
        }
    }

    /// In views mode values share no storage, so ops that address a
    /// storage (`as_strided` in all its forms) read the base's elements in
    /// storage order: the base itself when it is contiguous, else this
    /// `permute` of it (a dense base in a permuted layout, as elementwise
    /// ops on transposed inputs give). A base with gaps or an offset (a
    /// scatter into a view) cannot be addressed so.
    fn storage_order(&mut self, storage: usize) -> Result<Chain> {
        let m = self.storages[storage].base_meta.clone();
        if !(m.offset == 0
            && m.storage_numel == m.numel()
            && is_non_overlapping_and_dense(&m.sizes, &m.strides))
        {
            return Err(self.err(
                "cannot remove views here: as_strided addresses a storage with gaps or an offset \
                 (the result of a scatter into a view); functionalize with --remove mutations instead",
            ));
        }
        if m.is_contiguous() {
            return Ok(Chain::default());
        }
        let mut perm: Vec<usize> = (0..m.dim()).collect();
        perm.sort_by(|&a, &b| m.strides[b].cmp(&m.strides[a]));
        let meta = m.restrided(
            perm.iter().map(|&d| m.sizes[d]).collect::<Vec<_>>(),
            perm.iter().map(|&d| m.strides[d]).collect::<Vec<_>>(),
            0,
        );
        let op = ops::lookup("permute").expect("permute is in the table");
        let args: Rc<[Arg<ValueId>]> =
            Rc::new([Arg::IntList(perm.iter().map(|&d| d as i64).collect())]);
        let sig = self.step_sig(op, &args);
        let step = Step::new(op, args, 0, Arc::new(meta), None, sig);
        let id = self.extend_prefix(0, &step, 0);
        Ok(Chain::default().push(step, id))
    }

    /// `as_strided_copy(self, ...)` and `as_strided_scatter(self, ...)`
    /// without views: applied to the storage in storage order.
    fn strided_without_views(&mut self, src: &Graph, n: NodeId) -> Result<()> {
        let node = &src.nodes[n];
        let this = *node.args[0].tensors()[0];
        let a = self.alias(this)?;
        let order = self.storage_order(a.storage)?;
        let flat = self.regen(a.storage, &order.links())?;
        let mut args = self.read_args(&node.args)?;
        args[0] = Arg::Tensor(flat);
        let mut r = self.emit_id(node.op, args)?.remove(0);
        let strided = matches!(node.op.def().lowering, ops::Lowering::StridedScatter(_));
        if strided && !(a.chain.is_empty() && order.is_empty()) {
            // The result is the whole storage seen through `self`'s geometry.
            let m = src.meta(this).clone();
            r = self.emit(
                "as_strided_copy",
                vec![
                    Arg::Tensor(r),
                    ints(&m.sizes),
                    ints(&m.strides),
                    Arg::Int(m.offset as i64),
                ],
            )?;
        }
        self.new_storage(
            node.results[0],
            r,
            src.values[node.results[0]].meta.clone(),
            None,
        );
        Ok(())
    }

    fn functional(&mut self, src: &Graph, n: NodeId, op: OpId) -> Result<()> {
        let node = &src.nodes[n];
        let args = self.read_args(&node.args)?;
        let res = if op == node.op {
            self.emit_copy_of(src, n, args)?
        } else {
            self.emit_as(op, None, args)?
        };
        for (&r, v) in node.results.iter().zip(res) {
            self.new_storage(r, v, src.values[r].meta.clone(), None);
        }
        Ok(())
    }

    fn view(&mut self, src: &Graph, n: NodeId) -> Result<()> {
        let node = &src.nodes[n];
        // `transpose_` is `transpose` whose result the front end named
        // `self` from then on.
        let op = match node.op.def().metadata {
            None => node.op,
            Some(ops::Metadata::View(view)) => {
                self.metadata_of_input(src, n)?;
                view
            }
            Some(ops::Metadata::Resize) => {
                self.metadata_of_input(src, n)?;
                return self.resize(src, n);
            }
        };
        let rest: Rc<[Arg<ValueId>]> = node.args[1..].into();
        self.view_step(src, n, op, node.overload, rest)
    }

    /// Refuses an op changing the metadata of a program input itself (not
    /// of a view of it): the caller's tensor would change shape.
    fn metadata_of_input(&self, src: &Graph, n: NodeId) -> Result<()> {
        let node = &src.nodes[n];
        let this = *node.args[0].tensors()[0];
        let a = self.alias(this)?;
        match self.storages[a.storage].input {
            Some(i) if a.chain.is_empty() => {
                let name = src.values[src.inputs[i]].name.as_deref().unwrap_or("?");
                let op = node.op.name();
                Err(self.err(format!(
                    "{op} would change the shape of program input `%{name}` for its caller, which \
                     a program cannot do; use the out-of-place op, or apply {op} to a view or clone"
                )))
            }
            _ => Ok(()),
        }
    }

    /// Source node `n`'s results as the view `op(self, rest...)` of its
    /// `self`, bound by `overload`.
    fn view_step(
        &mut self,
        src: &Graph,
        n: NodeId,
        op: OpId,
        overload: usize,
        rest: Rc<[Arg<ValueId>]>,
    ) -> Result<()> {
        let node = &src.nodes[n];
        let this = *node.args[0].tensors()[0];
        let a = self.alias(this)?;
        let gen = self.storages[a.storage].gen;
        self.storages[a.storage].viewed = true;
        let strided = op.def().inverse == Some(Inverse::AsStrided);
        let (chain, input) = if strided {
            // Offsets and strides of as_strided refer to the whole storage:
            // it is a view of the base, whatever view it was applied to.
            let order = match self.mode {
                Remove::Mutations => Chain::default(),
                Remove::MutationsAndViews => self.storage_order(a.storage)?,
            };
            let input = self.regen(a.storage, &order.links())?;
            (order, input)
        } else {
            (a.chain.clone(), self.read(this)?)
        };
        let prefix = chain.id();
        // Without views, as_strided applies to the storage in storage
        // order, not to the value it was called on: the source call says
        // nothing about its results there.
        let source = (!strided || self.mode == Remove::Mutations).then(|| {
            Rc::new(Source {
                overload,
                input: src.values[this].meta.clone(),
                results: node
                    .results
                    .iter()
                    .map(|&r| src.values[r].meta.clone())
                    .collect(),
            })
        });
        let sig = self.step_sig(op, &rest);
        for (i, &r) in node.results.iter().enumerate() {
            let step = Step::new(
                op,
                rest.clone(),
                i,
                src.values[r].meta.clone(),
                source.clone(),
                sig,
            );
            let key = self.extend_prefix(prefix, &step, i);
            let value = match self.cache.get(a.storage, gen, key) {
                Some(v) => v,
                None => self.apply_step(a.storage, gen, prefix, input, &step)?,
            };
            self.aliases.insert(
                r,
                Alias {
                    storage: a.storage,
                    chain: chain.push(step, key),
                    gen,
                    current: Some(value),
                },
            );
        }
        Ok(())
    }

    /// `resize_`, as PyTorch's functionalization does it: shrinking is an
    /// `as_strided` view of the storage (its tail kept for a later grow);
    /// growing gives a tensor that is neither a view nor viewed a new
    /// storage: its elements in storage order, then zeros (eager's are
    /// uninitialized).
    fn resize(&mut self, src: &Graph, n: NodeId) -> Result<()> {
        let node = &src.nodes[n];
        let this = *node.args[0].tensors()[0];
        let out = node.results[0];
        let m = src.values[out].meta.clone();
        if m.storage_numel <= src.meta(this).storage_numel {
            let op = ops::lookup("as_strided").expect("as_strided is in the table");
            let int_list = |d: &[usize]| Arg::IntList(d.iter().map(|&x| x as i64).collect());
            let rest: Rc<[Arg<ValueId>]> = Rc::new([
                int_list(&m.sizes),
                int_list(&m.strides),
                Arg::Int(m.offset as i64),
            ]);
            return self.view_step(src, n, op, 0, rest);
        }
        let a = self.alias(this)?;
        let s = &self.storages[a.storage];
        let refuse = if !a.chain.is_empty() {
            Some("it is a view (or was resized smaller before): only a tensor that owns its storage grows")
        } else if s.viewed {
            Some("it has views, which would keep the old storage")
        } else {
            None
        };
        if let Some(why) = refuse {
            return Err(self.err(format!(
                "resize_ to {} elements cannot grow this tensor: {why}; resize a clone instead \
                 (PyTorch's functionalization refuses it too)",
                m.storage_numel
            )));
        }
        let order = self.storage_order(a.storage)?;
        let v = self.regen(a.storage, &order.links())?;
        let flat = self.reshaped(v, &[-1])?;
        let have = self.out.meta(flat).numel();
        let all = self.emit(
            "constant_pad_nd",
            vec![
                Arg::Tensor(flat),
                Arg::IntList(vec![0, (m.storage_numel - have) as i64]),
            ],
        )?;
        let sizes: Vec<i64> = m.sizes.iter().map(|&x| x as i64).collect();
        let value = self.reshaped(all, &sizes)?;
        self.new_storage(out, value, m, None);
        Ok(())
    }

    /// `v` (dense, in the new graph) reshaped: `reshape`, or `view_copy`
    /// without views.
    fn reshaped(&mut self, v: ValueId, sizes: &[i64]) -> Result<ValueId> {
        let op = match self.mode {
            Remove::Mutations => "reshape",
            Remove::MutationsAndViews => "view_copy",
        };
        self.emit(op, vec![Arg::Tensor(v), Arg::IntList(sizes.to_vec())])
    }

    fn mutation(&mut self, src: &Graph, n: NodeId) -> Result<()> {
        let node = &src.nodes[n];
        let Rule::InPlace(functional) = node.op.def().rule else {
            unreachable!("in-place ops have an InPlace rule")
        };
        let this = *node.args[0].tensors()[0];
        let a = self.alias(this)?;
        // Refuse what the reference interpreter refuses: operands that read
        // elements this write changes at other positions.
        let gathered = ops::reads_gathered(functional);
        for arg in &node.args[1..] {
            for &t in arg.tensors() {
                if self.alias(t)?.storage == a.storage
                    && ops::write_hazard(src.meta(this), src.meta(t), gathered)
                {
                    return Err(self.err(ops::HAZARD_MESSAGE));
                }
            }
        }
        let args = self.read_args(&node.args)?;
        let cur = match args[0] {
            Arg::Tensor(v) => v,
            _ => unreachable!("self is a tensor"),
        };
        // The in-place overload's bound arguments are the functional one's:
        // no binding again.
        let overload = node
            .op
            .def()
            .functional_overloads
            .get(node.overload)
            .copied();
        debug_assert!(
            overload.is_none_or(|o| ops::bind(functional, &args).ok() == Some((o, args.clone()))),
            "{}: arguments bound by an in-place overload bind its functional one",
            node.op.name()
        );
        let mut r = self.emit_as(functional, overload, args)?.remove(0);
        let want = src.meta(this);
        if self.out.meta(r).dtype != want.dtype {
            r = self.emit("copy", vec![Arg::Tensor(cur), Arg::Tensor(r)])?;
        }
        let new_base = self.write_back(&a, r, want)?;
        let s = &mut self.storages[a.storage];
        s.base = new_base;
        s.gen += 1;
        let gen = s.gen;
        // `self` and the op's result name the new value when it has the
        // layout the source graph gives them; else they are regenerated.
        let current = (self.out.meta(r) == &self.expected_meta(want)).then_some(r);
        let updated = Alias { gen, current, ..a };
        self.aliases.insert(this, updated.clone());
        self.aliases.insert(node.results[0], updated);
        Ok(())
    }

    /// The metadata a value standing for a source value of metadata `m`
    /// must have: the same in `Mutations` mode, contiguous without views.
    fn expected_meta(&self, m: &Meta) -> Meta {
        match self.mode {
            Remove::Mutations => m.clone(),
            Remove::MutationsAndViews => Meta::contiguous(m.dtype, m.sizes.clone()),
        }
    }

    /// The new value of `a`'s base once `a` holds `r`.
    fn write_back(&mut self, a: &Alias, r: ValueId, a_meta: &Meta) -> Result<ValueId> {
        let base_meta = self.storages[a.storage].base_meta.clone();
        let links = a.chain.links();
        let invertible = links
            .iter()
            .all(|l| l.step.op.def().inverse.is_some() && !l.step.meta.has_internal_overlap());
        let new_base = if links.is_empty() {
            r
        } else if invertible {
            let mut val = r;
            let new_gen = self.storages[a.storage].gen + 1;
            for k in (0..links.len()).rev() {
                let parent = self.regen(a.storage, &links[..k])?;
                let parent_meta = if k == 0 {
                    base_meta.clone()
                } else {
                    links[k - 1].step.meta.clone()
                };
                val = self.inverse(&links[k].step, &parent_meta, parent, val)?;
                // `val` is the new value of the chain's first k steps: reads
                // of that view after this write need not regenerate it.
                if k > 0 && self.out.meta(val) == &self.expected_meta(&parent_meta) {
                    self.cache.insert(a.storage, new_gen, links[k - 1].id, val);
                }
            }
            val
        } else {
            self.write_back_strided(a, r, a_meta)?
        };
        // Views and as_strided replay exactly only on the base's source
        // layout: remember the last value that has it.
        let faithful = self.out.meta(new_base) == &*base_meta;
        let s = &mut self.storages[a.storage];
        if faithful {
            s.layout = None;
        } else if self.mode == Remove::Mutations && s.layout.is_none() {
            s.layout = Some(s.base);
        }
        Ok(new_base)
    }

    /// The base's current value for reading, in its source layout.
    fn base(&mut self, storage: usize) -> Result<ValueId> {
        let s = &self.storages[storage];
        let (Some(old), base, m) = (s.layout, s.base, s.base_meta.clone()) else {
            return Ok(s.base);
        };
        let v = self.scatter_strided(old, base, &m)?;
        let s = &mut self.storages[storage];
        s.base = v;
        s.layout = None;
        Ok(v)
    }

    fn scatter_strided(&mut self, base: ValueId, src: ValueId, m: &Meta) -> Result<ValueId> {
        self.emit(
            "as_strided_scatter",
            vec![
                Arg::Tensor(base),
                Arg::Tensor(src),
                ints(&m.sizes),
                ints(&m.strides),
                Arg::Int(m.offset as i64),
            ],
        )
    }

    /// Writes `r` into the storage elements of `a` with one
    /// `as_strided_scatter`. Through an expanded view all copies of an
    /// element hold the same value (only `fill_`/`zero_` may write there),
    /// so one copy of each is written.
    fn write_back_strided(&mut self, a: &Alias, r: ValueId, a_meta: &Meta) -> Result<ValueId> {
        let mut src = r;
        let mut m = a_meta.clone();
        for d in (0..m.dim()).rev() {
            if m.strides[d] == 0 && m.sizes[d] > 1 {
                let select = self.view_op(ops::lookup("select").expect("select is in the table"));
                src = self
                    .emit_id(
                        select,
                        vec![Arg::Tensor(src), Arg::Int(d as i64), Arg::Int(0)],
                    )?
                    .remove(0);
                m.sizes.remove(d);
                m.strides.remove(d);
            }
        }
        let order = match self.mode {
            Remove::Mutations => Chain::default(),
            Remove::MutationsAndViews => self.storage_order(a.storage)?,
        };
        let flat = self.regen(a.storage, &order.links())?;
        let written = self.scatter_strided(flat, src, &m)?;
        match &order.0 {
            None => Ok(written),
            Some(link) => {
                let step = &link.step;
                let (base_meta, base) = (
                    self.storages[a.storage].base_meta.clone(),
                    self.base(a.storage)?,
                );
                self.inverse(step, &base_meta, base, written)
            }
        }
    }

    /// Writes `child` (the new value of `step`'s result) into `parent`
    /// (`ops::inverse`, the write-back view gradients use too).
    fn inverse(
        &mut self,
        step: &Step,
        parent_meta: &Meta,
        parent: ValueId,
        child: ValueId,
    ) -> Result<ValueId> {
        let view = ops::inverse::ViewStep {
            view: step.op,
            args: &step.args,
            index: step.index,
        };
        let call = ops::inverse::write_back(
            view,
            Some(parent),
            parent_meta,
            child,
            &self.out.meta(child).clone(),
            self.mode == Remove::MutationsAndViews,
        )
        .map_err(|m| self.err(m))?;
        match call {
            Some((op, args)) => Ok(self.emit_id(op, args)?.remove(0)),
            None => Ok(child),
        }
    }
}

fn ints(v: &[usize]) -> Arg<ValueId> {
    Arg::IntList(v.iter().map(|&x| x as i64).collect())
}
