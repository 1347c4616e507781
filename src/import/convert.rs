//! An exported program's graph (`graph_module.graph` of the model JSON) as
//! a Kiln program: parameters (weights first, then user inputs), one or
//! more statements per node, arguments placed by the ATen schema's names
//! into the op table's positional form, and the buffer writes of an
//! already functionalized export as `copy_` into the buffer.

use super::archive::{self, Archive};
use super::{decomp, fold, ImportError, Role};
use kiln_functionalize::schema::{Arg, Schema};
use kiln_functionalize::{ops, DType};
use serde_json::Value;
use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;

pub struct Program {
    pub text: String,
    pub roles: Vec<Role>,
    /// Parameters bound to stored tensors: (parameter name, state-dict name).
    pub bound: Vec<(String, String)>,
    /// Constants made at import.
    pub made: Vec<Made>,
}

pub struct Made {
    pub name: String,
    pub dtype: DType,
    pub sizes: Vec<usize>,
    pub bytes: Vec<u8>,
}

/// A node argument, as the archive spells it (`Argument` in
/// `torch/_export/serde/schema.py`).
#[derive(Clone, Debug, PartialEq)]
pub enum A {
    None,
    Tensor(String),
    Tensors(Vec<Option<String>>),
    Int(i64),
    Ints(Vec<i64>),
    Float(f64),
    Floats(Vec<f64>),
    Bool(bool),
    Bools(Vec<bool>),
    Str(String),
    /// A `ScalarType` code.
    Dtype(i64),
    Device,
    /// A `Layout` code (7: strided).
    Layout(i64),
    /// A `MemoryFormat` code (1: contiguous, 4: preserve).
    MemoryFormat(i64),
}

/// The dtype and sizes of a tensor of the graph.
#[derive(Clone, Debug)]
pub struct Meta {
    pub dtype: DType,
    pub sizes: Vec<usize>,
}

/// One node of the exported graph.
pub struct Node<'a> {
    /// `conv2d` of `torch.ops.aten.conv2d.default`.
    pub op: String,
    /// `default` of the same.
    pub overload: String,
    /// The node's name (its first output's).
    pub name: String,
    pub args: Vec<(String, A)>,
    /// Output tensor names (`None`: an output nobody uses).
    pub outputs: Vec<Option<String>>,
    pub trace: Option<&'a str>,
}

impl Node<'_> {
    pub fn get(&self, name: &str) -> Option<&A> {
        self.args
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, a)| a)
            .filter(|a| **a != A::None)
    }

    pub fn tensor(&self, name: &str) -> Result<&str, String> {
        match self.get(name) {
            Some(A::Tensor(t)) => Ok(t),
            Some(a) => Err(format!("argument `{name}` is {a:?}, not a tensor")),
            None => Err(format!("argument `{name}` is missing")),
        }
    }

    pub fn opt_tensor(&self, name: &str) -> Result<Option<&str>, String> {
        match self.get(name) {
            None => Ok(None),
            Some(_) => self.tensor(name).map(Some),
        }
    }

    pub fn int(&self, name: &str, default: i64) -> Result<i64, String> {
        match self.get(name) {
            None => Ok(default),
            Some(A::Int(i)) => Ok(*i),
            Some(A::Bool(b)) => Ok(*b as i64),
            Some(a) => Err(format!("argument `{name}` is {a:?}, not an integer")),
        }
    }

    /// An `int[N]` argument: a list, or one integer for every entry (`n`
    /// 0: a list of any length).
    pub fn ints(&self, name: &str, n: usize, default: &[i64]) -> Result<Vec<i64>, String> {
        let v = match self.get(name) {
            None => default.to_vec(),
            Some(A::Ints(v)) => v.clone(),
            Some(A::Int(i)) => vec![*i; n],
            Some(a) => return Err(format!("argument `{name}` is {a:?}, not integers")),
        };
        match v.len() {
            _ if n == 0 => Ok(v),
            1 if n > 1 => Ok(vec![v[0]; n]),
            0 => Ok(vec![]),
            l if l == n => Ok(v),
            l => Err(format!("argument `{name}` has {l} entries, expected {n}")),
        }
    }

    pub fn float(&self, name: &str, default: f64) -> Result<f64, String> {
        match self.get(name) {
            None => Ok(default),
            Some(A::Float(x)) => Ok(*x),
            Some(A::Int(i)) => Ok(*i as f64),
            Some(a) => Err(format!("argument `{name}` is {a:?}, not a number")),
        }
    }

    pub fn opt_float(&self, name: &str) -> Result<Option<f64>, String> {
        self.get(name).map(|_| self.float(name, 0.0)).transpose()
    }

    pub fn bool(&self, name: &str, default: bool) -> Result<bool, String> {
        match self.get(name) {
            None => Ok(default),
            Some(A::Bool(b)) => Ok(*b),
            Some(a) => Err(format!("argument `{name}` is {a:?}, not a bool")),
        }
    }

    /// A `ScalarType?` argument.
    pub fn dtype(&self, name: &str) -> Result<Option<DType>, String> {
        match self.get(name) {
            None => Ok(None),
            Some(A::Dtype(c)) => archive::dtype_of_code(*c).map(Some).map_err(|d| {
                format!(
                    "converts to {d}, which Kiln does not hold ({})",
                    archive::dtype_advice(d)
                )
            }),
            Some(a) => Err(format!("argument `{name}` is {a:?}, not a dtype")),
        }
    }

    /// The name of output `i` (a fresh one where nobody uses it).
    pub fn out(&self, i: usize) -> String {
        self.outputs
            .get(i)
            .cloned()
            .flatten()
            .unwrap_or_else(|| format!("{}_unused{i}", self.name))
    }

    /// `aten.conv2d.default`.
    pub fn target(&self) -> String {
        format!("aten.{}.{}", self.op, self.overload)
    }

    /// Where the node comes from: its name and the user's own source line.
    pub fn place(&self) -> String {
        let mut s = format!("node `{}`", self.name);
        if let Some(line) = self.trace.and_then(user_line) {
            let _ = write!(s, ", from {line}");
        }
        s
    }
}

/// The innermost frame of a node's `stack_trace` that is the user's code
/// (not PyTorch's own modules), with its source line.
pub fn user_line(trace: &str) -> Option<String> {
    let frames: Vec<(String, Option<&str>)> = {
        let lines: Vec<&str> = trace.lines().collect();
        let mut out = vec![];
        let mut i = 0;
        while i < lines.len() {
            let l = lines[i].trim();
            if l.starts_with("File ") {
                let code = lines
                    .get(i + 1)
                    .map(|c| c.trim())
                    .filter(|c| !c.starts_with("File "));
                out.push((l.to_string(), code));
            }
            i += 1;
        }
        out
    };
    let is_torch = |f: &str| ["/torch/", "\\torch\\"].iter().any(|p| f.contains(p));
    // Code FX generated (`File "<eval_with_key>.5"`) is nobody's source.
    let generated = |f: &str| f.starts_with("File \"<");
    let (frame, code) = frames
        .iter()
        .rev()
        .find(|(f, _)| !is_torch(f) && !generated(f))
        .or(frames.iter().rev().find(|(f, _)| !generated(f)))
        .or(frames.last())?;
    Some(match code {
        Some(c) => format!("{frame}: `{c}`"),
        None => frame.clone(),
    })
}

/// The program being written: statements, names and the metas of the
/// graph's tensors.
pub struct Out {
    lines: String,
    /// Kiln names taken so far.
    used: HashSet<String>,
    /// Names of the graph's tensors, kept for them (sanitized).
    reserved: HashSet<String>,
    /// Graph tensor name -> Kiln value (`%name`).
    env: HashMap<String, String>,
    metas: HashMap<String, Meta>,
    /// State-dict name -> the parameter bound to it.
    by_fqn: HashMap<String, String>,
    /// Graph input name -> state-dict name, for stored tensors.
    weight_of: HashMap<String, String>,
    pub made: Vec<Made>,
}

/// A Kiln name for a graph name: letters, digits and `_`.
fn sanitize(name: &str) -> String {
    let s: String = name
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
        .collect();
    if s.is_empty() {
        "v".into()
    } else {
        s
    }
}

impl Out {
    /// A name not taken yet, `base` itself where possible.
    pub fn fresh(&mut self, base: &str) -> String {
        let base = sanitize(base);
        let mut name = base.clone();
        let mut k = 1;
        while self.used.contains(&name) || self.reserved.contains(&name) {
            name = format!("{base}_{k}");
            k += 1;
        }
        self.used.insert(name.clone());
        name
    }

    /// The Kiln name for graph tensor `name` (its own, sanitized, if free).
    fn claim(&mut self, name: &str) -> String {
        let s = sanitize(name);
        if self.reserved.remove(&s) && !self.used.contains(&s) {
            self.used.insert(s.clone());
            s
        } else {
            self.fresh(name)
        }
    }

    /// The Kiln value of graph tensor `name`.
    pub fn val(&self, name: &str) -> Result<String, String> {
        self.env
            .get(name)
            .cloned()
            .ok_or_else(|| format!("tensor `{name}` is used before it is defined"))
    }

    pub fn meta(&self, name: &str) -> Result<&Meta, String> {
        self.metas
            .get(name)
            .ok_or_else(|| format!("tensor `{name}` has no static dtype and sizes in the archive"))
    }

    /// Graph tensor `name` is the Kiln value `v`.
    pub fn bind(&mut self, name: &str, v: String) {
        self.env.insert(name.to_string(), v);
    }

    /// `%fresh = op(args)`, named after `base`.
    pub fn emit(&mut self, base: &str, op: &str, args: &[String]) -> String {
        let name = self.fresh(base);
        self.statement(std::slice::from_ref(&name), op, args);
        format!("%{name}")
    }

    /// `%a, %b, ... = op(args)` for the first `k` outputs of `n`.
    pub fn emit_outs(&mut self, n: &Node, k: usize, op: &str, args: &[String]) -> Vec<String> {
        let names: Vec<String> = (0..k).map(|i| self.claim(&n.out(i))).collect();
        self.statement(&names, op, args);
        names.into_iter().map(|v| format!("%{v}")).collect()
    }

    /// `%out = op(args)` for output `i` of `n` (its own name where free).
    pub fn emit_out(&mut self, n: &Node, i: usize, op: &str, args: &[String]) -> String {
        let name = self.claim(&n.out(i));
        self.statement(std::slice::from_ref(&name), op, args);
        format!("%{name}")
    }

    /// `op(args)`, its result unused.
    pub fn emit_void(&mut self, op: &str, args: &[String]) {
        self.statement(&[], op, args);
    }

    fn statement(&mut self, names: &[String], op: &str, args: &[String]) {
        self.lines.push_str("  ");
        if !names.is_empty() {
            let names: Vec<String> = names.iter().map(|n| format!("%{n}")).collect();
            let _ = write!(self.lines, "{} = ", names.join(", "));
        }
        let _ = writeln!(self.lines, "{op}({})", args.join(", "));
    }

    /// A constant made at import, a parameter bound to `bytes`.
    pub fn constant(
        &mut self,
        base: &str,
        dtype: DType,
        sizes: Vec<usize>,
        bytes: Vec<u8>,
    ) -> String {
        let name = self.fresh(base);
        self.made.push(Made {
            name: name.clone(),
            dtype,
            sizes,
            bytes,
        });
        format!("%{name}")
    }
}

/// A float literal of the text format.
pub fn float(x: f64) -> String {
    if x.is_nan() {
        "nan".into()
    } else if x.is_infinite() {
        if x > 0.0 { "inf" } else { "-inf" }.into()
    } else {
        format!("{x:?}")
    }
}

pub fn ints(v: &[i64]) -> String {
    let s: Vec<String> = v.iter().map(i64::to_string).collect();
    format!("[{}]", s.join(", "))
}

pub fn usizes(v: &[usize]) -> String {
    let s: Vec<String> = v.iter().map(usize::to_string).collect();
    format!("[{}]", s.join(", "))
}

/// Reads the archive's graph and writes the Kiln program.
/// `fold`: batch norms fold into the convolutions before them (`fold`),
/// and the weights no statement reads any more are no parameters. Off,
/// the program is the export as it is, every weight a parameter.
pub fn convert(a: &Archive, fold: bool) -> Result<Program, ImportError> {
    let gm = a
        .model
        .get("graph_module")
        .ok_or_else(|| damaged(a, "the model has no `graph_module`"))?;
    let graph = gm
        .get("graph")
        .ok_or_else(|| damaged(a, "the model has no `graph_module.graph`"))?;
    let sig = gm
        .get("signature")
        .ok_or_else(|| damaged(a, "the model has no `graph_module.signature`"))?;
    let mut out = Out {
        lines: String::new(),
        used: HashSet::new(),
        reserved: HashSet::new(),
        env: HashMap::new(),
        metas: HashMap::new(),
        by_fqn: HashMap::new(),
        weight_of: HashMap::new(),
        made: vec![],
    };
    let symbolic = read_metas(a, graph, &mut out)?;
    let (mut params, mut roles, bound, users) = parameters(a, sig, &mut out, &symbolic)?;
    let nodes = graph
        .get("nodes")
        .and_then(Value::as_array)
        .ok_or_else(|| damaged(a, "the graph has no `nodes` list"))?;
    let mut parsed = vec![];
    for (i, nv) in nodes.iter().enumerate() {
        match node(nv) {
            Ok(n) => parsed.push(n),
            Err(m) => {
                // A node reading a size an earlier one made symbolic
                // (`nonzero`'s): that node's error first.
                symbolic_results(a, &parsed, &symbolic)?;
                return Err(damaged(a, &format!("node {i}: {m}")));
            }
        }
    }
    symbolic_results(a, &parsed, &symbolic)?;
    let folds = match fold {
        true => fold::plan(a, &parsed, &out.weight_of, &written(&parsed, sig, &out)),
        false => HashMap::new(),
    };
    for (n, nv) in parsed.iter().zip(nodes) {
        if let Some(f) = folds.get(&n.name) {
            folded_conv(&mut out, n, nv, f)?;
        } else if !folds.values().any(|f| f.norm_node == n.name) {
            lower_node(&mut out, n, nv)?;
        }
    }
    let returns = outputs(a, sig, &mut out)?;
    let mut bound = bound;
    if !folds.is_empty() {
        // The folded convolutions' weights and the batch norms' tensors.
        let mut i = 0;
        while i < params.len() - users {
            let name = params[i][1..]
                .split(':')
                .next()
                .unwrap_or_default()
                .to_string();
            if mentions(&out.lines, &name) {
                i += 1;
                continue;
            }
            params.remove(i);
            roles.remove(i);
            bound.retain(|(p, _)| *p != name);
        }
    }
    finish(a, out, params, roles, bound, users, returns)
}

/// An error for the first node whose result has a symbolic size: the
/// op's reason where the import refuses it (`nonzero`: a size that
/// depends on the values), else a dynamic-shape export's.
fn symbolic_results(
    a: &Archive,
    nodes: &[Node],
    symbolic: &HashMap<String, usize>,
) -> Result<(), ImportError> {
    let first = nodes.iter().find_map(|n| {
        n.outputs
            .iter()
            .flatten()
            .find_map(|o| symbolic.get(o).map(|&d| (n, o, d)))
    });
    if let Some((n, o, _)) = first {
        if let Some(why) = decomp::refused(&n.op) {
            return Err(ImportError::Op(format!(
                "op `{}` ({}) is not supported: {why}",
                n.target(),
                n.place()
            )));
        }
        if !n.op.is_empty() && n.target() != "aten.getitem.default" {
            return Err(ImportError::Symbolic(format!(
                "{}: tensor `{o}` made by `{}` ({}) has a size or offset the export left \
                 symbolic: the program was exported with `dynamic_shapes`, or the size depends \
                 on a tensor's values (`tensor_split` by a tensor of indices, say); Kiln \
                 compiles static shapes: export without `dynamic_shapes` and pass such \
                 arguments as Python ints",
                a.path,
                n.target(),
                n.place()
            )));
        }
    }
    let named = first
        .map(|(_, o, d)| (o.clone(), d))
        .or_else(|| symbolic.iter().next().map(|(k, &d)| (k.clone(), d)));
    match named {
        Some((name, d)) => Err(ImportError::Symbolic(format!(
            "{}: tensor `{name}` has a symbolic size at dimension {d} (a dynamic-shape \
             export); Kiln compiles static shapes: export without `dynamic_shapes`",
            a.path
        ))),
        None => Ok(()),
    }
}

/// Does the program text read `%name`?
fn mentions(lines: &str, name: &str) -> bool {
    let pat = format!("%{name}");
    lines.match_indices(&pat).any(|(i, _)| {
        !lines[i + pat.len()..].starts_with(|c: char| c.is_ascii_alphanumeric() || c == '_')
    })
}

/// The program's text around its statements.
fn finish(
    a: &Archive,
    out: Out,
    mut params: Vec<String>,
    mut roles: Vec<Role>,
    bound: Vec<(String, String)>,
    users: usize,
    returns: Vec<String>,
) -> Result<Program, ImportError> {
    // Constants made at import are weights: before the user inputs.
    let at = params.len() - users;
    for m in out.made.iter().rev() {
        params.insert(
            at,
            format!("%{}: {}{}", m.name, m.dtype.name(), usizes(&m.sizes)),
        );
        roles.insert(at, Role::Made);
    }
    let mut text = String::new();
    let _ = writeln!(
        text,
        "# imported from {} by kiln import",
        a.path.rsplit('/').next().unwrap_or(&a.path)
    );
    let _ = writeln!(text, "graph model({}) {{", params.join(", "));
    text.push_str(&out.lines);
    let _ = writeln!(text, "  return ({})", returns.join(", "));
    text.push_str("}\n");
    Ok(Program {
        text,
        roles,
        bound,
        made: out.made,
    })
}

/// Graph tensors the program writes: `self` of in-place ops, and the
/// targets of an already functionalized export's mutations.
fn written(nodes: &[Node], sig: &Value, out: &Out) -> HashSet<String> {
    let mut w: HashSet<String> = nodes
        .iter()
        .filter(|n| n.op.ends_with('_'))
        .filter_map(|n| match n.args.first() {
            Some((_, A::Tensor(t))) => Some(t.clone()),
            _ => None,
        })
        .collect();
    let specs = sig.get("output_specs").and_then(Value::as_array);
    for spec in specs.into_iter().flatten() {
        for key in ["buffer_name", "user_input_name"] {
            let target = spec
                .as_object()
                .and_then(|o| o.values().next())
                .and_then(|b| b.get(key))
                .and_then(Value::as_str);
            if let Some(t) = target {
                w.insert(t.to_string());
                w.extend(
                    out.weight_of
                        .iter()
                        .filter(|(_, f)| *f == t)
                        .map(|(n, _)| n.clone()),
                );
            }
        }
    }
    w
}

/// A convolution with a batch norm folded into it: the table's op on the
/// folded weight and bias, its result also the batch norm's.
fn folded_conv(out: &mut Out, n: &Node, raw: &Value, f: &fold::Fold) -> Result<(), ImportError> {
    let w = out.constant(
        &format!("{}_folded_weight", n.name),
        f.dtype,
        f.weight_sizes.clone(),
        f.weight.clone(),
    );
    let b = out.constant(
        &format!("{}_folded_bias", n.name),
        f.dtype,
        vec![f.weight_sizes[0]],
        f.bias.clone(),
    );
    let (wn, bn) = (
        format!("{}__folded_w", n.name),
        format!("{}__folded_b", n.name),
    );
    out.bind(&wn, w);
    out.bind(&bn, b);
    let args = n
        .args
        .iter()
        .map(|(k, a)| match k.as_str() {
            "weight" => (k.clone(), A::Tensor(wn.clone())),
            "bias" => (k.clone(), A::Tensor(bn.clone())),
            _ => (k.clone(), a.clone()),
        })
        .chain(
            (!n.args.iter().any(|(k, _)| k == "bias"))
                .then(|| ("bias".to_string(), A::Tensor(bn.clone()))),
        )
        .collect();
    let conv = Node {
        op: n.op.clone(),
        overload: n.overload.clone(),
        name: n.name.clone(),
        args,
        outputs: n.outputs.clone(),
        trace: n.trace,
    };
    lower_node(out, &conv, raw)?;
    let Some(Some(result)) = n.outputs.first() else {
        return Err(ImportError::Op(format!(
            "`{}` ({}): a convolution without a result",
            n.target(),
            n.place()
        )));
    };
    let v = out.val(result).map_err(ImportError::Op)?;
    out.bind(&f.norm_output, v);
    Ok(())
}

fn damaged(a: &Archive, msg: &str) -> ImportError {
    ImportError::Archive(format!("{}: {msg}", a.path))
}

/// Every tensor's dtype and sizes (`graph.tensor_values`); returns the
/// tensors with symbolic sizes (with the first symbolic dimension).
fn read_metas(
    a: &Archive,
    graph: &Value,
    out: &mut Out,
) -> Result<HashMap<String, usize>, ImportError> {
    let mut symbolic = HashMap::new();
    let Some(values) = graph.get("tensor_values").and_then(Value::as_object) else {
        return Err(damaged(a, "the graph has no `tensor_values`"));
    };
    for (name, m) in values {
        out.reserved.insert(sanitize(name));
        let (code, sizes, _, _) = match archive::tensor_meta(m) {
            Ok(meta) => meta,
            // A symbolic storage offset: a view at a data-dependent place.
            Err(e) if e.contains("symbolic") => {
                symbolic.insert(name.clone(), 0);
                continue;
            }
            Err(e) => return Err(damaged(a, &format!("tensor `{name}`: {e}"))),
        };
        if let Some(d) = sizes.iter().position(Option::is_none) {
            symbolic.insert(name.clone(), d);
            continue;
        }
        let Ok(dtype) = archive::dtype_of_code(code) else {
            continue;
        };
        let sizes = sizes
            .into_iter()
            .map(|s| usize::try_from(s.unwrap_or(0)).unwrap_or(usize::MAX))
            .collect();
        out.metas.insert(name.clone(), Meta { dtype, sizes });
    }
    Ok(symbolic)
}

/// Declarations, roles, bound weights, and how many are user inputs.
type Params = (Vec<String>, Vec<Role>, Vec<(String, String)>, usize);

/// The parameters: weights, buffers and constants bound to the archive's
/// tensors, then the user inputs, in the signature's order (which puts
/// weights first).
fn parameters(
    a: &Archive,
    sig: &Value,
    out: &mut Out,
    symbolic: &HashMap<String, usize>,
) -> Result<Params, ImportError> {
    let specs = sig
        .get("input_specs")
        .and_then(Value::as_array)
        .ok_or_else(|| damaged(a, "the signature has no `input_specs`"))?;
    let (mut decls, mut roles, mut bound) = (vec![], vec![], vec![]);
    let mut weights = vec![];
    let mut users = vec![];
    for spec in specs {
        let (kind, body) = spec
            .as_object()
            .and_then(|o| o.iter().next())
            .ok_or_else(|| damaged(a, "an input spec is empty"))?;
        let arg_name = |b: &Value| -> Option<String> {
            let arg = b.get("arg")?;
            arg.get("name")
                .or_else(|| arg.get("as_tensor").and_then(|t| t.get("name")))
                .and_then(Value::as_str)
                .map(str::to_string)
        };
        match kind.as_str() {
            "parameter" | "buffer" | "tensor_constant" => {
                let key = match kind.as_str() {
                    "parameter" => "parameter_name",
                    "buffer" => "buffer_name",
                    _ => "tensor_constant_name",
                };
                let name = arg_name(body)
                    .ok_or_else(|| damaged(a, &format!("a {kind} input has no argument name")))?;
                let fqn = body
                    .get(key)
                    .and_then(Value::as_str)
                    .ok_or_else(|| damaged(a, &format!("{kind} `{name}` has no `{key}`")))?;
                weights.push((name, fqn.to_string()));
            }
            "user_input" => match arg_name(body) {
                Some(name) => users.push(name),
                None => {
                    return Err(ImportError::Unsupported(format!(
                        "{}: a user input is not a tensor ({}); Kiln imports models whose \
                         forward takes tensors (Python numbers are baked in at export)",
                        a.path,
                        body.get("arg").map(Value::to_string).unwrap_or_default()
                    )))
                }
            },
            // Python numbers given at export: baked into the graph.
            "constant_input" => {}
            other => {
                return Err(ImportError::Unsupported(format!(
                    "{}: an input of kind `{other}` (Kiln imports tensors: parameters, buffers, \
                     constants and user inputs)",
                    a.path
                )))
            }
        }
    }
    for (name, fqn) in weights {
        let s = a.get(&fqn).ok_or_else(|| {
            ImportError::Weight(format!(
                "{}: `{fqn}` (input `{name}`) is not among the archive's weights and constants",
                a.path
            ))
        })?;
        if let Some(m) = out.metas.get(&name) {
            if m.sizes != s.sizes || m.dtype != s.dtype {
                return Err(ImportError::Weight(format!(
                    "{}: weight `{fqn}` is stored as {} {:?}, the graph declares {} {:?}",
                    a.path,
                    s.dtype.name(),
                    s.sizes,
                    m.dtype.name(),
                    m.sizes
                )));
            }
        }
        let kiln = out.claim(&name);
        decls.push(format!("%{kiln}: {}{}", s.dtype.name(), usizes(&s.sizes)));
        out.bind(&name, format!("%{kiln}"));
        out.by_fqn.insert(fqn.clone(), format!("%{kiln}"));
        out.weight_of.insert(name.clone(), fqn.clone());
        roles.push(Role::Weight(fqn.clone()));
        bound.push((kiln, fqn));
    }
    let n_users = users.len();
    for name in users {
        if let Some(&d) = symbolic.get(&name) {
            return Err(ImportError::Symbolic(format!(
                "{}: input `{name}` has a symbolic size at dimension {d} (a dynamic-shape \
                 export); Kiln compiles static shapes: export without `dynamic_shapes`, \
                 once per input shape you need",
                a.path
            )));
        }
        let m = out.meta(&name).map_err(|_| {
            ImportError::Unsupported(format!(
                "{}: input `{name}` has a dtype Kiln does not hold (Kiln holds f32, f16, \
                 i32, i64, u32, i8 and bool)",
                a.path
            ))
        })?;
        let decl = format!("{}{}", m.dtype.name(), usizes(&m.sizes));
        let kiln = out.claim(&name);
        decls.push(format!("%{kiln}: {decl}"));
        out.bind(&name, format!("%{kiln}"));
        roles.push(Role::User(name));
    }
    Ok((decls, roles, bound, n_users))
}

/// The return list: user outputs in order; an already functionalized
/// export's buffer and input writes become `copy_` statements.
fn outputs(a: &Archive, sig: &Value, out: &mut Out) -> Result<Vec<String>, ImportError> {
    let specs = sig
        .get("output_specs")
        .and_then(Value::as_array)
        .ok_or_else(|| damaged(a, "the signature has no `output_specs`"))?;
    let mut returns = vec![];
    for (i, spec) in specs.iter().enumerate() {
        let (kind, body) = spec
            .as_object()
            .and_then(|o| o.iter().next())
            .ok_or_else(|| damaged(a, "an output spec is empty"))?;
        let arg = body.get("arg");
        let tensor = arg
            .and_then(|x| x.get("as_tensor").or(Some(x)))
            .and_then(|x| x.get("name"))
            .and_then(Value::as_str);
        let Some(t) = tensor else {
            return Err(ImportError::Unsupported(format!(
                "{}: output {i} is not a tensor ({}); Kiln returns tensors",
                a.path,
                arg.map(Value::to_string).unwrap_or_default()
            )));
        };
        let v = out.val(t).map_err(|m| damaged(a, &m))?;
        match kind.as_str() {
            "user_output" | "loss_output" => returns.push(v),
            "buffer_mutation" | "user_input_mutation" => {
                let key = if kind == "buffer_mutation" {
                    "buffer_name"
                } else {
                    "user_input_name"
                };
                let target = body.get(key).and_then(Value::as_str).unwrap_or_default();
                // A buffer by state-dict name, an input by its own.
                let param = out
                    .by_fqn
                    .get(target)
                    .or_else(|| out.env.get(target))
                    .cloned()
                    .ok_or_else(|| damaged(a, &format!("{kind} of unknown `{target}`")))?;
                out.emit_void("copy_", &[param, v]);
            }
            other => {
                return Err(ImportError::Unsupported(format!(
                    "{}: an output of kind `{other}` (a joint or training graph); \
                     export the model's forward in eval mode",
                    a.path
                )))
            }
        }
    }
    Ok(returns)
}

/// One argument of a node.
fn argument(v: &Value) -> Result<A, String> {
    let (k, x) = v
        .as_object()
        .and_then(|o| o.iter().next())
        .ok_or("an empty argument")?;
    let tname = |t: &Value| -> Option<String> { t.get("name")?.as_str().map(str::to_string) };
    let float = |x: &Value| -> Option<f64> {
        // Bare `Infinity` / `NaN` words arrive as "inf" / "nan"
        // (`archive::finite_json`); newer writers quote them.
        x.as_f64().or_else(|| match x.as_str()? {
            "inf" | "Infinity" | "+Infinity" => Some(f64::INFINITY),
            "-inf" | "-Infinity" => Some(f64::NEG_INFINITY),
            "nan" | "NaN" | "-NaN" => Some(f64::NAN),
            _ => None,
        })
    };
    let sym = |x: &Value| -> Result<i64, String> {
        archive::sym_int(x).ok_or_else(|| {
            "a symbolic size (a dynamic-shape export); export with static shapes".to_string()
        })
    };
    let bad = || format!("argument `{k}` holds {x}");
    Ok(match k.as_str() {
        "as_none" => A::None,
        "as_tensor" => A::Tensor(tname(x).ok_or_else(bad)?),
        "as_tensors" => A::Tensors(
            x.as_array()
                .ok_or_else(bad)?
                .iter()
                .map(|t| tname(t).map(Some).ok_or_else(bad))
                .collect::<Result<_, _>>()?,
        ),
        "as_optional_tensors" => A::Tensors(
            x.as_array()
                .ok_or_else(bad)?
                .iter()
                .map(|t| match t.get("as_tensor") {
                    Some(t) => tname(t).map(Some).ok_or_else(bad),
                    None => Ok(None),
                })
                .collect::<Result<_, _>>()?,
        ),
        "as_optional_tensor" => match x.get("as_tensor") {
            Some(t) => A::Tensor(tname(t).ok_or_else(bad)?),
            None => A::None,
        },
        "as_int" => A::Int(x.as_i64().ok_or_else(bad)?),
        "as_sym_int" => A::Int(sym(x)?),
        "as_ints" => A::Ints(
            x.as_array()
                .ok_or_else(bad)?
                .iter()
                .map(|i| i.as_i64().ok_or_else(bad))
                .collect::<Result<_, _>>()?,
        ),
        "as_sym_ints" => A::Ints(
            x.as_array()
                .ok_or_else(bad)?
                .iter()
                .map(sym)
                .collect::<Result<_, _>>()?,
        ),
        "as_float" => A::Float(float(x).ok_or_else(bad)?),
        "as_sym_float" => A::Float(
            x.get("as_float")
                .and_then(float)
                .ok_or("a symbolic float (a dynamic-shape export)")?,
        ),
        "as_floats" => A::Floats(
            x.as_array()
                .ok_or_else(bad)?
                .iter()
                .map(|f| float(f).ok_or_else(bad))
                .collect::<Result<_, _>>()?,
        ),
        "as_bool" => A::Bool(x.as_bool().ok_or_else(bad)?),
        "as_sym_bool" => A::Bool(
            x.get("as_bool")
                .and_then(Value::as_bool)
                .ok_or("a symbolic bool (a dynamic-shape export)")?,
        ),
        "as_bools" => A::Bools(
            x.as_array()
                .ok_or_else(bad)?
                .iter()
                .map(|b| b.as_bool().ok_or_else(bad))
                .collect::<Result<_, _>>()?,
        ),
        "as_string" => A::Str(x.as_str().ok_or_else(bad)?.to_string()),
        "as_scalar_type" => A::Dtype(x.as_i64().ok_or_else(bad)?),
        "as_device" => A::Device,
        "as_layout" => A::Layout(x.as_i64().ok_or_else(bad)?),
        "as_memory_format" => A::MemoryFormat(x.as_i64().ok_or_else(bad)?),
        "as_graph" => return Err("a subgraph (a higher-order op)".into()),
        other => {
            return Err(format!(
                "an argument of kind `{other}`, which Kiln does not take"
            ))
        }
    })
}

/// A node of the JSON graph.
fn node(v: &Value) -> Result<Node<'_>, String> {
    let target = v
        .get("target")
        .and_then(Value::as_str)
        .ok_or("no `target`")?;
    let mut args = vec![];
    for (i, a) in v
        .get("inputs")
        .and_then(Value::as_array)
        .ok_or("no `inputs`")?
        .iter()
        .enumerate()
    {
        let name = a
            .get("name")
            .and_then(Value::as_str)
            .map(str::to_string)
            .unwrap_or_else(|| format!("arg{i}"));
        let arg = a.get("arg").ok_or("an input without `arg`")?;
        // A subgraph argument is reported with the op's name (below).
        let parsed = match argument(arg) {
            Ok(p) => p,
            Err(_) if arg.get("as_graph").is_some() => A::None,
            Err(e) => return Err(format!("`{target}`, argument `{name}`: {e}")),
        };
        args.push((name, parsed));
    }
    let mut outputs = vec![];
    for o in v
        .get("outputs")
        .and_then(Value::as_array)
        .ok_or("no `outputs`")?
    {
        match argument(o)? {
            A::Tensor(t) => outputs.push(Some(t)),
            A::Tensors(ts) => outputs.extend(ts),
            A::None => outputs.push(None),
            // Sizes and other non-tensor results (`sym_size`): symbolic.
            _ => outputs.push(None),
        }
    }
    let (op, overload) = target
        .strip_prefix("torch.ops.aten.")
        .and_then(|t| t.rsplit_once('.'))
        .map(|(o, v)| (o.to_string(), v.to_string()))
        .unwrap_or_else(|| (target.to_string(), String::new()));
    let name = v
        .get("name")
        .and_then(Value::as_str)
        .map(str::to_string)
        .or_else(|| outputs.iter().flatten().next().cloned())
        .unwrap_or_else(|| op.clone());
    let trace = v
        .get("metadata")
        .and_then(|m| m.get("stack_trace"))
        .and_then(Value::as_str);
    Ok(Node {
        op,
        overload,
        name,
        args,
        outputs,
        trace,
    })
}

/// Writes the statements of one node.
fn lower_node(out: &mut Out, n: &Node, raw: &Value) -> Result<(), ImportError> {
    let target = raw["target"].as_str().unwrap_or_default();
    if let Some(hop) = target.strip_prefix("torch.ops.higher_order.") {
        return Err(ImportError::Op(format!(
            "the higher-order op `{hop}` ({}) is not supported: Kiln imports straight-line \
             programs; rewrite the model without `torch.cond`, `while_loop` or `torch.no_grad` \
             regions inside forward",
            n.place()
        )));
    }
    if target == "_operator.getitem" || target == "operator.getitem" {
        return getitem(out, n);
    }
    if !target.starts_with("torch.ops.aten.") {
        return Err(unknown(n, target));
    }
    if let Some(why) = decomp::refused(&n.op) {
        return Err(ImportError::Op(format!(
            "op `{}` ({}) is not supported: {why}",
            n.target(),
            n.place()
        )));
    }
    if n.overload == "out" {
        return out_variant(out, n);
    }
    let results = if let Some(f) = decomp::find(&n.op) {
        f(out, n).map_err(|m| ImportError::Op(format!("`{}` ({}): {m}", n.target(), n.place())))?
    } else {
        call_table(out, n)?
    };
    for (name, v) in n.outputs.iter().zip(results) {
        if let Some(name) = name {
            out.bind(name, v);
        }
    }
    Ok(())
}

/// `op.out(..., out)`: the op's functional overload, its result copied
/// into `out` with `copy_`, and `out` returned (as eager's `out=`).
fn out_variant(out: &mut Out, n: &Node) -> Result<(), ImportError> {
    let err = |m: String| ImportError::Op(format!("op `{}` ({}): {m}", n.target(), n.place()));
    let dest = n.tensor("out").map_err(err)?.to_string();
    let functional = Node {
        op: n.op.clone(),
        overload: "default".into(),
        name: n.name.clone(),
        args: n.args.iter().filter(|(k, _)| k != "out").cloned().collect(),
        outputs: vec![None],
        trace: n.trace,
    };
    let r = match decomp::find(&n.op) {
        Some(f) => f(out, &functional).map_err(err)?,
        None => call_table(out, &functional)?,
    };
    let d = out.val(&dest).map_err(ImportError::Archive)?;
    let first = r
        .into_iter()
        .next()
        .ok_or_else(|| err("no result".into()))?;
    out.emit_void("copy_", &[d.clone(), first]);
    if let Some(Some(name)) = n.outputs.first() {
        out.bind(name, d);
    }
    Ok(())
}

fn unknown(n: &Node, target: &str) -> ImportError {
    ImportError::Op(format!(
        "op `{target}` ({}) is not supported by Kiln; `kiln ops` lists the ops Kiln runs \
         and docs/import.md the ones it imports",
        n.place()
    ))
}

/// `getitem(list, i)` of a multi-output node left in the graph.
fn getitem(out: &mut Out, n: &Node) -> Result<(), ImportError> {
    let (src, idx) = match n.args.as_slice() {
        [(_, A::Tensors(l)), (_, A::Int(i))] => (l.clone(), *i),
        _ => {
            return Err(ImportError::Unsupported(format!(
                "`getitem` ({}) of something other than a list of tensors",
                n.place()
            )))
        }
    };
    let t = usize::try_from(idx)
        .ok()
        .and_then(|i| src.get(i).cloned().flatten())
        .ok_or_else(|| {
            ImportError::Unsupported(format!(
                "`getitem` ({}): index {idx} out of range",
                n.place()
            ))
        })?;
    let v = out.val(&t).map_err(ImportError::Archive)?;
    if let Some(o) = n.outputs.first().cloned().flatten() {
        out.bind(&o, v);
    }
    Ok(())
}

/// Arguments ATen's schema has that Kiln's does not, harmless at these
/// values: placement (Kiln places tensors itself), strided layout,
/// contiguous or preserved memory format, no pinning, no asynchrony.
fn neutral(name: &str, a: &A) -> bool {
    match a {
        A::None | A::Device => true,
        A::Layout(l) => *l == 7,
        A::MemoryFormat(m) => matches!(m, 0 | 1 | 4),
        // Asynchrony changes nothing in a program's values.
        A::Bool(_) if name == "non_blocking" => true,
        A::Bool(b) => !b && matches!(name, "pin_memory" | "copy"),
        _ => false,
    }
}

/// A node of an op the table has: its arguments placed by name into the
/// overload of the same name (`add.Tensor`), defaults filled between.
pub fn call_table(out: &mut Out, n: &Node) -> Result<Vec<String>, ImportError> {
    let Some(id) = ops::lookup(&n.op) else {
        return Err(unknown(n, &format!("aten.{}.{}", n.op, n.overload)));
    };
    let def = ops::op(id);
    let wanted = if n.overload == "default" {
        ""
    } else {
        n.overload.as_str()
    };
    let given: Vec<&str> = n
        .args
        .iter()
        .filter(|(k, a)| !neutral(k, a))
        .map(|(k, _)| k.as_str())
        .collect();
    let schema = def
        .schemas
        .iter()
        .find(|s| s.overload == wanted)
        .or_else(|| {
            def.schemas
                .iter()
                .find(|s| given.iter().all(|g| s.params.iter().any(|p| p.name == *g)))
        })
        .ok_or_else(|| {
            let have: Vec<&str> = def.schemas.iter().map(|s| s.text.as_str()).collect();
            ImportError::Op(format!(
                "op `{}` ({}): Kiln's `{}` has no overload `{}` (it has: {})",
                n.target(),
                n.place(),
                def.name,
                n.overload,
                have.join("; ")
            ))
        })?;
    let args = place(out, n, schema)?;
    let outs: Vec<String> = (0..n.outputs.len().max(1))
        .map(|i| out.claim(&n.out(i)))
        .collect();
    out.statement(&outs, &def.name, &args);
    Ok(outs.into_iter().map(|o| format!("%{o}")).collect())
}

/// The node's arguments in `schema`'s order, defaults filled up to the
/// last one given.
fn place(out: &mut Out, n: &Node, schema: &Schema) -> Result<Vec<String>, ImportError> {
    let err = |m: String| ImportError::Op(format!("op `{}` ({}): {m}", n.target(), n.place()));
    for (k, a) in &n.args {
        if !schema.params.iter().any(|p| p.name == *k) && !neutral(k, a) {
            return Err(err(format!(
                "argument `{k}` = {a:?} is not supported (Kiln's schema: {})",
                schema.text
            )));
        }
    }
    let mut args = vec![];
    let mut last = 0;
    for p in &schema.params {
        match n.args.iter().find(|(k, _)| *k == p.name) {
            // A Python number where the op takes a tensor (`sub(1, x)`,
            // as `rsub` decomposes): a 0-d tensor of its kind, which
            // promotes as the wrapped number does.
            Some((_, a @ (A::Int(_) | A::Float(_) | A::Bool(_))))
                if p.ty == kiln_functionalize::schema::ParamType::Tensor =>
            {
                let dtype = match a {
                    A::Int(_) => "i64",
                    A::Float(_) => "f32",
                    _ => "bool",
                };
                let v = render(out, a).map_err(|m| err(format!("argument `{}`: {m}", p.name)))?;
                args.push(out.emit(&n.name, "scalar_tensor", &[v, dtype.into()]));
                last = args.len();
            }
            Some((_, a)) => {
                args.push(render(out, a).map_err(|m| err(format!("argument `{}`: {m}", p.name)))?);
                last = args.len();
            }
            None => args.push(match &p.default {
                Some(d) => render_default(d),
                None if p.optional => "none".into(),
                None => return Err(err(format!("argument `{}` is missing", p.name))),
            }),
        }
    }
    args.truncate(last);
    Ok(args)
}

/// An argument in the text format.
pub fn render(out: &Out, a: &A) -> Result<String, String> {
    Ok(match a {
        A::None | A::Device | A::Layout(_) | A::MemoryFormat(_) => "none".into(),
        A::Tensor(t) => out.val(t)?,
        A::Tensors(l) => {
            let v = l
                .iter()
                .map(|t| match t {
                    Some(t) => out.val(t),
                    None => Ok("none".into()),
                })
                .collect::<Result<Vec<_>, _>>()?;
            format!("[{}]", v.join(", "))
        }
        A::Int(i) => i.to_string(),
        A::Ints(v) => ints(v),
        A::Float(x) => float(*x),
        A::Floats(v) => format!(
            "[{}]",
            v.iter().map(|x| float(*x)).collect::<Vec<_>>().join(", ")
        ),
        A::Bool(b) => b.to_string(),
        A::Bools(v) => format!(
            "[{}]",
            v.iter().map(bool::to_string).collect::<Vec<_>>().join(", ")
        ),
        A::Str(s) => format!("{s:?}"),
        A::Dtype(c) => archive::dtype_of_code(*c)
            .map_err(|d| {
                format!(
                    "dtype {d}, which Kiln does not hold ({})",
                    archive::dtype_advice(d)
                )
            })?
            .name()
            .to_string(),
    })
}

fn render_default(d: &Arg<()>) -> String {
    match d {
        Arg::Int(i) => i.to_string(),
        Arg::Float(x) => float(*x),
        Arg::Bool(b) => b.to_string(),
        Arg::Str(s) => format!("{s:?}"),
        Arg::Dtype(t) => t.name().to_string(),
        Arg::IntList(v) => ints(v),
        Arg::List(l) => format!(
            "[{}]",
            l.iter().map(render_default).collect::<Vec<_>>().join(", ")
        ),
        Arg::None | Arg::Tensor(()) | Arg::TensorList(_) => "none".into(),
    }
}
