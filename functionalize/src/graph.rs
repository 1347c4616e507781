//! The graph: SSA values defined by parameters or by nodes, nodes in an
//! arena, kept in program order. Every node is bound against its op's
//! schema and carries the inferred metadata of its results, so a graph in
//! memory is always well-typed.

use crate::meta::Meta;
use crate::ops::{self, OpId};
use crate::schema::Arg;
use crate::DType;
use slotmap::SlotMap;
use std::sync::Arc;

pub use crate::id::{NodeId, Results, ValueId};

#[derive(Clone, Debug, PartialEq)]
pub enum Def {
    Input(usize),
    Node(NodeId, usize),
}

/// A value's name: up to 24 bytes inline (no allocation per value).
pub type Name = compact_str::CompactString;

#[derive(Clone, Debug)]
pub struct Value {
    /// The name as written (without `%`); printing invents one if absent.
    pub name: Option<Name>,
    /// Shared between the graph's values of equal metadata (`MetaPool`):
    /// most values of a program have one of a few shapes.
    pub meta: Arc<Meta>,
    pub def: Def,
}

/// A graph's distinct metadata, each held once.
#[derive(Clone, Debug, Default)]
pub struct MetaPool(rustc_hash::FxHashMap<Arc<Meta>, ()>);

impl MetaPool {
    /// The shared copy of `m`.
    pub fn intern(&mut self, m: Meta) -> Arc<Meta> {
        if let Some((k, _)) = self.0.get_key_value(&m) {
            return k.clone();
        }
        let a = Arc::new(m);
        self.0.insert(a.clone(), ());
        a
    }

    /// Takes in every entry of `other` (the smaller table goes into the
    /// larger one).
    pub fn absorb(&mut self, mut other: MetaPool) {
        if other.0.len() > self.0.len() {
            std::mem::swap(&mut self.0, &mut other.0);
        }
        self.0.extend(other.0);
    }
}

/// The results' metadata of `op(bound)` (bound arguments; `meta_of` gives
/// each tensor's), interned in `pool`: an argument's own when equal (most
/// elementwise results), without hashing.
pub fn infer_results<'m, V>(
    op: OpId,
    bound: &[Arg<V>],
    meta_of: impl Fn(&V) -> &'m Arc<Meta>,
    pool: &mut MetaPool,
) -> Result<smallvec::SmallVec<[Arc<Meta>; 2]>, String> {
    let metas: smallvec::SmallVec<[Arg<&Meta>; 5]> = bound
        .iter()
        .map(|a| a.map(&mut |v| &**meta_of(v)))
        .collect();
    let outs = ops::infer(op, &metas)?;
    drop(metas);
    let mut shared = smallvec::SmallVec::new();
    for m in outs {
        crate::meta::check_size(&m.sizes)?;
        let mut same = None;
        for a in bound {
            a.each_tensor(&mut |v| {
                let am = meta_of(v);
                if same.is_none() && **am == m {
                    same = Some(am.clone());
                }
            });
        }
        shared.push(match same {
            Some(a) => a,
            None => pool.intern(m),
        });
    }
    Ok(shared)
}

/// A map from one graph's values, indexed by arena slot: no hashing, and
/// neighbouring values' entries side by side.
pub struct ValueMap<T>(Vec<Option<(u64, T)>>);

impl<T> ValueMap<T> {
    pub fn with_capacity(n: usize) -> ValueMap<T> {
        ValueMap(Vec::with_capacity(n))
    }

    pub fn insert(&mut self, v: ValueId, x: T) {
        let (i, k) = ValueSet::slot(v);
        if i >= self.0.len() {
            self.0
                .resize_with(grown_len(i, self.0.len(), self.0.capacity()), || None);
        }
        self.0[i] = Some((k, x));
    }

    pub fn get(&self, v: ValueId) -> Option<&T> {
        let (i, k) = ValueSet::slot(v);
        match self.0.get(i) {
            Some(Some((key, x))) if *key == k => Some(x),
            _ => None,
        }
    }

    pub fn get_mut(&mut self, v: ValueId) -> Option<&mut T> {
        let (i, k) = ValueSet::slot(v);
        match self.0.get_mut(i) {
            Some(Some((key, x))) if *key == k => Some(x),
            _ => None,
        }
    }
}

/// The length a slot-indexed vector of length `len` and capacity `cap`
/// grows to for slot `i`: only as far as needed within the capacity given
/// up front (doubling past it would reallocate, copy, and touch memory never
/// used), doubling beyond it.
fn grown_len(i: usize, len: usize, cap: usize) -> usize {
    if i < cap {
        i + 1
    } else {
        (i + 1).max(2 * len)
    }
}

/// A set of one graph's values, indexed by arena slot: no hashing, for
/// passes that visit every node (dead code, SSA checks).
pub struct ValueSet(Vec<u64>);

/// `v`'s slot in its graph's value arena: distinct for the values present
/// at once (a removed value's slot may be given to a new one).
pub fn slot_index(v: ValueId) -> usize {
    use slotmap::Key;
    // The low word of the key; the high one is the slot's version.
    (v.data().as_ffi() & 0xffff_ffff) as usize
}

impl ValueSet {
    /// A set for `g`'s values: grows to its highest slot in one step.
    pub fn for_graph(g: &Graph) -> ValueSet {
        ValueSet(Vec::with_capacity(g.values.capacity() + 1))
    }

    fn slot(v: ValueId) -> (usize, u64) {
        use slotmap::Key;
        // The whole key (with its version, never 0 for a live value) tells
        // a reused slot apart.
        (slot_index(v), v.data().as_ffi())
    }

    pub fn insert(&mut self, v: ValueId) {
        let (i, k) = Self::slot(v);
        if i >= self.0.len() {
            self.0
                .resize(grown_len(i, self.0.len(), self.0.capacity()), 0);
        }
        self.0[i] = k;
    }

    pub fn contains(&self, v: ValueId) -> bool {
        let (i, k) = Self::slot(v);
        self.0.get(i) == Some(&k)
    }
}

impl Extend<ValueId> for ValueSet {
    fn extend<I: IntoIterator<Item = ValueId>>(&mut self, it: I) {
        for v in it {
            self.insert(v);
        }
    }
}

/// A node's results: one or two inline (multi-result ops are rare).

#[derive(Clone, Debug)]
pub struct Node {
    pub op: OpId,
    /// Which of the op's schemas bound the arguments.
    pub overload: usize,
    /// Bound arguments, defaults filled in.
    pub args: Vec<Arg<ValueId>>,
    pub results: Results,
    /// Source line, when parsed from text.
    pub line: Option<usize>,
}

impl Node {
    pub fn inputs(&self) -> smallvec::SmallVec<[ValueId; 4]> {
        let mut out = smallvec::SmallVec::new();
        for a in &self.args {
            a.each_tensor(&mut |&v| out.push(v));
        }
        out
    }
}

#[derive(Clone, Debug, Default)]
pub struct Graph {
    pub name: String,
    pub values: SlotMap<ValueId, Value>,
    pub nodes: SlotMap<NodeId, Node>,
    /// Nodes in program order.
    pub order: Vec<NodeId>,
    pub inputs: Vec<ValueId>,
    pub outputs: Vec<ValueId>,
    pub metas: MetaPool,
}

impl Graph {
    pub fn new(name: &str) -> Graph {
        Graph {
            name: name.to_string(),
            ..Default::default()
        }
    }

    /// An empty graph with room for about `nodes` statements (growing a
    /// large graph statement by statement copies it at every doubling).
    pub fn with_capacity(name: &str, nodes: usize) -> Graph {
        Graph {
            name: name.to_string(),
            values: SlotMap::with_capacity_and_key(nodes + nodes / 4),
            nodes: SlotMap::with_capacity_and_key(nodes),
            order: Vec::with_capacity(nodes),
            inputs: vec![],
            outputs: vec![],
            metas: MetaPool::default(),
        }
    }

    /// Adds a parameter (a distinct, contiguous tensor).
    pub fn add_input(&mut self, name: Option<Name>, meta: Meta) -> ValueId {
        let i = self.inputs.len();
        let meta = self.metas.intern(meta);
        let v = self.values.insert(Value {
            name,
            meta,
            def: Def::Input(i),
        });
        self.inputs.push(v);
        v
    }

    /// Appends `op(args)`: picks the overload, fills defaults, infers the
    /// results' metadata. Errors say what is wrong with the call.
    pub fn call(&mut self, op: OpId, args: &[Arg<ValueId>]) -> Result<Results, String> {
        let (overload, bound) = ops::bind(op, args)?;
        self.call_bound(op, overload, bound)
    }

    /// Appends `op(args)` where `args` are already bound by `overload` (a
    /// node's arguments with its values replaced): infers the results.
    pub fn call_bound(
        &mut self,
        op: OpId,
        overload: usize,
        bound: Vec<Arg<ValueId>>,
    ) -> Result<Results, String> {
        let values = &self.values;
        let outs = infer_results(op, &bound, |v| &values[*v].meta, &mut self.metas)?;
        Ok(self.call_inferred(op, overload, bound, outs))
    }

    /// Appends `op(args)` bound by `overload`, whose results' metadata is
    /// known: the same call inferred before, on arguments of equal
    /// metadata (shape rules depend on nothing else). No inference.
    pub fn call_inferred(
        &mut self,
        op: OpId,
        overload: usize,
        bound: Vec<Arg<ValueId>>,
        outs: impl IntoIterator<Item = Arc<Meta>>,
    ) -> Results {
        let node = self.nodes.insert(Node {
            op,
            overload,
            args: bound,
            results: Default::default(),
            line: None,
        });
        let results: Results = outs
            .into_iter()
            .enumerate()
            .map(|(i, meta)| {
                self.values.insert(Value {
                    name: None,
                    meta,
                    def: Def::Node(node, i),
                })
            })
            .collect();
        self.nodes[node].results = results.clone();
        self.order.push(node);
        results
    }

    pub fn meta(&self, v: ValueId) -> &Meta {
        &self.values[v].meta
    }

    pub fn node_of(&self, v: ValueId) -> Option<NodeId> {
        match self.values[v].def {
            Def::Node(n, _) => Some(n),
            Def::Input(_) => None,
        }
    }

    /// Structural equality: same parameters, same ops with the same
    /// arguments and result types in the same order, same outputs. Value
    /// names do not matter.
    pub fn same_as(&self, other: &Graph) -> bool {
        let mut map = rustc_hash::FxHashMap::default();
        if self.inputs.len() != other.inputs.len() || self.order.len() != other.order.len() {
            return false;
        }
        for (&a, &b) in self.inputs.iter().zip(&other.inputs) {
            if self.values[a].meta != other.values[b].meta {
                return false;
            }
            map.insert(a, b);
        }
        for (&na, &nb) in self.order.iter().zip(&other.order) {
            let (x, y) = (&self.nodes[na], &other.nodes[nb]);
            if x.op != y.op || x.overload != y.overload || x.results.len() != y.results.len() {
                return false;
            }
            let xa: Vec<Arg<Option<ValueId>>> = x
                .args
                .iter()
                .map(|a| a.map(&mut |v| map.get(v).copied()))
                .collect();
            let ya: Vec<Arg<Option<ValueId>>> =
                y.args.iter().map(|a| a.map(&mut |v| Some(*v))).collect();
            if xa.len() != ya.len() || !xa.iter().zip(&ya).all(|(a, b)| a.same(b)) {
                return false;
            }
            for (&ra, &rb) in x.results.iter().zip(&y.results) {
                if self.values[ra].meta != other.values[rb].meta {
                    return false;
                }
                map.insert(ra, rb);
            }
        }
        self.outputs.len() == other.outputs.len()
            && self
                .outputs
                .iter()
                .zip(&other.outputs)
                .all(|(a, b)| map.get(a) == Some(b))
    }

    /// For each value, the position in `order` of its last use (outputs
    /// count as used at the end).
    pub fn last_uses(&self) -> slotmap::SecondaryMap<ValueId, usize> {
        let mut last = slotmap::SecondaryMap::new();
        for (i, &n) in self.order.iter().enumerate() {
            for v in self.nodes[n].inputs() {
                last.insert(v, i);
            }
        }
        for &v in &self.outputs {
            last.insert(v, usize::MAX);
        }
        last
    }
}

impl Graph {
    /// A 128-bit hash of what the graph computes: parameter types, nodes
    /// (op, overload, arguments, result types) and outputs, with values
    /// numbered in definition order. Names do not count, so two traces of
    /// one program (or one program printed and parsed back) hash alike.
    pub fn structural_hash(&self) -> u128 {
        use rustc_hash::FxHashMap as HashMap;
        use std::hash::{Hash, Hasher};
        let mut num: HashMap<ValueId, usize> = HashMap::default();
        let (mut a, mut b) = (
            std::collections::hash_map::DefaultHasher::new(),
            std::collections::hash_map::DefaultHasher::new(),
        );
        b.write_u8(0x5a);
        let mut feed = |bytes: &[u8]| {
            a.write(bytes);
            b.write(bytes);
        };
        let meta = |m: &Meta, feed: &mut dyn FnMut(&[u8])| {
            let mut h = std::collections::hash_map::DefaultHasher::new();
            (m.dtype, &m.sizes, &m.strides, m.offset, m.storage_numel).hash(&mut h);
            feed(&h.finish().to_le_bytes());
        };
        for &v in &self.inputs {
            num.insert(v, num.len());
            meta(&self.values[v].meta, &mut feed);
        }
        for &n in &self.order {
            let node = &self.nodes[n];
            feed(node.op.name().as_bytes());
            feed(&(node.overload as u64).to_le_bytes());
            for arg in &node.args {
                let mapped = arg.map(&mut |v: &ValueId| num.get(v).copied().unwrap_or(usize::MAX));
                feed(format!("{mapped:?};").as_bytes());
            }
            for &r in &node.results {
                num.insert(r, num.len());
                meta(&self.values[r].meta, &mut feed);
            }
        }
        for v in &self.outputs {
            feed(&(num.get(v).copied().unwrap_or(usize::MAX) as u64).to_le_bytes());
        }
        ((a.finish() as u128) << 64) | b.finish() as u128
    }
}

impl Graph {
    /// This program called with parameter `j` being the very tensor passed
    /// as parameter `i` (same dtype and shape), for each `(i, j)` of
    /// `pairs`: parameter `j` is gone and reads `alias(i)` instead, so a
    /// write through either shows in both, as in eager. Parameters keep
    /// their order otherwise.
    pub fn with_aliased_params(&self, pairs: &[(usize, usize)]) -> Result<Graph, String> {
        let dropped: Vec<usize> = pairs.iter().map(|&(_, j)| j).collect();
        let mut g = Graph::with_capacity(&self.name, self.order.len() + pairs.len());
        let mut map: rustc_hash::FxHashMap<ValueId, ValueId> = Default::default();
        for (k, &v) in self.inputs.iter().enumerate() {
            if !dropped.contains(&k) {
                let nv = g.add_input(self.values[v].name.clone(), self.meta(v).clone());
                map.insert(v, nv);
            }
        }
        let alias = ops::lookup("alias").ok_or("no alias op")?;
        for &(i, j) in pairs {
            let (vi, vj) = (self.inputs[i], self.inputs[j]);
            if self.meta(vi).dtype != self.meta(vj).dtype
                || self.meta(vi).sizes != self.meta(vj).sizes
            {
                return Err(format!(
                    "parameters {i} and {j} have different types: one tensor cannot be both"
                ));
            }
            let base = *map
                .get(&vi)
                .ok_or("an aliased parameter is itself dropped")?;
            let r = g.call(alias, &[Arg::Tensor(base)])?;
            g.values[r[0]].name = self.values[vj].name.clone();
            map.insert(vj, r[0]);
        }
        self.copy_statements(&mut g, &mut map)?;
        Ok(g)
    }

    /// Appends this program's statements to `g`, reading `map[v]` where
    /// they read `v` (every parameter mapped), names kept; `g` returns
    /// what this program returns.
    fn copy_statements(
        &self,
        g: &mut Graph,
        map: &mut rustc_hash::FxHashMap<ValueId, ValueId>,
    ) -> Result<(), String> {
        for &n in &self.order {
            let node = &self.nodes[n];
            let args: Vec<Arg<ValueId>> =
                node.args.iter().map(|a| a.map(&mut |v| map[v])).collect();
            let rs = g.call(node.op, &args)?;
            for (&old, &new) in node.results.iter().zip(&rs) {
                g.values[new].name = self.values[old].name.clone();
                map.insert(old, new);
            }
        }
        g.outputs = self.outputs.iter().map(|v| map[v]).collect();
        Ok(())
    }

    /// This program with f32 parameters `params` (of one dimension or
    /// more) stored as int8 with an f32 scale per `group` consecutive
    /// elements of each index of their first dimension (per output
    /// channel and group of inputs; the whole channel where `group` does
    /// not divide it): each parameter `%w: f32[O, ..]` (I elements per
    /// channel) becomes `%w: i8[O, ..]`, a parameter `%w_scale: f32[O,
    /// I / G, 1]` is appended (in `params`' order; `[O, 1, ..]` where G is
    /// I), and the program reads `mul(_to_copy(%w, f32), %w_scale)`
    /// (through views to and from `[O, I / G, G]`) where it read `%w`, as
    /// `torch.ao`'s `dequantize_per_channel_group` computes it. Other
    /// parameters keep their positions. Returns the program and each
    /// scale's name and group length G.
    pub fn with_dequantized_params(
        &self,
        params: &[usize],
        group: usize,
    ) -> Result<(Graph, Vec<(Name, usize)>), String> {
        let mut g = Graph::with_capacity(&self.name, self.order.len() + 4 * params.len());
        let mut map: rustc_hash::FxHashMap<ValueId, ValueId> = Default::default();
        let mut taken: std::collections::HashSet<Name> = self
            .values
            .values()
            .filter_map(|v| v.name.clone())
            .collect();
        for (k, &v) in self.inputs.iter().enumerate() {
            let m = self.meta(v);
            let mut meta = m.clone();
            if params.contains(&k) {
                if m.dtype != DType::F32 || m.sizes.is_empty() || m.numel() == 0 {
                    return Err(format!(
                        "parameter {k} is {}: only non-empty f32 tensors of one dimension or \
                         more are stored as int8",
                        m.type_string()
                    ));
                }
                meta = Meta::contiguous(DType::I8, m.sizes.clone());
            }
            map.insert(v, g.add_input(self.values[v].name.clone(), meta));
        }
        let [to_copy, mul, view] = ["_to_copy", "mul", "view"]
            .map(|name| ops::lookup(name).ok_or_else(|| format!("no {name} op")));
        let (to_copy, mul, view) = (to_copy?, mul?, view?);
        let dims = |d: &[usize]| Arg::IntList(d.iter().map(|&x| x as i64).collect());
        let mut names = vec![];
        for &k in params {
            let v = self.inputs[k];
            let m = self.meta(v);
            let base = self.values[v]
                .name
                .clone()
                .unwrap_or_else(|| format!("p{k}").into());
            let mut name: Name = format!("{base}_scale").into();
            let mut i = 1;
            while taken.contains(&name) {
                name = format!("{base}_scale{i}").into();
                i += 1;
            }
            taken.insert(name.clone());
            let (o, per) = (m.sizes[0], m.numel() / m.sizes[0]);
            let glen = if group > 0 && per % group == 0 {
                group
            } else {
                per
            };
            let q = map[&v];
            let f = g.call(to_copy, &[Arg::Tensor(q), Arg::Dtype(DType::F32)])?[0];
            let w = if glen == per {
                let mut sizes = vec![1; m.sizes.len()];
                sizes[0] = o;
                let scale = g.add_input(Some(name.clone()), Meta::contiguous(DType::F32, sizes));
                g.call(mul, &[Arg::Tensor(f), Arg::Tensor(scale)])?[0]
            } else {
                let sizes = vec![o, per / glen, 1];
                let scale = g.add_input(Some(name.clone()), Meta::contiguous(DType::F32, sizes));
                let r = g.call(view, &[Arg::Tensor(f), dims(&[o, per / glen, glen])])?[0];
                let d = g.call(mul, &[Arg::Tensor(r), Arg::Tensor(scale)])?[0];
                g.call(view, &[Arg::Tensor(d), dims(&m.sizes)])?[0]
            };
            names.push((name, glen));
            map.insert(v, w);
        }
        self.copy_statements(&mut g, &mut map)?;
        Ok((g, names))
    }
}
