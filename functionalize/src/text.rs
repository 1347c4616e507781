//! The program text format (`../shared/spec/program-format.md`): a parser
//! that reports errors with line and column, and a printer whose output
//! parses back to the same graph.

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::graph::{Graph, NodeId, ValueId};
use crate::meta::{Meta, ShapeFmt};
use crate::ops;
use crate::schema::Arg;
use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};
use std::fmt::Write;

#[derive(Clone, Copy, Debug, PartialEq)]
enum Tok<'a> {
    Ident(&'a str),
    Value(&'a str),
    Int(i64),
    Float(f64),
    Str(&'a str),
    Punct(char),
    Eof,
}

/// A token borrowing its text from the source (no allocation per token).
#[derive(Clone, Copy, Debug)]
struct Token<'a> {
    tok: Tok<'a>,
    line: usize,
    col: usize,
}

fn describe(t: &Tok<'_>) -> String {
    match t {
        Tok::Ident(s) => format!("`{s}`"),
        Tok::Value(s) => format!("`%{s}`"),
        Tok::Int(i) => format!("`{i}`"),
        Tok::Float(f) => format!("`{f}`"),
        Tok::Str(s) => format!("\"{s}\""),
        Tok::Punct(c) => format!("`{c}`"),
        Tok::Eof => "the end of the file".into(),
    }
}

fn lex(src: &str) -> Result<Vec<Token<'_>>> {
    // Bytes: every token character is ASCII (a string or comment may hold
    // other UTF-8, sliced at its ASCII delimiters).
    let chars = src.as_bytes();
    let mut out = Vec::with_capacity(src.len() / 4);
    let (mut i, mut line, mut col) = (0, 1, 1);
    let err = |line, col, msg: String| Error::Parse { line, col, msg };
    while i < chars.len() {
        let c = chars[i] as char;
        if !c.is_ascii() {
            // The whole character, for the message.
            let ch = src[i..].chars().next().unwrap_or('?');
            return Err(err(line, col, format!("unexpected character `{ch}`")));
        }
        let (tl, tc) = (line, col);
        let advance = |n: usize, i: &mut usize, col: &mut usize| {
            *i += n;
            *col += n;
        };
        if c == '\n' {
            i += 1;
            line += 1;
            col = 1;
            continue;
        }
        if c.is_whitespace() {
            advance(1, &mut i, &mut col);
            continue;
        }
        if c == '#' {
            while i < chars.len() && chars[i] != b'\n' {
                i += 1;
            }
            continue;
        }
        let word_end = |start: usize| {
            let mut j = start;
            while j < chars.len() && (chars[j].is_ascii_alphanumeric() || chars[j] == b'_') {
                j += 1;
            }
            j
        };
        if c == '%' {
            let j = word_end(i + 1);
            if j == i + 1 {
                return Err(err(tl, tc, "expected a value name after `%`".into()));
            }
            out.push(Token {
                tok: Tok::Value(&src[i + 1..j]),
                line: tl,
                col: tc,
            });
            advance(j - i, &mut i, &mut col);
            continue;
        }
        if c.is_ascii_alphabetic() || c == '_' {
            let j = word_end(i);
            let w = &src[i..j];
            let tok = match w {
                "inf" => Tok::Float(f64::INFINITY),
                "nan" => Tok::Float(f64::NAN),
                _ => Tok::Ident(w),
            };
            out.push(Token {
                tok,
                line: tl,
                col: tc,
            });
            advance(j - i, &mut i, &mut col);
            continue;
        }
        if c.is_ascii_digit()
            || (c == '-' || c == '.')
                && i + 1 < chars.len()
                && (chars[i + 1].is_ascii_digit() || chars[i + 1] == b'i' || chars[i + 1] == b'.')
        {
            let mut j = i;
            if chars[j] == b'-' {
                j += 1;
            }
            if chars[j..].starts_with(b"inf") {
                out.push(Token {
                    tok: Tok::Float(f64::NEG_INFINITY),
                    line: tl,
                    col: tc,
                });
                advance(j + 3 - i, &mut i, &mut col);
                continue;
            }
            let mut is_float = false;
            while j < chars.len() {
                let d = chars[j];
                if d.is_ascii_digit() {
                    j += 1;
                } else if d == b'.' {
                    is_float = true;
                    j += 1;
                } else if (d == b'e' || d == b'E') && !chars[i..j].contains(&b'e') {
                    is_float = true;
                    j += 1;
                    if j < chars.len() && (chars[j] == b'-' || chars[j] == b'+') {
                        j += 1;
                    }
                } else {
                    break;
                }
            }
            let text = &src[i..j];
            let tok = if is_float {
                Tok::Float(
                    text.parse()
                        .map_err(|_| err(tl, tc, format!("bad number `{text}`")))?,
                )
            } else {
                Tok::Int(text.parse().map_err(|_| {
                    err(tl, tc, format!("integer `{text}` does not fit in 64 bits"))
                })?)
            };
            out.push(Token {
                tok,
                line: tl,
                col: tc,
            });
            advance(j - i, &mut i, &mut col);
            continue;
        }
        if c == '"' {
            let mut j = i + 1;
            while j < chars.len() && chars[j] != b'"' && chars[j] != b'\n' {
                j += 1;
            }
            if j >= chars.len() || chars[j] != b'"' {
                return Err(err(tl, tc, "unterminated string".into()));
            }
            let text = &src[i + 1..j];
            out.push(Token {
                tok: Tok::Str(text),
                line: tl,
                col: tc,
            });
            // Columns count characters.
            i = j + 1;
            col += text.chars().count() + 2;
            continue;
        }
        if "()[]{},:=".contains(c) {
            out.push(Token {
                tok: Tok::Punct(c),
                line: tl,
                col: tc,
            });
            advance(1, &mut i, &mut col);
            continue;
        }
        return Err(err(tl, tc, format!("unexpected character `{c}`")));
    }
    out.push(Token {
        tok: Tok::Eof,
        line,
        col,
    });
    Ok(out)
}

struct Parser<'a> {
    toks: Vec<Token<'a>>,
    pos: usize,
    graph: Graph,
    names: HashMap<String, ValueId>,
}

impl<'a> Parser<'a> {
    fn peek(&self) -> &Token<'a> {
        &self.toks[self.pos]
    }
    fn next(&mut self) -> Token<'a> {
        let t = self.toks[self.pos];
        if self.pos + 1 < self.toks.len() {
            self.pos += 1;
        }
        t
    }
    fn fail<T>(&self, t: &Token<'_>, msg: impl Into<String>) -> Result<T> {
        Err(Error::Parse {
            line: t.line,
            col: t.col,
            msg: msg.into(),
        })
    }
    fn expect(&mut self, c: char) -> Result<Token<'a>> {
        let t = self.next();
        if t.tok != Tok::Punct(c) {
            return self.fail(&t, format!("expected `{c}`, found {}", describe(&t.tok)));
        }
        Ok(t)
    }
    fn eat(&mut self, c: char) -> bool {
        if self.peek().tok == Tok::Punct(c) {
            self.next();
            true
        } else {
            false
        }
    }
    fn ident(&mut self, what: &str) -> Result<(String, Token<'a>)> {
        let t = self.next();
        match &t.tok {
            Tok::Ident(s) => Ok((s.to_string(), t)),
            other => self.fail(&t, format!("expected {what}, found {}", describe(other))),
        }
    }
    fn value_name(&mut self) -> Result<(String, Token<'a>)> {
        let t = self.next();
        match &t.tok {
            Tok::Value(s) => Ok((s.to_string(), t)),
            other => self.fail(
                &t,
                format!("expected a value like `%x`, found {}", describe(other)),
            ),
        }
    }
    fn lookup(&self, name: &str, t: &Token<'_>) -> Result<ValueId> {
        match self.names.get(name) {
            Some(&v) => Ok(v),
            None => self.fail(t, format!("`%{name}` is not defined")),
        }
    }
    fn define(&mut self, name: String, v: ValueId, t: &Token<'_>) -> Result<()> {
        if self.names.contains_key(&name) {
            return self.fail(t, format!("`%{name}` is defined twice"));
        }
        self.graph.values[v].name = Some(name.clone());
        self.names.insert(name, v);
        Ok(())
    }

    fn param(&mut self) -> Result<()> {
        let (name, t) = self.value_name()?;
        self.expect(':')?;
        let (dt, dt_tok) = self.ident("a dtype")?;
        let dtype = match DType::parse(&dt) {
            Some(d) => d,
            None => {
                return self.fail(
                    &dt_tok,
                    format!("unknown dtype `{dt}` (expected f32, f16, i32, i64, u32 or bool)"),
                )
            }
        };
        self.expect('[')?;
        let mut sizes = vec![];
        if !self.eat(']') {
            loop {
                let t = self.next();
                match t.tok {
                    Tok::Int(i) if i >= 0 => sizes.push(i as usize),
                    ref other => {
                        return self.fail(
                            &t,
                            format!(
                                "expected a size (a non-negative integer), found {}",
                                describe(other)
                            ),
                        )
                    }
                }
                if self.eat(']') {
                    break;
                }
                self.expect(',')?;
            }
        }
        let v = self.graph.add_input(None, Meta::contiguous(dtype, sizes));
        self.define(name, v, &t)
    }

    fn arg(&mut self) -> Result<Arg<ValueId>> {
        let t = self.next();
        Ok(match &t.tok {
            Tok::Value(n) => Arg::Tensor(self.lookup(n, &t)?),
            Tok::Int(i) => Arg::Int(*i),
            Tok::Float(f) => Arg::Float(*f),
            Tok::Str(s) => Arg::Str(s.to_string()),
            Tok::Ident(w) => match *w {
                "true" => Arg::Bool(true),
                "false" => Arg::Bool(false),
                "none" => Arg::None,
                _ => match DType::parse(w) {
                    Some(d) => Arg::Dtype(d),
                    None => return self.fail(&t, format!("unexpected {}: expected a value, a number, true, false, none, a string, a dtype or a list", describe(&t.tok))),
                },
            },
            Tok::Punct('[') => {
                let mut items = vec![];
                if !self.eat(']') {
                    loop {
                        items.push(self.arg()?);
                        if self.eat(']') {
                            break;
                        }
                        self.expect(',')?;
                    }
                }
                Arg::List(items)
            }
            other => return self.fail(&t, format!("expected an argument, found {}", describe(other))),
        })
    }

    fn statement(&mut self) -> Result<bool> {
        let start = *self.peek();
        if start.tok == Tok::Ident("return") {
            self.next();
            let mut outs = vec![];
            if self.eat('(') {
                if !self.eat(')') {
                    loop {
                        let (n, t) = self.value_name()?;
                        outs.push(self.lookup(&n, &t)?);
                        if self.eat(')') {
                            break;
                        }
                        self.expect(',')?;
                    }
                }
            } else {
                let (n, t) = self.value_name()?;
                outs.push(self.lookup(&n, &t)?);
            }
            self.graph.outputs = outs;
            return Ok(true);
        }
        let mut lhs = vec![];
        if let Tok::Value(_) = start.tok {
            loop {
                lhs.push(self.value_name()?);
                if self.eat('=') {
                    break;
                }
                self.expect(',')?;
            }
        }
        let (op_name, op_tok) = self.ident("an op name")?;
        self.expect('(')?;
        let mut args = vec![];
        if !self.eat(')') {
            loop {
                args.push(self.arg()?);
                if self.eat(')') {
                    break;
                }
                self.expect(',')?;
            }
        }
        let stmt_err = |msg: String, p: &Parser| Error::Statement {
            line: Some(op_tok.line),
            stmt: source_stmt(p, &lhs, &op_name, &args),
            msg,
        };
        let op =
            ops::lookup(&op_name).ok_or_else(|| stmt_err(unknown_op_message(&op_name), self))?;
        let results = self.graph.call(op, &args).map_err(|m| stmt_err(m, self))?;
        let node = *self.graph.order.last().unwrap();
        self.graph.nodes[node].line = Some(op_tok.line);
        if !lhs.is_empty() && lhs.len() != results.len() {
            let msg = format!(
                "{op_name} returns {} tensor(s) here but {} name(s) are given",
                results.len(),
                lhs.len()
            );
            return Err(stmt_err(msg, self));
        }
        for ((name, t), v) in lhs.into_iter().zip(results) {
            self.define(name, v, &t)?;
        }
        Ok(false)
    }
}

fn unknown_op_message(name: &str) -> String {
    let mut near: Vec<&str> = ops::TABLE
        .ops
        .iter()
        .map(|o| o.name.as_str())
        .filter(|n| n.starts_with(name.get(..3).unwrap_or(name)) || name.contains(*n))
        .collect();
    near.truncate(5);
    if near.is_empty() {
        format!("unknown op `{name}`")
    } else {
        format!("unknown op `{name}` (similar: {})", near.join(", "))
    }
}

/// The statement as written, for error messages.
fn source_stmt(
    p: &Parser<'_>,
    lhs: &[(String, Token<'_>)],
    op: &str,
    args: &[Arg<ValueId>],
) -> String {
    let names: HashMap<ValueId, String> = p.names.iter().map(|(k, v)| (*v, k.clone())).collect();
    let mut s = String::new();
    if !lhs.is_empty() {
        let l: Vec<String> = lhs.iter().map(|(n, _)| format!("%{n}")).collect();
        s.push_str(&l.join(", "));
        s.push_str(" = ");
    }
    let a: Vec<String> = args
        .iter()
        .map(|a| fmt_arg(a, &|v| names.get(&v).cloned().unwrap_or_else(|| "?".into())))
        .collect();
    let _ = write!(s, "{op}({})", a.join(", "));
    s
}

/// Parses a program. Errors carry line and column, or name the statement.
pub fn parse(src: &str) -> Result<Graph> {
    let toks = lex(src)?;
    // About one statement a line.
    let lines = src.bytes().filter(|&b| b == b'\n').count();
    let mut p = Parser {
        toks,
        pos: 0,
        graph: Graph::with_capacity("", lines),
        names: HashMap::with_capacity_and_hasher(lines, Default::default()),
    };
    let (kw, t) = p.ident("`graph`")?;
    if kw != "graph" {
        return p.fail(&t, format!("expected `graph`, found `{kw}`"));
    }
    let (name, _) = p.ident("the graph's name")?;
    p.graph.name = name;
    p.expect('(')?;
    if !p.eat(')') {
        loop {
            p.param()?;
            if p.eat(')') {
                break;
            }
            p.expect(',')?;
        }
    }
    p.expect('{')?;
    loop {
        if p.peek().tok == Tok::Punct('}') {
            let t = *p.peek();
            return p.fail(&t, "the graph has no `return` statement");
        }
        if p.peek().tok == Tok::Eof {
            let t = *p.peek();
            return p.fail(&t, "unexpected end of file: missing `return` and `}`");
        }
        if p.statement()? {
            break;
        }
    }
    p.expect('}')?;
    let t = p.next();
    if t.tok != Tok::Eof {
        return p.fail(
            &t,
            format!(
                "unexpected {} after the graph's closing `}}`",
                describe(&t.tok)
            ),
        );
    }
    Ok(p.graph)
}

pub fn fmt_float(f: f64) -> String {
    if f.is_nan() {
        "nan".into()
    } else if f.is_infinite() {
        if f > 0.0 { "inf" } else { "-inf" }.into()
    } else {
        format!("{f:?}")
    }
}

pub fn fmt_arg(a: &Arg<ValueId>, name: &dyn Fn(ValueId) -> String) -> String {
    match a {
        Arg::Tensor(v) => format!("%{}", name(*v)),
        Arg::TensorList(l) => {
            let items: Vec<String> = l
                .iter()
                .map(|x| x.map_or("none".to_string(), |v| format!("%{}", name(v))))
                .collect();
            format!("[{}]", items.join(", "))
        }
        Arg::Int(i) => i.to_string(),
        Arg::Float(f) => fmt_float(*f),
        Arg::Bool(b) => b.to_string(),
        Arg::Str(s) => format!("\"{s}\""),
        Arg::Dtype(d) => d.to_string(),
        Arg::IntList(l) => format!(
            "[{}]",
            l.iter()
                .map(|i| i.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
        Arg::None => "none".into(),
        Arg::List(l) => format!(
            "[{}]",
            l.iter()
                .map(|x| fmt_arg(x, name))
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

/// Names for printing: the given ones, and fresh `%tN` for the rest.
pub struct Names(HashMap<ValueId, String>);

impl Names {
    pub fn of(g: &Graph) -> Names {
        let used: HashSet<&str> = g
            .values
            .values()
            .filter_map(|v| v.name.as_deref())
            .collect();
        let mut map = HashMap::default();
        let mut taken: HashSet<String> = HashSet::default();
        let mut next = 0;
        let mut order: Vec<ValueId> = g.inputs.clone();
        for &n in &g.order {
            order.extend(&g.nodes[n].results);
        }
        for v in order {
            let name = match &g.values[v].name {
                Some(n) if !taken.contains(n) => n.clone(),
                _ => loop {
                    let cand = format!("t{next}");
                    next += 1;
                    if !used.contains(cand.as_str()) && !taken.contains(&cand) {
                        break cand;
                    }
                },
            };
            taken.insert(name.clone());
            map.insert(v, name);
        }
        Names(map)
    }

    pub fn get(&self, v: ValueId) -> String {
        self.0.get(&v).cloned().unwrap_or_else(|| "?".into())
    }
}

/// One statement in the text format.
pub fn fmt_node(g: &Graph, n: NodeId, names: &Names) -> String {
    let node = &g.nodes[n];
    let def = node.op.def();
    let schema = &def.schemas[node.overload];
    let k = schema.needed_args(&node.args);
    let args: Vec<String> = node.args[..k]
        .iter()
        .map(|a| fmt_arg(a, &|v| names.get(v)))
        .collect();
    let lhs: Vec<String> = node
        .results
        .iter()
        .map(|&r| format!("%{}", names.get(r)))
        .collect();
    let call = format!("{}({})", def.name, args.join(", "));
    if lhs.is_empty() {
        call
    } else {
        format!("{} = {call}", lhs.join(", "))
    }
}

/// Prints a graph in the text format.
pub fn print(g: &Graph) -> String {
    let names = Names::of(g);
    let params: Vec<String> = g
        .inputs
        .iter()
        .map(|&v| format!("%{}: {}", names.get(v), g.values[v].meta.type_string()))
        .collect();
    let mut s = format!(
        "graph {}({}) {{\n",
        if g.name.is_empty() { "f" } else { &g.name },
        params.join(", ")
    );
    for &n in &g.order {
        let _ = writeln!(s, "  {}", fmt_node(g, n, &names));
    }
    let outs: Vec<String> = g
        .outputs
        .iter()
        .map(|&v| format!("%{}", names.get(v)))
        .collect();
    if outs.len() == 1 {
        let _ = writeln!(s, "  return {}", outs[0]);
    } else {
        let _ = writeln!(s, "  return ({})", outs.join(", "));
    }
    s.push_str("}\n");
    s
}

/// A short description of a parameter type, for messages.
pub fn type_desc(m: &Meta) -> String {
    format!("{}{}", m.dtype, ShapeFmt(&m.sizes))
}
