//! The program text format (`docs/program-format.md`): a parser
//! that reports errors with line and column, and a printer whose output
//! parses back to the same graph.

use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::graph::{Graph, MetaPool, NodeId, ValueId};
use crate::meta::{Meta, ShapeFmt};
use crate::ops;
use crate::schema::Arg;
use rustc_hash::{FxHashMap as HashMap, FxHashSet as HashSet};
use std::fmt::Write;
use std::sync::Arc;

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
/// Its column is only worked out for an error message (`column`).
#[derive(Clone, Copy, Debug)]
struct Token<'a> {
    tok: Tok<'a>,
    line: usize,
    /// Byte offset of the token's first character.
    pos: usize,
}

/// The 1-based column (in characters) of byte offset `pos` of `src`.
fn column(src: &str, pos: usize) -> usize {
    let start = src[..pos].rfind('\n').map_or(0, |i| i + 1);
    src[start..pos].chars().count() + 1
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

/// Tokens on demand (no token list: a million-statement program would
/// hold ten million of them). A lexing error ends the stream; the parser
/// reports it as the first error in the file.
struct Lexer<'a> {
    src: &'a str,
    i: usize,
    line: usize,
    error: Option<Error>,
}

fn is_word_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

impl<'a> Lexer<'a> {
    fn new(src: &'a str) -> Lexer<'a> {
        Lexer {
            src,
            i: 0,
            line: 1,
            error: None,
        }
    }

    /// The next token, or `Eof` (after an error too, which is kept).
    fn token(&mut self) -> Token<'a> {
        if self.error.is_none() {
            match self.scan() {
                Ok(t) => return t,
                Err(e) => self.error = Some(e),
            }
        }
        Token {
            tok: Tok::Eof,
            line: self.line,
            pos: self.i,
        }
    }

    fn err(&self, line: usize, pos: usize, msg: String) -> Error {
        Error::Parse {
            line,
            col: column(self.src, pos),
            msg,
        }
    }

    /// The end of the word starting at `j`.
    fn word_end(&self, mut j: usize) -> usize {
        let b = self.src.as_bytes();
        while j < b.len() && is_word_byte(b[j]) {
            j += 1;
        }
        j
    }

    fn scan(&mut self) -> Result<Token<'a>> {
        // Bytes: every token character is ASCII (a string or comment may
        // hold other UTF-8, sliced at its ASCII delimiters).
        let src = self.src;
        let b = src.as_bytes();
        let mut i = self.i;
        // Whitespace and comments.
        loop {
            match b.get(i) {
                None => {
                    self.i = i;
                    return Ok(Token {
                        tok: Tok::Eof,
                        line: self.line,
                        pos: i,
                    });
                }
                Some(b' ' | b'\t' | b'\r' | 0x0b | 0x0c) => i += 1,
                Some(b'\n') => {
                    i += 1;
                    self.line += 1;
                }
                Some(b'#') => {
                    while i < b.len() && b[i] != b'\n' {
                        i += 1;
                    }
                }
                Some(_) => break,
            }
        }
        let (start, line) = (i, self.line);
        let c = b[i];
        let next = b.get(i + 1).copied().unwrap_or(0);
        let (tok, end) = match c {
            b'(' | b')' | b'[' | b']' | b'{' | b'}' | b',' | b':' | b'=' => {
                (Tok::Punct(c as char), i + 1)
            }
            b'%' => {
                let j = self.word_end(i + 1);
                if j == i + 1 {
                    return Err(self.err(line, start, "expected a value name after `%`".into()));
                }
                (Tok::Value(&src[i + 1..j]), j)
            }
            b'a'..=b'z' | b'A'..=b'Z' | b'_' => {
                let mut j = self.word_end(i);
                // A custom function's qualified name: `namespace::name`.
                while b.get(j..j + 2) == Some(b"::")
                    && b.get(j + 2)
                        .is_some_and(|c| c.is_ascii_alphabetic() || *c == b'_')
                {
                    j = self.word_end(j + 2);
                }
                let tok = match &src[i..j] {
                    "inf" => Tok::Float(f64::INFINITY),
                    "nan" => Tok::Float(f64::NAN),
                    w => Tok::Ident(w),
                };
                (tok, j)
            }
            b'0'..=b'9' => self.number(i, line)?,
            b'-' | b'.' if next.is_ascii_digit() || next == b'i' || next == b'.' => {
                self.number(i, line)?
            }
            b'"' => {
                let mut j = i + 1;
                while j < b.len() && b[j] != b'"' && b[j] != b'\n' {
                    j += 1;
                }
                if j >= b.len() || b[j] != b'"' {
                    return Err(self.err(line, start, "unterminated string".into()));
                }
                (Tok::Str(&src[i + 1..j]), j + 1)
            }
            _ => {
                // The whole character, for the message.
                let ch = src[i..].chars().next().unwrap_or('?');
                return Err(self.err(line, start, format!("unexpected character `{ch}`")));
            }
        };
        self.i = end;
        Ok(Token {
            tok,
            line,
            pos: start,
        })
    }

    /// A number starting at `i` (a sign, digits, `.`, an exponent, or
    /// `-inf`): the token and where it ends.
    fn number(&self, i: usize, line: usize) -> Result<(Tok<'a>, usize)> {
        let (src, b) = (self.src, self.src.as_bytes());
        let mut j = i;
        if b[j] == b'-' {
            j += 1;
        }
        if b[j..].starts_with(b"inf") {
            return Ok((Tok::Float(f64::NEG_INFINITY), j + 3));
        }
        let mut is_float = false;
        while j < b.len() {
            let d = b[j];
            if d.is_ascii_digit() {
                j += 1;
            } else if d == b'.' {
                is_float = true;
                j += 1;
            } else if (d == b'e' || d == b'E') && !b[i..j].contains(&b'e') {
                is_float = true;
                j += 1;
                if j < b.len() && (b[j] == b'-' || b[j] == b'+') {
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
                    .map_err(|_| self.err(line, i, format!("bad number `{text}`")))?,
            )
        } else {
            Tok::Int(text.parse().map_err(|_| {
                self.err(line, i, format!("integer `{text}` does not fit in 64 bits"))
            })?)
        };
        Ok((tok, j))
    }
}

/// Parsing proper: tokens to `Item`s, each statement bound to an overload
/// and its results' metadata inferred. Values are numbered (parameters
/// first, then named results in order of definition); `Build` turns the
/// items into the graph, on another thread for a large program.
struct Parser<'a> {
    lex: Lexer<'a>,
    /// The next token.
    cur: Token<'a>,
    /// Names as written, borrowed from the source, and their numbers.
    names: HashMap<&'a str, u32>,
    /// By value number: the name and the metadata.
    named: Vec<(&'a str, Arc<Meta>)>,
    /// By value number: the tensor object it is, as eager sees objects
    /// (the value number of its first value): an in-place op's result is
    /// its `self`. An op that changes `self`'s metadata rebinds every
    /// name of the object.
    objects: Vec<u32>,
    /// The inferred metadata, each held once.
    pool: MetaPool,
}

/// A parsed piece of a program, in source order.
enum Item<'a> {
    Name(&'a str),
    Param(&'a str, Meta),
    Stmt(Stmt<'a>),
    /// The outputs; the file has been read to its end without error.
    Return(Vec<u32>),
}

/// A statement, checked: its results' names, the op, the overload, the
/// bound arguments (values numbered, `numbered`, until `Build` resolves
/// them in place) and the results' metadata.
struct Stmt<'a> {
    lhs: smallvec::SmallVec<[&'a str; 2]>,
    line: usize,
    op: ops::OpId,
    overload: usize,
    bound: Vec<Arg<ValueId>>,
    results: smallvec::SmallVec<[Arc<Meta>; 2]>,
}

/// Value number `i` in the place of a value id: the parser numbers values
/// before they exist.
fn numbered(i: u32) -> ValueId {
    slotmap::KeyData::from_ffi(i as u64).into()
}

/// The number of a value standing for one (`numbered`).
fn number(v: &ValueId) -> usize {
    use slotmap::Key;
    (v.data().as_ffi() & 0xffff_ffff) as usize
}

/// Replaces the numbered values of `a` (`numbered`) by `values`.
fn resolve(a: &mut Arg<ValueId>, values: &[ValueId]) {
    let at = |v: &mut ValueId| *v = values[number(v)];
    match a {
        Arg::Tensor(v) => at(v),
        Arg::TensorList(l) => l.iter_mut().flatten().for_each(at),
        Arg::List(l) => l.iter_mut().for_each(|x| resolve(x, values)),
        _ => {}
    }
}

impl<'a> Parser<'a> {
    fn peek(&self) -> &Token<'a> {
        &self.cur
    }
    fn next(&mut self) -> Token<'a> {
        let t = self.cur;
        if t.tok != Tok::Eof {
            self.cur = self.lex.token();
        }
        t
    }
    /// An error at `t`; a lexing error met before it comes first (the
    /// parser only ever sees it as an early end of file).
    fn fail<T>(&self, t: &Token<'_>, msg: impl Into<String>) -> Result<T> {
        if let Some(e) = &self.lex.error {
            return Err(e.clone());
        }
        Err(Error::Parse {
            line: t.line,
            col: column(self.lex.src, t.pos),
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
    fn ident(&mut self, what: &str) -> Result<(&'a str, Token<'a>)> {
        let t = self.next();
        match t.tok {
            Tok::Ident(s) => Ok((s, t)),
            other => self.fail(&t, format!("expected {what}, found {}", describe(&other))),
        }
    }
    fn value_name(&mut self) -> Result<(&'a str, Token<'a>)> {
        let t = self.next();
        match t.tok {
            Tok::Value(s) => Ok((s, t)),
            other => self.fail(
                &t,
                format!("expected a value like `%x`, found {}", describe(&other)),
            ),
        }
    }
    fn lookup(&self, name: &str, t: &Token<'_>) -> Result<u32> {
        match self.names.get(name) {
            Some(&v) => Ok(v),
            None => self.fail(t, format!("`%{name}` is not defined")),
        }
    }
    /// Gives `name` (of metadata `meta`) the next value number; false if
    /// it had one.
    fn define(&mut self, name: &'a str, meta: Arc<Meta>) -> bool {
        let n = self.named.len() as u32;
        self.named.push((name, meta));
        self.objects.push(n);
        self.names.insert(name, n).is_none()
    }

    /// After `op` on `self_` (a value number) gave values `first..`: an
    /// in-place op's result is `self_`'s object; one that changes its
    /// metadata (`transpose_`, `resize_`) makes every name of the object
    /// name the result, as every Python reference to it sees the change.
    fn same_object(&mut self, op: ops::OpId, self_: u32, first: u32) {
        let def = op.def();
        if def.kind != ops::OpKind::InPlace && def.metadata.is_none() {
            return;
        }
        let object = self.objects[self_ as usize];
        if let Some(o) = self.objects.get_mut(first as usize) {
            *o = object;
        }
        if def.metadata.is_some() {
            let objects = &self.objects;
            for n in self.names.values_mut() {
                if objects[*n as usize] == object {
                    *n = first;
                }
            }
        }
    }

    fn header(&mut self, out: &mut impl FnMut(Item<'a>) -> bool) -> Result<()> {
        let (kw, t) = self.ident("`graph`")?;
        if kw != "graph" {
            return self.fail(&t, format!("expected `graph`, found `{kw}`"));
        }
        let (name, _) = self.ident("the graph's name")?;
        out(Item::Name(name));
        self.expect('(')?;
        if !self.eat(')') {
            loop {
                let p = self.param()?;
                out(p);
                if self.eat(')') {
                    break;
                }
                self.expect(',')?;
            }
        }
        self.expect('{')?;
        Ok(())
    }

    fn param(&mut self) -> Result<Item<'a>> {
        let (name, t) = self.value_name()?;
        self.expect(':')?;
        let (dt, dt_tok) = self.ident("a dtype")?;
        let dtype = match DType::parse(dt) {
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
        let meta = Meta::contiguous(dtype, sizes);
        let shared = self.pool.intern(meta.clone());
        if !self.define(name, shared) {
            return self.fail(&t, format!("`%{name}` is defined twice"));
        }
        Ok(Item::Param(name, meta))
    }

    fn arg(&mut self) -> Result<Arg<ValueId>> {
        let t = self.next();
        Ok(match &t.tok {
            Tok::Value(n) => Arg::Tensor(numbered(self.lookup(n, &t)?)),
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

    /// The next statement, or the outputs once `return` and the end of the
    /// file are read.
    fn statement(&mut self) -> Result<Item<'a>> {
        let start = *self.peek();
        if start.tok == Tok::Punct('}') {
            return self.fail(&start, "the graph has no `return` statement");
        }
        if start.tok == Tok::Eof {
            return self.fail(&start, "unexpected end of file: missing `return` and `}`");
        }
        if start.tok == Tok::Ident("return") {
            self.next();
            let mut outs = vec![];
            if self.eat('(') {
                if !self.eat(')') {
                    loop {
                        let (n, t) = self.value_name()?;
                        outs.push(self.lookup(n, &t)?);
                        if self.eat(')') {
                            break;
                        }
                        self.expect(',')?;
                    }
                }
            } else {
                let (n, t) = self.value_name()?;
                outs.push(self.lookup(n, &t)?);
            }
            self.expect('}')?;
            let t = self.next();
            if t.tok != Tok::Eof {
                return self.fail(
                    &t,
                    format!(
                        "unexpected {} after the graph's closing `}}`",
                        describe(&t.tok)
                    ),
                );
            }
            if let Some(e) = &self.lex.error {
                return Err(e.clone());
            }
            return Ok(Item::Return(outs));
        }
        let mut lhs: smallvec::SmallVec<[(&'a str, Token<'a>); 2]> = smallvec::SmallVec::new();
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
        let mut args: smallvec::SmallVec<[Arg<ValueId>; 6]> = smallvec::SmallVec::new();
        if !self.eat(')') {
            loop {
                args.push(self.arg()?);
                if self.eat(')') {
                    break;
                }
                self.expect(',')?;
            }
        }
        let stmt_err = |p: &Parser<'a>, msg: String| {
            let names: smallvec::SmallVec<[&str; 2]> = lhs.iter().map(|(n, _)| *n).collect();
            Error::Statement {
                line: Some(op_tok.line),
                stmt: source_stmt(&names, op_name, &args, &|v| {
                    p.named[number(&v)].0.to_string()
                }),
                msg,
            }
        };
        let op = match ops::lookup(op_name) {
            Some(op) => op,
            None => return Err(stmt_err(self, unknown_op_message(op_name))),
        };
        let (overload, bound) = ops::bind(op, &args).map_err(|m| stmt_err(self, m))?;
        let named = &self.named;
        let results =
            crate::graph::infer_results(op, &bound, |v| &named[number(v)].1, &mut self.pool)
                .map_err(|m| stmt_err(self, m))?;
        if !lhs.is_empty() && lhs.len() != results.len() {
            let msg = format!(
                "{op_name} returns {} tensor(s) here but {} name(s) are given",
                results.len(),
                lhs.len()
            );
            return Err(stmt_err(self, msg));
        }
        let first = self.named.len() as u32;
        for ((name, t), m) in lhs.iter().zip(&results) {
            if !self.define(name, m.clone()) {
                return self.fail(t, format!("`%{name}` is defined twice"));
            }
        }
        let mut lhs: smallvec::SmallVec<[&'a str; 2]> = lhs.iter().map(|(n, _)| *n).collect();
        if let Some(Arg::Tensor(v)) = bound.first() {
            let self_ = number(v) as u32;
            if lhs.is_empty() && op.def().metadata.is_some() {
                // Unnamed, the result still takes over `self`'s names.
                let name = self.named[self_ as usize].0;
                self.named.push((name, results[0].clone()));
                self.objects.push(first);
                lhs.push(name);
            }
            self.same_object(op, self_, first);
        }
        Ok(Item::Stmt(Stmt {
            lhs,
            line: op_tok.line,
            op,
            overload,
            bound,
            results,
        }))
    }

    /// Parses the whole program, handing `out` each item in order until it
    /// returns false (the consumer stopped on an error).
    fn run(&mut self, out: &mut impl FnMut(Item<'a>) -> bool) -> Result<()> {
        self.header(out)?;
        loop {
            let item = self.statement()?;
            let end = matches!(item, Item::Return(_));
            if !out(item) || end {
                return Ok(());
            }
        }
    }
}

/// Builds the graph from parsed items, calling `on_node` with each node
/// as it is added.
struct Build<F> {
    graph: Graph,
    /// Value numbers (`Parser::names`) to values.
    values: Vec<ValueId>,
    on_node: F,
}

impl<F: FnMut(&Graph, NodeId)> Build<F> {
    fn item(&mut self, item: Item<'_>) {
        match item {
            Item::Name(n) => self.graph.name = n.to_string(),
            Item::Param(name, meta) => {
                let v = self.graph.add_input(Some(name.into()), meta);
                self.values.push(v);
            }
            Item::Stmt(mut s) => {
                s.bound.iter_mut().for_each(|a| resolve(a, &self.values));
                let results = self
                    .graph
                    .call_inferred(s.op, s.overload, s.bound, s.results);
                let node = *self.graph.order.last().expect("just added");
                self.graph.nodes[node].line = Some(s.line);
                for (name, v) in s.lhs.into_iter().zip(results) {
                    self.graph.values[v].name = Some(name.into());
                    self.values.push(v);
                }
                (self.on_node)(&self.graph, node);
            }
            Item::Return(outs) => {
                self.graph.outputs = outs.iter().map(|&i| self.values[i as usize]).collect();
            }
        }
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
    lhs: &[&str],
    op: &str,
    args: &[Arg<ValueId>],
    name: &dyn Fn(ValueId) -> String,
) -> String {
    let mut s = String::new();
    if !lhs.is_empty() {
        let l: Vec<String> = lhs.iter().map(|n| format!("%{n}")).collect();
        s.push_str(&l.join(", "));
        s.push_str(" = ");
    }
    let a: Vec<String> = args.iter().map(|a| fmt_arg(a, name)).collect();
    let _ = write!(s, "{op}({})", a.join(", "));
    s
}

/// Programs of more lines than this are parsed on two threads: parsing
/// proper (syntax, binding, shape inference) on one, building the graph on
/// the other. (Below it, starting the thread costs more than the overlap
/// gains: measured through the CLI, 500 lines 2% slower, 750 3% faster.)
const PARALLEL_PARSE_LINES: usize = 600;

/// Graphs of more statements than this are printed on two threads
/// (`print_beside`).
const PARALLEL_PRINT_STATEMENTS: usize = 2000;

/// Parses a program. Errors carry line and column, or name the statement.
pub fn parse(src: &str) -> Result<Graph> {
    parse_with(src, |_, _| {})
}

/// `parse`, calling `on_node(graph, node)` as each statement's node is
/// added (on the thread that builds the graph, while later statements are
/// parsed on the other): work on the graph so far overlaps parsing. Nodes
/// are handed over before the whole file is known to parse.
pub fn parse_with(src: &str, on_node: impl FnMut(&Graph, NodeId)) -> Result<Graph> {
    parse_lines(src, line_count(src), on_node)
}

/// About one statement a line.
pub(crate) fn line_count(src: &str) -> usize {
    src.bytes().filter(|&b| b == b'\n').count()
}

/// `parse_with`, given `line_count(src)`.
pub(crate) fn parse_lines(
    src: &str,
    lines: usize,
    on_node: impl FnMut(&Graph, NodeId),
) -> Result<Graph> {
    let mut lex = Lexer::new(src);
    let cur = lex.token();
    let mut p = Parser {
        lex,
        cur,
        names: HashMap::with_capacity_and_hasher(lines, Default::default()),
        named: Vec::with_capacity(lines + lines / 4),
        objects: Vec::with_capacity(lines + lines / 4),
        pool: MetaPool::default(),
    };
    let mut b = Build {
        graph: Graph::with_capacity("", lines),
        values: Vec::with_capacity(lines + lines / 4),
        on_node,
    };
    if lines <= PARALLEL_PARSE_LINES {
        p.run(&mut |item| {
            b.item(item);
            true
        })?;
        b.graph.metas.absorb(p.pool);
        return Ok(b.graph);
    }
    // Items go over in batches (a channel send per statement would cost
    // about what parsing it does), small at first so that building starts
    // soon (one 256-item batch is most of a small program's parse).
    const BATCH: usize = 256;
    let (tx, rx) = std::sync::mpsc::sync_channel::<Vec<Item>>(16);
    std::thread::scope(|scope| {
        // Owned by this closure: a panic while building (`on_node`) drops
        // it, the parser's next send fails, and the scope can join it
        // rather than wait on a full channel for ever.
        let rx = rx;
        let parser = scope.spawn(move || {
            let mut size = 16;
            let mut batch = Vec::with_capacity(size);
            let r = p.run(&mut |item| {
                batch.push(item);
                if batch.len() < size {
                    return true;
                }
                size = (2 * size).min(BATCH);
                let full = std::mem::replace(&mut batch, Vec::with_capacity(size));
                tx.send(full).is_ok()
            });
            if !batch.is_empty() {
                let _ = tx.send(batch);
            }
            (r, p.pool)
        });
        for batch in rx.iter() {
            for item in batch {
                b.item(item);
            }
        }
        let (parsed, pool) = parser.join().expect("the parser thread does not panic");
        // The parser stops at the first error in the file; everything
        // before it is built.
        parsed?;
        b.graph.metas.absorb(pool);
        Ok(b.graph)
    })
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

/// Names for printing: the given ones (borrowed from the graph), and fresh
/// `%tN` for values without one or whose name an earlier value took.
pub struct Names<'g> {
    g: &'g Graph,
    invented: HashMap<ValueId, String>,
}

impl<'g> Names<'g> {
    pub fn of(g: &'g Graph) -> Names<'g> {
        let mut taken: HashSet<&str> =
            HashSet::with_capacity_and_hasher(g.values.len(), Default::default());
        let mut missing = vec![];
        let order = g
            .inputs
            .iter()
            .chain(g.order.iter().flat_map(|&n| g.nodes[n].results.iter()));
        for &v in order {
            match g.values[v].name.as_deref() {
                Some(n) if taken.insert(n) => {}
                _ => missing.push(v),
            }
        }
        let mut invented = HashMap::default();
        let mut next = 0;
        for v in missing {
            let name = loop {
                let cand = format!("t{next}");
                next += 1;
                // Invented names count up, so only given ones can clash.
                if !taken.contains(cand.as_str()) {
                    break cand;
                }
            };
            invented.insert(v, name);
        }
        Names { g, invented }
    }

    /// The name of `v` (without `%`).
    pub fn name(&self, v: ValueId) -> &str {
        // Nearly always empty: a graph's values are named.
        let invented = match self.invented.is_empty() {
            true => None,
            false => self.invented.get(&v),
        };
        match invented {
            Some(n) => n,
            None => self
                .g
                .values
                .get(v)
                .and_then(|x| x.name.as_deref())
                .unwrap_or("?"),
        }
    }

    /// `name`, owned.
    pub fn get(&self, v: ValueId) -> String {
        self.name(v).to_string()
    }
}

/// One statement in the text format.
pub fn fmt_node(g: &Graph, n: NodeId, names: &Names) -> String {
    let mut s = String::new();
    write_node(&mut s, g, n, names);
    s
}

/// Appends `arg` as the text format writes it.
fn write_arg(s: &mut String, a: &Arg<ValueId>, names: &Names) {
    let list = |s: &mut String, n: usize, item: &mut dyn FnMut(&mut String, usize)| {
        s.push('[');
        for i in 0..n {
            if i > 0 {
                s.push_str(", ");
            }
            item(s, i);
        }
        s.push(']');
    };
    match a {
        Arg::Tensor(v) => {
            s.push('%');
            s.push_str(names.name(*v));
        }
        Arg::TensorList(l) => list(s, l.len(), &mut |s, i| match l[i] {
            Some(v) => {
                s.push('%');
                s.push_str(names.name(v));
            }
            None => s.push_str("none"),
        }),
        Arg::Int(i) => s.push_str(itoa::Buffer::new().format(*i)),
        Arg::IntList(l) => list(s, l.len(), &mut |s, i| {
            s.push_str(itoa::Buffer::new().format(l[i]))
        }),
        Arg::List(l) => list(s, l.len(), &mut |s, i| write_arg(s, &l[i], names)),
        other => s.push_str(&fmt_arg(other, &|v| names.get(v))),
    }
}

/// Appends one statement (no indent, no newline).
fn write_node(s: &mut String, g: &Graph, n: NodeId, names: &Names) {
    let node = &g.nodes[n];
    let def = node.op.def();
    let mut k = def.schemas[node.overload].needed_args(&node.args);
    // Defaults dropped must not make another overload bind (`conv2d`
    // without its `"valid"` is the sizes overload).
    if k < node.args.len() && def.schemas.len() > 1 {
        while k < node.args.len()
            && ops::bind(node.op, &node.args[..k]).map(|(o, _)| o) != Ok(node.overload)
        {
            k += 1;
        }
    }
    for (i, &r) in node.results.iter().enumerate() {
        s.push_str(if i == 0 { "%" } else { ", %" });
        s.push_str(names.name(r));
    }
    if !node.results.is_empty() {
        s.push_str(" = ");
    }
    s.push_str(&def.name);
    s.push('(');
    for (i, a) in node.args[..k].iter().enumerate() {
        if i > 0 {
            s.push_str(", ");
        }
        write_arg(s, a, names);
    }
    s.push(')');
}

/// Prints a graph in the text format.
pub fn print(g: &Graph) -> String {
    let names = Names::of(g);
    let mut s = String::with_capacity(48 * g.order.len() + 64);
    write_head(&mut s, g, &names);
    write_statements(&mut s, g, &g.order, &names);
    write_tail(&mut s, g, &names);
    s
}

/// `print`, and `beside()`: for a large graph, on a second thread
/// meanwhile (work that needs no names, such as verification), after which
/// that thread prints the last third of the statements: the first names
/// the values and prints the rest.
pub fn print_beside<T: Send>(g: &Graph, beside: impl FnOnce() -> T + Send) -> (String, T) {
    if g.order.len() <= PARALLEL_PRINT_STATEMENTS {
        let r = beside();
        return (print(g), r);
    }
    let split = g.order.len() * 2 / 3;
    let (early, late) = g.order.split_at(split);
    // Holds the names (made on this thread) for both threads.
    let named = std::sync::OnceLock::new();
    let (tx, rx) = std::sync::mpsc::sync_channel::<&Names>(1);
    std::thread::scope(|scope| {
        // Owned by this closure: a panic before the names are sent drops
        // it, and the second thread stops waiting for them.
        let tx = tx;
        let second = scope.spawn(move || {
            let r = beside();
            // No names: the first thread failed, and its panic is resumed.
            let names = rx.recv().ok()?;
            let mut s = String::with_capacity(48 * late.len() + 64);
            write_statements(&mut s, g, late, names);
            write_tail(&mut s, g, names);
            Some((s, r))
        });
        let names = named.get_or_init(|| Names::of(g));
        let _ = tx.send(names);
        let mut s = String::with_capacity(48 * g.order.len() + 64);
        write_head(&mut s, g, names);
        write_statements(&mut s, g, early, names);
        let joined = second
            .join()
            .unwrap_or_else(|e| std::panic::resume_unwind(e));
        let (rest, r) = joined.expect("the names were sent");
        s.push_str(&rest);
        (s, r)
    })
}

fn write_head(s: &mut String, g: &Graph, names: &Names) {
    let _ = write!(
        s,
        "graph {}(",
        if g.name.is_empty() { "f" } else { &g.name }
    );
    for (i, &v) in g.inputs.iter().enumerate() {
        let _ = write!(
            s,
            "{}%{}: {}",
            if i > 0 { ", " } else { "" },
            names.name(v),
            g.values[v].meta.type_string()
        );
    }
    s.push_str(") {\n");
}

fn write_statements(s: &mut String, g: &Graph, nodes: &[NodeId], names: &Names) {
    for &n in nodes {
        s.push_str("  ");
        write_node(s, g, n, names);
        s.push('\n');
    }
}

fn write_tail(s: &mut String, g: &Graph, names: &Names) {
    let outs: Vec<String> = g
        .outputs
        .iter()
        .map(|&v| format!("%{}", names.name(v)))
        .collect();
    if outs.len() == 1 {
        let _ = writeln!(s, "  return {}", outs[0]);
    } else {
        let _ = writeln!(s, "  return ({})", outs.join(", "));
    }
    s.push_str("}\n");
}

/// A short description of a parameter type, for messages.
pub fn type_desc(m: &Meta) -> String {
    format!("{}{}", m.dtype, ShapeFmt(&m.sizes))
}

#[cfg(test)]
mod tests {
    use crate::random::{random_program, Seeded};

    /// A panic while building the graph of a program parsed on two threads
    /// (a bug, but one that must not become a hang) reaches the caller once
    /// the parser thread has stopped.
    #[test]
    fn a_panic_while_building_is_not_a_hang() {
        // Long enough to fill the channel while nothing is taken from it.
        let src = super::print(&random_program(&mut Seeded(7), 8000));
        let (done, finished) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let r = std::panic::catch_unwind(|| {
                super::parse_with(&src, |_, _| panic!("injected while building"))
            });
            let _ = done.send(r.is_err());
        });
        let panicked = finished
            .recv_timeout(std::time::Duration::from_secs(120))
            .expect("parse_with returned (no deadlock)");
        assert!(panicked, "the injected panic reached the caller");
    }
}
