//! ATen schemas (`slice.Tensor(Tensor self, int dim=0, ...)`): each op of the
//! table declares the overloads it accepts as the schema strings of PyTorch's
//! `native_functions.yaml`; binding a call checks every argument's kind,
//! fills defaults and picks the overload, as ATen does.

use crate::dtype::DType;
use std::fmt;

/// One argument of a statement: a tensor (`V`, a value id in a graph, a
/// tensor at run time) or a literal.
#[derive(Clone, Debug, PartialEq)]
pub enum Arg<V> {
    Tensor(V),
    /// `Tensor?[]` / `Tensor[]`: a list of optional tensors.
    TensorList(Vec<Option<V>>),
    Int(i64),
    Float(f64),
    Bool(bool),
    Str(String),
    Dtype(DType),
    IntList(Vec<i64>),
    None,
    /// A list as written, before binding decides what it holds.
    List(Vec<Arg<V>>),
}

impl<V> Arg<V> {
    pub fn map<'a, W>(&'a self, f: &mut impl FnMut(&'a V) -> W) -> Arg<W> {
        match self {
            Arg::Tensor(v) => Arg::Tensor(f(v)),
            Arg::TensorList(l) => {
                Arg::TensorList(l.iter().map(|x| x.as_ref().map(&mut *f)).collect())
            }
            Arg::Int(i) => Arg::Int(*i),
            Arg::Float(x) => Arg::Float(*x),
            Arg::Bool(b) => Arg::Bool(*b),
            Arg::Str(s) => Arg::Str(s.clone()),
            Arg::Dtype(d) => Arg::Dtype(*d),
            Arg::IntList(l) => Arg::IntList(l.clone()),
            Arg::None => Arg::None,
            Arg::List(l) => Arg::List(l.iter().map(|a| a.map(f)).collect()),
        }
    }

    /// Tensors this argument refers to, in order.
    pub fn tensors(&self) -> smallvec::SmallVec<[&V; 2]> {
        let mut out = smallvec::SmallVec::new();
        self.each_tensor(&mut |v| out.push(v));
        out
    }

    /// Calls `f` on each tensor this argument refers to, in order (no
    /// list built: graph walks call this for every node).
    pub fn each_tensor<'a>(&'a self, f: &mut impl FnMut(&'a V)) {
        match self {
            Arg::Tensor(v) => f(v),
            Arg::TensorList(l) => l.iter().flatten().for_each(f),
            Arg::List(l) => l.iter().for_each(|a| a.each_tensor(f)),
            _ => {}
        }
    }

    /// Equality with floats compared bit for bit (so `nan` equals `nan`).
    pub fn same(&self, other: &Arg<V>) -> bool
    where
        V: PartialEq,
    {
        match (self, other) {
            (Arg::Float(a), Arg::Float(b)) => a.to_bits() == b.to_bits(),
            (Arg::List(a), Arg::List(b)) => {
                a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x.same(y))
            }
            _ => self == other,
        }
    }

    pub fn kind_name(&self) -> &'static str {
        match self {
            Arg::Tensor(_) => "a tensor",
            Arg::TensorList(_) | Arg::List(_) | Arg::IntList(_) => "a list",
            Arg::Int(_) => "an integer",
            Arg::Float(_) => "a float",
            Arg::Bool(_) => "a bool",
            Arg::Str(_) => "a string",
            Arg::Dtype(_) => "a dtype",
            Arg::None => "none",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ParamType {
    Tensor,
    TensorList,
    Int,
    IntList,
    /// `int[1]`: a list that a bare integer may stand for.
    IntListOrInt,
    Float,
    Scalar,
    Bool,
    /// `bool[3] output_mask`: a list of bools (held as `Arg::List`).
    BoolList,
    Str,
    Dtype,
}

#[derive(Clone, Debug)]
pub struct Param {
    pub name: String,
    pub ty: ParamType,
    pub optional: bool,
    pub default: Option<Arg<()>>,
    pub kwarg_only: bool,
}

#[derive(Clone, Debug)]
pub struct Schema {
    pub name: String,
    pub overload: String,
    pub params: Vec<Param>,
    /// `-> Tensor[]`: the number of results is decided by the shape rule.
    pub returns_list: bool,
    pub text: String,
}

/// An op's schemas, parsed on first use: a program uses few of the table's
/// ops, and parsing all of them up front was most of building the table
/// (a tenth of functionalizing a small program through the CLI).
#[derive(Debug)]
pub struct Schemas {
    texts: Vec<Box<str>>,
    parsed: std::sync::OnceLock<Vec<Schema>>,
}

impl Schemas {
    /// Schemas to parse when first used, by their texts.
    pub fn lazy(texts: Vec<Box<str>>) -> Schemas {
        Schemas {
            texts,
            parsed: std::sync::OnceLock::new(),
        }
    }

    /// Schemas parsed already (a custom function's).
    pub fn parsed(schemas: Vec<Schema>) -> Schemas {
        Schemas {
            texts: schemas.iter().map(|s| s.text.as_str().into()).collect(),
            parsed: schemas.into(),
        }
    }

    /// The schemas' texts, unparsed.
    pub fn texts(&self) -> impl Iterator<Item = &str> {
        self.texts.iter().map(|t| &**t)
    }
}

impl std::ops::Deref for Schemas {
    type Target = [Schema];
    fn deref(&self) -> &[Schema] {
        self.parsed
            .get_or_init(|| self.texts.iter().map(|t| Schema::parse(t)).collect())
    }
}

impl fmt::Display for Schema {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl Schema {
    /// Parses a schema given by a user (a custom function's): what `parse`
    /// would stop on is an error here.
    pub fn try_parse(text: &str) -> Result<Schema, String> {
        let bad = |why: &str| Err(format!("schema `{text}`: {why}"));
        let Some(open) = text.find('(') else {
            return bad("no `(`");
        };
        let mut depth = 0;
        let close = text[open..].char_indices().find_map(|(i, c)| {
            match c {
                '(' => depth += 1,
                ')' => depth -= 1,
                _ => {}
            }
            (depth == 0).then_some(open + i)
        });
        let Some(close) = close else {
            return bad("no `)` closing the arguments");
        };
        if close < open || !text[close + 1..].trim_start().starts_with("->") {
            return bad("expected `name(ARGS) -> RESULTS`");
        }
        let name = &text[..open];
        if name.is_empty()
            || !name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':' || c == '.')
        {
            return bad("the name has characters other than letters, digits, `_`, `::` and `.`");
        }
        for piece in split_top_level(&text[open + 1..close]) {
            let piece = piece.trim();
            if piece.is_empty() || piece == "*" {
                continue;
            }
            let (decl, default) = match piece.split_once('=') {
                Some((d, v)) => (d.trim(), Some(v.trim())),
                None => (piece, None),
            };
            let Some((ty, _)) = decl.rsplit_once(' ') else {
                return bad(&format!("`{piece}` needs a type and a name"));
            };
            let base = strip_alias(ty);
            let base = base.trim_end_matches('?');
            let known = [
                "Tensor",
                "Tensor[]",
                "Tensor?[]",
                "int",
                "SymInt",
                "int[]",
                "SymInt[]",
                "int[1]",
                "float",
                "Scalar",
                "bool",
                "str",
                "ScalarType",
            ];
            if !known.contains(&base) && !is_bool_list(base) {
                return bad(&format!(
                    "unsupported type `{ty}` (use one of {})",
                    known.join(", ")
                ));
            }
            if let Some(d) = default {
                let simple = ["None", "True", "False"].contains(&d) || d.parse::<f64>().is_ok();
                if !simple {
                    return bad(&format!(
                        "default `{d}`: only None, True, False and numbers"
                    ));
                }
            }
        }
        Ok(Schema::parse(text))
    }

    /// Parses a schema string from the op table (a programming error in the
    /// table panics here, at table construction, never on user input).
    pub fn parse(text: &str) -> Schema {
        let open = text.find('(').expect("schema has '('");
        let mut depth = 0;
        let close = text[open..]
            .char_indices()
            .find_map(|(i, c)| {
                match c {
                    '(' => depth += 1,
                    ')' => depth -= 1,
                    _ => {}
                }
                (depth == 0).then_some(open + i)
            })
            .expect("schema has a closing ')'");
        let full_name = &text[..open];
        let (name, overload) = match full_name.split_once('.') {
            Some((n, o)) => (n.to_string(), o.to_string()),
            None => (full_name.to_string(), String::new()),
        };
        let ret = text[close + 1..].trim();
        let returns_list = ret.contains("[]");
        let mut params = Vec::new();
        let mut kwarg_only = false;
        for piece in split_top_level(&text[open + 1..close]) {
            let piece = piece.trim();
            if piece.is_empty() {
                continue;
            }
            if piece == "*" {
                kwarg_only = true;
                continue;
            }
            let (decl, default) = match piece.split_once('=') {
                Some((d, v)) => (d.trim(), Some(v.trim())),
                None => (piece, None),
            };
            let (ty, pname) = decl.rsplit_once(' ').expect("param has a type and a name");
            let ty = strip_alias(ty);
            let optional = ty.ends_with('?') && !ty.ends_with("?[]");
            let base = ty.trim_end_matches('?');
            let ty = match base {
                "Tensor" => ParamType::Tensor,
                "Tensor[]" | "Tensor?[]" => ParamType::TensorList,
                "int" | "SymInt" => ParamType::Int,
                "int[]" | "SymInt[]" => ParamType::IntList,
                // `int[2] stride=1`: a fixed-length list a bare integer
                // may stand for (repeated by the op's rule).
                t if is_fixed_int_list(t) => ParamType::IntListOrInt,
                "float" => ParamType::Float,
                "Scalar" => ParamType::Scalar,
                "bool" => ParamType::Bool,
                t if is_bool_list(t) => ParamType::BoolList,
                "str" => ParamType::Str,
                "ScalarType" => ParamType::Dtype,
                other => panic!("unsupported schema type {other} in {text}"),
            };
            let default = default.map(|d| parse_default(d, ty));
            params.push(Param {
                name: pname.to_string(),
                ty,
                optional,
                default,
                kwarg_only,
            });
        }
        Schema {
            name,
            overload,
            params,
            returns_list,
            text: text.to_string(),
        }
    }

    /// Binds positional arguments to this overload, filling defaults.
    /// Would `bind` succeed? (No allocation: overloads are tried with it
    /// first.)
    pub fn accepts<V>(&self, args: &[Arg<V>]) -> bool {
        args.len() <= self.params.len()
            && self
                .params
                .iter()
                .enumerate()
                .all(|(i, p)| match args.get(i) {
                    Some(a) => accepts_one(p, a),
                    None => p.default.is_some(),
                })
    }

    pub fn bind<V: Clone>(&self, args: &[Arg<V>]) -> Result<Vec<Arg<V>>, String> {
        if args.len() > self.params.len() {
            return Err(format!(
                "takes at most {} arguments, got {}",
                self.params.len(),
                args.len()
            ));
        }
        let mut out = Vec::with_capacity(self.params.len());
        for (i, p) in self.params.iter().enumerate() {
            match args.get(i) {
                Some(a) => out.push(bind_one(p, a).ok_or_else(|| {
                    format!(
                        "argument {} ({}) cannot be {}",
                        i + 1,
                        p.name,
                        a.kind_name()
                    )
                })?),
                None => match &p.default {
                    Some(d) => out.push(d.map(&mut |_| unreachable!("defaults hold no tensors"))),
                    None => return Err(format!("missing argument {} ({})", i + 1, p.name)),
                },
            }
        }
        Ok(out)
    }

    /// How many leading arguments the printer must write: trailing ones
    /// equal to their defaults are left out.
    pub fn needed_args<V: PartialEq>(&self, args: &[Arg<V>]) -> usize {
        let mut n = args.len();
        while n > 0 {
            let p = &self.params[n - 1];
            let is_default = match &p.default {
                Some(d) => same_literal(d, &args[n - 1]),
                None => false,
            };
            if !is_default {
                break;
            }
            n -= 1;
        }
        n
    }
}

fn same_literal<V>(d: &Arg<()>, a: &Arg<V>) -> bool {
    match (d, a) {
        (Arg::None, Arg::None) => true,
        (Arg::Int(x), Arg::Int(y)) => x == y,
        (Arg::Float(x), Arg::Float(y)) => x.to_bits() == y.to_bits(),
        (Arg::Bool(x), Arg::Bool(y)) => x == y,
        (Arg::Str(x), Arg::Str(y)) => x == y,
        (Arg::IntList(x), Arg::IntList(y)) => x == y,
        _ => false,
    }
}

/// `bind_one(p, a).is_some()`, without building the bound argument.
fn accepts_one<V>(p: &Param, a: &Arg<V>) -> bool {
    let item = |x: &Arg<V>, tensor: bool| match x {
        Arg::Tensor(_) | Arg::None => tensor,
        Arg::Int(_) => !tensor,
        _ => false,
    };
    match (p.ty, a) {
        (_, Arg::None) => p.optional,
        (ParamType::Tensor, Arg::Tensor(_)) => true,
        (ParamType::TensorList, Arg::List(items)) => items.iter().all(|x| item(x, true)),
        (ParamType::TensorList, Arg::TensorList(_)) => true,
        (ParamType::Int, Arg::Int(_)) => true,
        (ParamType::IntList | ParamType::IntListOrInt, Arg::List(items)) => {
            items.iter().all(|x| matches!(x, Arg::Int(_)))
        }
        (ParamType::IntList | ParamType::IntListOrInt, Arg::IntList(_)) => true,
        (ParamType::IntListOrInt, Arg::Int(_)) => true,
        (ParamType::Float, Arg::Float(_) | Arg::Int(_)) => true,
        (ParamType::Scalar, Arg::Int(_) | Arg::Float(_) | Arg::Bool(_)) => true,
        (ParamType::Bool, Arg::Bool(_)) => true,
        (ParamType::BoolList, Arg::List(items)) => items.iter().all(|x| matches!(x, Arg::Bool(_))),
        (ParamType::Str, Arg::Str(_)) => true,
        (ParamType::Dtype, Arg::Dtype(_)) => true,
        _ => false,
    }
}

fn bind_one<V: Clone>(p: &Param, a: &Arg<V>) -> Option<Arg<V>> {
    if matches!(a, Arg::None) {
        return p.optional.then_some(Arg::None);
    }
    Some(match (p.ty, a) {
        (ParamType::Tensor, Arg::Tensor(_)) => a.clone(),
        (ParamType::TensorList, Arg::List(items)) => Arg::TensorList(
            items
                .iter()
                .map(|x| match x {
                    Arg::Tensor(v) => Some(Some(v.clone())),
                    Arg::None => Some(None),
                    _ => None,
                })
                .collect::<Option<Vec<_>>>()?,
        ),
        (ParamType::TensorList, Arg::TensorList(_)) => a.clone(),
        (ParamType::Int, Arg::Int(_)) => a.clone(),
        (ParamType::IntList | ParamType::IntListOrInt, Arg::List(items)) => Arg::IntList(
            items
                .iter()
                .map(|x| match x {
                    Arg::Int(i) => Some(*i),
                    _ => None,
                })
                .collect::<Option<Vec<_>>>()?,
        ),
        (ParamType::IntList | ParamType::IntListOrInt, Arg::IntList(_)) => a.clone(),
        (ParamType::IntListOrInt, Arg::Int(i)) => Arg::IntList(vec![*i]),
        (ParamType::Float, Arg::Float(_)) => a.clone(),
        (ParamType::Float, Arg::Int(i)) => Arg::Float(*i as f64),
        (ParamType::Scalar, Arg::Int(_) | Arg::Float(_) | Arg::Bool(_)) => a.clone(),
        (ParamType::Bool, Arg::Bool(_)) => a.clone(),
        (ParamType::BoolList, Arg::List(items))
            if items.iter().all(|x| matches!(x, Arg::Bool(_))) =>
        {
            a.clone()
        }
        (ParamType::Str, Arg::Str(_)) => a.clone(),
        (ParamType::Dtype, Arg::Dtype(_)) => a.clone(),
        _ => return None,
    })
}

fn strip_alias(ty: &str) -> String {
    // `Tensor(a!)` -> `Tensor`, `Tensor(a)[]` -> `Tensor[]`.
    let mut out = String::new();
    let mut depth = 0;
    for c in ty.chars() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            _ if depth == 0 => out.push(c),
            _ => {}
        }
    }
    out
}

fn split_top_level(s: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut depth = 0;
    let mut start = 0;
    for (i, c) in s.char_indices() {
        match c {
            '(' | '[' => depth += 1,
            ')' | ']' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&s[start..]);
    out
}

/// `int[N]` or `SymInt[N]` for a digit `N`.
/// `bool[]` or `bool[N]`.
fn is_bool_list(t: &str) -> bool {
    t.strip_prefix("bool[")
        .and_then(|r| r.strip_suffix(']'))
        .is_some_and(|n| n.bytes().all(|b| b.is_ascii_digit()))
}

fn is_fixed_int_list(t: &str) -> bool {
    let inner = t
        .strip_prefix("int[")
        .or_else(|| t.strip_prefix("SymInt["))
        .and_then(|r| r.strip_suffix(']'));
    inner.is_some_and(|n| n.len() == 1 && n.as_bytes()[0].is_ascii_digit())
}

fn parse_default(d: &str, ty: ParamType) -> Arg<()> {
    match d {
        _ if ty == ParamType::IntListOrInt && d != "None" && !d.starts_with('[') => {
            Arg::IntList(vec![d
                .parse()
                .unwrap_or_else(|_| panic!("bad default {d}"))])
        }
        "None" => Arg::None,
        "True" => Arg::Bool(true),
        "False" => Arg::Bool(false),
        _ if d.starts_with('"') || d.starts_with('\'') => Arg::Str(d[1..d.len() - 1].to_string()),
        _ if d.starts_with('[') => Arg::IntList(
            d[1..d.len() - 1]
                .split(',')
                .filter(|x| !x.trim().is_empty())
                .map(|x| x.trim().parse().unwrap())
                .collect(),
        ),
        _ if ty == ParamType::Float => Arg::Float(d.parse().unwrap()),
        _ => match d.parse::<i64>() {
            Ok(i) => Arg::Int(i),
            Err(_) => Arg::Float(d.parse().unwrap_or_else(|_| panic!("bad default {d}"))),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn binds_and_fills_defaults() {
        let s = Schema::parse("slice.Tensor(Tensor(a) self, int dim=0, SymInt? start=None, SymInt? end=None, SymInt step=1) -> Tensor(a)");
        let bound = s.bind(&[Arg::Tensor(7), Arg::Int(1)]).unwrap();
        assert_eq!(
            bound,
            vec![
                Arg::Tensor(7),
                Arg::Int(1),
                Arg::None,
                Arg::None,
                Arg::Int(1)
            ]
        );
        assert_eq!(s.needed_args(&bound), 2);
        assert!(s.bind(&[Arg::<u8>::Int(1)]).is_err());
        let g = Schema::parse("gelu(Tensor self, *, str approximate='none') -> Tensor");
        assert!(g.params[1].kwarg_only);
        assert_eq!(
            g.bind(&[Arg::Tensor(0), Arg::Str("tanh".into())]).unwrap()[1],
            Arg::Str("tanh".into())
        );
    }
}
