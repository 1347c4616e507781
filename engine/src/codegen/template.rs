//! Kernel templates: the fixed part of a hand-tuned kernel (tiling,
//! barriers, unrolled inner loops) is hand-written WGSL in
//! `shaders/templates/`, and the generator fills its holes with what
//! depends on the program (fused operand loads, epilogues).
//!
//! A template is WGSL, one statement a line (leading blanks ignored),
//! with `$name` / `${name}` replaced from the environment (`${c$i}`: the
//! name `c` followed by `i`'s value) and these
//! directives:
//!
//! - `## ...`: a comment, dropped;
//! - `#shared <decl>`: a workgroup-memory declaration of the kernel;
//! - `#if name` / `#if !name`, `#else`, `#end`: a flag of the environment;
//! - `#for x in name ... #end`: unrolled over `0..n` (a count, named or
//!   literal) or the strings of a list;
//! - `#let name: ty = expr` / `#var name: ty = expr`: a fresh temporary
//!   (`let` or `var`), its name bound to `name`;
//! - `#set name = text`: binds `name` to the text (expressions built up
//!   over an unrolled loop);
//! - `@hole args`: the generator's statements (which may bind names).
//!
//! `tests` renders every template through the real generator and checks
//! that every line of every template reached a kernel naga validates.

use super::*;

/// A template of `shaders/templates/`, parsed once.
pub(super) struct Template {
    pub(super) name: &'static str,
    pub(super) src: &'static str,
    parsed: std::sync::OnceLock<Result<Parsed, String>>,
}

macro_rules! template {
    ($file:literal) => {
        Template {
            name: $file,
            src: include_str!(concat!("../../../shaders/templates/", $file)),
            parsed: std::sync::OnceLock::new(),
        }
    };
}

pub(super) static ATTENTION: Template = template!("attention.wgsl");
pub(super) static MATMUL_VEC4: Template = template!("matmul_vec4.wgsl");
pub(super) static MATMUL: Template = template!("matmul.wgsl");
pub(super) static ROW_COMBINE: Template = template!("row_combine.wgsl");

/// Every template (for the coverage test).
#[cfg(test)]
pub(super) static ALL: [&Template; 4] = [&ATTENTION, &MATMUL_VEC4, &MATMUL, &ROW_COMBINE];

/// A value of a template's environment.
#[derive(Clone, Debug)]
pub(super) enum V {
    Str(String),
    Count(usize),
    Flag(bool),
    List(Vec<String>),
    /// A name a template reads that nothing bound (yet).
    Unbound,
}

/// The names a template reads, each in a slot: a template resolves its
/// names to slots once per rendering, not per line.
#[derive(Default)]
pub(super) struct Env {
    index: rustc_hash::FxHashMap<String, usize>,
    slots: Vec<V>,
}

impl Env {
    pub(super) fn s(mut self, k: &str, v: impl Into<String>) -> Self {
        self.set(k, v);
        self
    }
    pub(super) fn n(mut self, k: &str, v: usize) -> Self {
        self.put(k, V::Count(v));
        self
    }
    pub(super) fn b(mut self, k: &str, v: bool) -> Self {
        self.put(k, V::Flag(v));
        self
    }
    pub(super) fn l(mut self, k: &str, v: Vec<String>) -> Self {
        self.put(k, V::List(v));
        self
    }
    pub(super) fn set(&mut self, k: &str, v: impl Into<String>) {
        self.put(k, V::Str(v.into()));
    }
    fn put(&mut self, k: &str, v: V) {
        let i = self.slot(k);
        self.slots[i] = v;
    }
    /// `k`'s slot (a new, unbound one for a new name).
    fn slot(&mut self, k: &str) -> usize {
        if let Some(&i) = self.index.get(k) {
            return i;
        }
        self.index.insert(k.into(), self.slots.len());
        self.slots.push(V::Unbound);
        self.slots.len() - 1
    }
    fn value(&self, k: &str) -> Option<&V> {
        self.index.get(k).map(|&i| &self.slots[i])
    }
    /// A string or count bound to `k`.
    pub(super) fn get(&self, k: &str) -> R<String> {
        match self.value(k) {
            Some(V::Str(s)) => Ok(s.clone()),
            Some(V::Count(n)) => Ok(n.to_string()),
            _ => Err(bug(format!("template value `{k}` unbound"))),
        }
    }
}

/// `k` in decimal (unrolled loops print their counters in most lines:
/// cheaper than the formatting machinery).
fn push_decimal(out: &mut String, k: usize) {
    let mut digits = [0u8; 20];
    let mut i = digits.len();
    let mut k = k;
    loop {
        i -= 1;
        digits[i] = b'0' + (k % 10) as u8;
        k /= 10;
        if k == 0 {
            break;
        }
    }
    out.extend(digits[i..].iter().map(|&d| d as char));
}

/// The generator's part of a template: `@hole args` with the environment
/// at that line (it may bind names for the lines after it).
pub(super) type Holes<'h, 'a> = dyn FnMut(&mut Gen<'a>, &str, &[String], &mut Env) -> R<()> + 'h;

/// Text with names to replace, split once at parsing.
enum Seg<'t> {
    Lit(&'t str),
    /// A symbol of the template (`Parsed::names`).
    Name(usize),
    /// `${c$i}`: a name built from names.
    Built(Vec<Seg<'t>>),
}

type Text<'t> = Vec<Seg<'t>>;

/// A parsed line: its number in the file and what it does.
enum Line<'t> {
    Text(Text<'t>),
    Shared(Text<'t>),
    If(
        &'t str,
        bool,
        Vec<(usize, Line<'t>)>,
        Vec<(usize, Line<'t>)>,
    ),
    For(usize, &'t str, Vec<(usize, Line<'t>)>),
    Bind(bool, Text<'t>, Text<'t>, Text<'t>),
    Set(Text<'t>, Text<'t>),
    Hole(&'t str, Vec<Text<'t>>),
}

type Block<'t> = Vec<(usize, Line<'t>)>;

/// A rendering's symbols: the template's names and their slots in the
/// environment.
struct Scope<'p> {
    names: &'p [&'static str],
    slots: Vec<usize>,
}

/// A parsed template: its lines and the names they read.
struct Parsed {
    block: Block<'static>,
    names: Vec<&'static str>,
}

/// The symbol of `name` in `names` (added if new).
fn symbol(names: &mut Vec<&'static str>, name: &'static str) -> usize {
    names.iter().position(|n| *n == name).unwrap_or_else(|| {
        names.push(name);
        names.len() - 1
    })
}

impl Template {
    fn err(&self, line: usize, msg: impl std::fmt::Display) -> CompileError {
        bug(format!("template {}:{}: {msg}", self.name, line + 1))
    }

    /// The template's lines, directives nested.
    fn parse(&self) -> R<Parsed> {
        let lines: Vec<(usize, &'static str)> = self
            .src
            .lines()
            .map(str::trim)
            .enumerate()
            .filter(|(_, l)| !l.is_empty() && !l.starts_with("##"))
            .collect();
        let mut at = 0;
        let mut names = vec![];
        let (block, end) = self.block(&mut names, &lines, &mut at)?;
        match end {
            None => Ok(Parsed { block, names }),
            Some(e) => Err(self.err(lines[at - 1].0, format!("`{e}` without an opening"))),
        }
    }

    /// Lines up to a `#else` / `#end` (returned) or the end.
    fn block(
        &self,
        names: &mut Vec<&'static str>,
        lines: &[(usize, &'static str)],
        at: &mut usize,
    ) -> R<(Block<'static>, Option<&'static str>)> {
        let mut out = vec![];
        while let Some(&(n, l)) = lines.get(*at) {
            *at += 1;
            let (word, rest) = l.split_once(' ').unwrap_or((l, ""));
            let line = match word {
                "#else" | "#end" => return Ok((out, Some(word))),
                "#shared" => Line::Shared(self.text(names, n, rest)?),
                "#if" => {
                    let (neg, name) = match rest.strip_prefix('!') {
                        Some(r) => (true, r),
                        None => (false, rest),
                    };
                    let (then, end) = self.block(names, lines, at)?;
                    let els = match end {
                        Some("#else") => match self.block(names, lines, at)? {
                            (b, Some("#end")) => b,
                            _ => return Err(self.err(n, "`#if` without `#end`")),
                        },
                        Some(_) => vec![],
                        None => return Err(self.err(n, "`#if` without `#end`")),
                    };
                    Line::If(name, neg, then, els)
                }
                "#for" => {
                    let Some((x, over)) = rest.split_once(" in ") else {
                        return Err(self.err(n, "`#for x in name`"));
                    };
                    match self.block(names, lines, at)? {
                        (b, Some("#end")) => Line::For(symbol(names, x.trim()), over.trim(), b),
                        _ => return Err(self.err(n, "`#for` without `#end`")),
                    }
                }
                "#let" | "#var" => {
                    let parsed = rest.split_once(':').and_then(|(name, r)| {
                        r.split_once('=')
                            .map(|(ty, e)| (name.trim(), ty.trim(), e.trim()))
                    });
                    let Some((name, ty, e)) = parsed else {
                        return Err(self.err(n, "`#let name: ty = expr`"));
                    };
                    let (name, ty, e) = (
                        self.text(names, n, name)?,
                        self.text(names, n, ty)?,
                        self.text(names, n, e)?,
                    );
                    Line::Bind(word == "#var", name, ty, e)
                }
                "#set" => {
                    let Some((name, v)) = rest.split_once('=') else {
                        return Err(self.err(n, "`#set name = text`"));
                    };
                    Line::Set(
                        self.text(names, n, name.trim())?,
                        self.text(names, n, v.trim())?,
                    )
                }
                w if w.starts_with('@') => {
                    let args = rest.split_whitespace().map(|a| self.text(names, n, a));
                    Line::Hole(&w[1..], args.collect::<R<_>>()?)
                }
                w if w.starts_with('#') => {
                    return Err(self.err(n, format!("unknown directive `{w}`")))
                }
                _ => Line::Text(self.text(names, n, l)?),
            };
            out.push((n, line));
        }
        Ok((out, None))
    }

    /// `s` split at its names: `$name`, `${name}`.
    fn text(&self, names: &mut Vec<&'static str>, n: usize, s: &'static str) -> R<Text<'static>> {
        let mut out = vec![];
        let mut rest = s;
        while let Some(i) = rest.find('$') {
            if i > 0 {
                out.push(Seg::Lit(&rest[..i]));
            }
            rest = &rest[i + 1..];
            if let Some(r) = rest.strip_prefix('{') {
                let end = r.find('}').ok_or_else(|| self.err(n, "`${` without `}`"))?;
                let inner = &r[..end];
                out.push(if inner.contains('$') {
                    Seg::Built(self.text(names, n, inner)?)
                } else {
                    Seg::Name(symbol(names, inner))
                });
                rest = &r[end + 1..];
            } else {
                let end = rest
                    .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                    .unwrap_or(rest.len());
                out.push(Seg::Name(symbol(names, &rest[..end])));
                rest = &rest[end..];
            }
        }
        if !rest.is_empty() {
            out.push(Seg::Lit(rest));
        }
        Ok(out)
    }

    /// `t` with its names' values, appended to `out`.
    fn expand(&self, n: usize, t: &Text, env: &Env, sc: &Scope, out: &mut String) -> R<()> {
        for seg in t {
            let (value, built) = match seg {
                Seg::Lit(s) => {
                    out.push_str(s);
                    continue;
                }
                Seg::Name(i) => (&env.slots[sc.slots[*i]], None),
                Seg::Built(t) => {
                    let name = self.string(n, t, env, sc)?;
                    (env.value(&name).unwrap_or(&V::Unbound), Some(name))
                }
            };
            match value {
                V::Str(v) => out.push_str(v),
                V::Count(k) => push_decimal(out, *k),
                _ => {
                    let name = match (seg, built) {
                        (Seg::Name(i), _) => sc.names[*i].to_string(),
                        (_, b) => b.unwrap_or_default(),
                    };
                    return Err(self.err(n, format!("`${name}` unbound")));
                }
            }
        }
        Ok(())
    }

    fn string(&self, n: usize, t: &Text, env: &Env, sc: &Scope) -> R<String> {
        let literal: usize = t
            .iter()
            .map(|s| if let Seg::Lit(l) = s { l.len() } else { 8 })
            .sum();
        let mut out = String::with_capacity(literal);
        self.expand(n, t, env, sc, &mut out)?;
        Ok(out)
    }

    /// Renders the template into `gen`'s kernel.
    pub(super) fn render<'a>(
        &self,
        gen: &mut Gen<'a>,
        env: &mut Env,
        holes: &mut Holes<'_, 'a>,
    ) -> R<()> {
        let parsed = self
            .parsed
            .get_or_init(|| self.parse().map_err(|e| e.to_string()))
            .as_ref()
            .map_err(|e| bug(e.clone()))?;
        let sc = Scope {
            names: &parsed.names,
            slots: parsed.names.iter().map(|k| env.slot(k)).collect(),
        };
        self.run(&parsed.block, gen, env, &sc, holes)
    }

    fn run<'a>(
        &self,
        block: &Block<'static>,
        gen: &mut Gen<'a>,
        env: &mut Env,
        sc: &Scope,
        holes: &mut Holes<'_, 'a>,
    ) -> R<()> {
        for (n, line) in block {
            #[cfg(test)]
            tests::cover(self.name, *n);
            match line {
                Line::Text(t) => gen.body.stmt(self.string(*n, t, env, sc)?),
                Line::Shared(t) => gen.shared.push(self.string(*n, t, env, sc)?),
                Line::If(name, neg, then, els) => {
                    let Some(V::Flag(f)) = env.value(name) else {
                        return Err(self.err(*n, format!("`{name}` is no flag")));
                    };
                    let b = if f != neg { then } else { els };
                    self.run(b, gen, env, sc, holes)?;
                }
                Line::For(x, over, body) => {
                    let count = over.parse().ok().or(match env.value(over) {
                        Some(V::Count(k)) => Some(*k),
                        _ => None,
                    });
                    let items: Vec<V> = match env.value(over) {
                        _ if count.is_some() => (0..count.unwrap_or(0)).map(V::Count).collect(),
                        Some(V::List(l)) => l.iter().cloned().map(V::Str).collect(),
                        _ => return Err(self.err(*n, format!("`{over}` is no count or list"))),
                    };
                    for item in items {
                        env.slots[sc.slots[*x]] = item;
                        self.run(body, gen, env, sc, holes)?;
                    }
                }
                Line::Bind(var, name, ty, e) => {
                    let (e, ty) = (self.string(*n, e, env, sc)?, self.string(*n, ty, env, sc)?);
                    let t = if *var {
                        gen.body.var(&ty, e)
                    } else {
                        gen.body.bind(&ty, e)
                    };
                    env.set(&self.string(*n, name, env, sc)?, t);
                }
                Line::Set(name, v) => {
                    let v = self.string(*n, v, env, sc)?;
                    env.set(&self.string(*n, name, env, sc)?, v);
                }
                Line::Hole(h, args) => {
                    let args = args
                        .iter()
                        .map(|a| self.string(*n, a, env, sc))
                        .collect::<R<Vec<_>>>()?;
                    holes(gen, h, &args, env)?;
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use std::cell::RefCell;
    use std::collections::BTreeSet;

    thread_local! {
        static COVERED: RefCell<BTreeSet<(&'static str, usize)>> = RefCell::default();
    }

    pub(super) fn cover(name: &'static str, line: usize) {
        COVERED.with(|c| c.borrow_mut().insert((name, line)));
    }

    /// Products and attention of the shapes the templates' branches are
    /// for (the fixtures' are mostly small): vec4 tiles along k and along
    /// B's columns, fused operands, a transposed A, f16, a wide head,
    /// attention computing its projections.
    const EXTRA: [&str; 8] = [
        "graph twins(%x: f32[64, 32], %w1: f32[48, 32], %w3: f32[48, 32], %m1: f32[32, 64], %m3: f32[32, 64], %y: f32[64, 37], %v1: f32[24, 37], %v3: f32[24, 37], %p: f16[64, 8], %q1: f16[8, 30], %q3: f16[8, 30]) {
           %g = linear(%x, %w1)
           %u = linear(%x, %w3)
           %gs = silu(%g)
           %h = mul(%gs, %u)
           %gm = matmul(%x, %m1)
           %um = matmul(%x, %m3)
           %hm = mul(%gm, %um)
           %gy = linear(%y, %v1)
           %uy = linear(%y, %v3)
           %hy = mul(%gy, %uy)
           %gp = mm(%p, %q1)
           %up = mm(%p, %q3)
           %hp = mul(%gp, %up)
           return (%h, %hm, %hy, %hp)
         }",
        "graph lin(%x: f32[64, 32], %w: f32[48, 32], %b: f32[48]) {
           %y = linear(%x, %w, %b)
           %r = relu(%y)
           return %r
         }",
        "graph mm_cols(%x: f32[2, 70, 36], %w: f32[36, 68]) {
           %y = matmul(%x, %w)
           return %y
         }",
        "graph mm_fused(%x: f32[64, 40], %w: f32[48, 40]) {
           %a = mul(%x, 2.0)
           %w2 = mul(%w, 3.0)
           %wt = t(%w2)
           %y = mm(%a, %wt)
           return %y
         }",
        "graph mm_scalar(%x: f32[40, 64], %w: f32[40, 24], %h: f16[20, 8], %g: f16[8, 30]) {
           %xt = t(%x)
           %y = mm(%xt, %w)
           %z = mm(%h, %g)
           return (%y, %z)
         }",
        "graph sdpa_wide(%q: f32[2, 20, 64], %k: f32[2, 40, 64], %v: f32[2, 40, 64]) {
           %y = scaled_dot_product_attention(%q, %k, %v, none, 0.0, true)
           return %y
         }",
        "graph projected(%x: f32[2, 40, 96], %wq: f32[96, 96], %wk: f32[96, 96], %wv: f32[96, 96], %wo: f32[80, 96], %bq: f32[96], %bo: f32[80]) {
           %q = linear(%x, %wq, %bq)
           %k = linear(%x, %wk)
           %v = linear(%x, %wv)
           %qh = view(%q, [2, 40, 3, 32])
           %kh = view(%k, [2, 40, 3, 32])
           %vh = view(%v, [2, 40, 3, 32])
           %qt = transpose(%qh, 1, 2)
           %kt = permute(%kh, [0, 2, 3, 1])
           %vt = transpose(%vh, 1, 2)
           %s = matmul(%qt, %kt)
           %s2 = mul(%s, 0.35)
           %p = softmax(%s2, -1)
           %c = matmul(%p, %vt)
           %ct = transpose(%c, 1, 2)
           %cm = reshape(%ct, [2, 40, 96])
           %o = linear(%cm, %wo, %bo)
           %y = gelu(%o)
           return %y
         }",
        "graph wide_rows(%x: f32[8, 2048], %w: f32[2048]) {
           %s = softmax(%x, -1)
           %n = layer_norm(%x, [2048], %w, none, 0.00001)
           return (%s, %n)
         }",
    ];

    /// Every template parses, and compiling the example and op programs
    /// (GPU and CPU variants, as `every_generated_shader_validates_with_naga`
    /// does) reaches every one of its lines in kernels naga validates.
    #[test]
    fn every_template_line_reaches_a_validated_kernel() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let mut files = vec![];
        let mut dirs = vec![
            root.join("examples/programs"),
            root.join("tests/programs/ops"),
        ];
        while let Some(d) = dirs.pop() {
            for e in std::fs::read_dir(&d).unwrap() {
                let p = e.unwrap().path();
                if p.is_dir() {
                    dirs.push(p);
                } else if p.extension().is_some_and(|x| x == "txt") {
                    files.push(p);
                }
            }
        }
        files.sort();
        let mut sources: Vec<(String, String)> = files
            .iter()
            .map(|p| (p.display().to_string(), std::fs::read_to_string(p).unwrap()))
            .collect();
        sources.extend(EXTRA.iter().map(|s| ("(extra)".to_string(), s.to_string())));
        for (p, src) in &sources {
            let Ok(g) = kiln_functionalize::text::parse(src) else {
                continue;
            };
            let variants = [
                (true, None, false, false),
                (true, Some(32), true, false),
                (true, None, true, true),
                (false, None, false, false),
                // CPU adapters with subgroups: attention in rows.
                (false, Some(8), false, false),
            ];
            for (gpu, subgroup, tall, wide_blocks) in variants {
                let options = crate::CompileOptions {
                    tile_min_rows: if gpu { 0 } else { usize::MAX },
                    tall_tiles_from: if tall { 0 } else { usize::MAX },
                    wide_blocks,
                    workgroup_rows: gpu,
                    workgroup: if gpu { 256 } else { 64 },
                    vectorize: gpu,
                    subgroup,
                    attention_rows: !gpu && subgroup.is_some(),
                    ..Default::default()
                };
                let prog = crate::compile_with(&g, &options).unwrap_or_else(|e| panic!("{p}: {e}"));
                for k in &prog.kernels {
                    wgsl::validate(&k.code.wgsl)
                        .unwrap_or_else(|e| panic!("{p}: {}: {e}\n{}", k.code.label, k.code.wgsl));
                }
            }
        }
        let covered = COVERED.with(|c| c.borrow().clone());
        let mut missed = vec![];
        for t in ALL {
            t.parse().unwrap_or_else(|e| panic!("{e}"));
            for (n, l) in t.src.lines().map(str::trim).enumerate() {
                // Blank lines, comments and block ends render nothing.
                let inert = l.is_empty() || l.starts_with("##") || l == "#else" || l == "#end";
                if !inert && !covered.contains(&(t.name, n)) {
                    missed.push(format!("{}:{}: {l}", t.name, n + 1));
                }
            }
        }
        assert!(
            missed.is_empty(),
            "template lines no program reaches:\n{}",
            missed.join("\n")
        );
    }
}
