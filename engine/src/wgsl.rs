//! A small builder for WGSL compute shaders: kernels are assembled from
//! typed pieces (buffer loads and stores, casts, scalar ops) into a list
//! of `let` statements, never by editing shader text.

pub use crate::kernel::{per_word, words, Binding, Buf, WORKGROUP};
use kiln_functionalize::DType;
use std::fmt::Write;

/// The type a value of a dtype has inside a shader: floats compute in
/// f32 (f16 values are rounded to f16 after every op), booleans as bool.
/// i64 is held as i32 (WGSL has no 64-bit integers on WebGPU): values are
/// narrowed with a check where they enter (uploads, literals) and i64
/// arithmetic that leaves the 32-bit range is reported, never wrapped
/// silently.
pub fn ty(d: DType) -> &'static str {
    match d {
        DType::F32 | DType::F16 => "f32",
        DType::I8 | DType::I32 | DType::I64 => "i32",
        DType::U32 => "u32",
        DType::Bool => "bool",
    }
}

/// Helper functions every kernel may call (hand-written:
/// `shaders/prelude.wgsl`).
pub const PRELUDE: &str = include_str!("../../shaders/prelude.wgsl");

/// The f32 -> f16 conversions (`k_f16_bits`, `k_round_f16`) in integer
/// arithmetic, for any adapter.
pub const F16_SOFT: &str = include_str!("../../shaders/f16_soft.wgsl");

/// The same conversions in f16 instructions (`enable f16;` first), for
/// adapters with `shader-f16`.
pub const F16_NATIVE: &str = include_str!("../../shaders/f16_native.wgsl");

/// Whether a kernel body converts to f16 (its shader then has a variant
/// with the native conversions).
pub fn converts_to_f16(lines: &[String]) -> bool {
    lines
        .iter()
        .any(|l| l.contains("k_f16_bits(") || l.contains("k_round_f16("))
}

/// Statements of a kernel body, with fresh temporaries.
#[derive(Default)]
pub struct Body {
    pub lines: Vec<String>,
    next: usize,
}

impl Body {
    /// `let tN: ty = expr;`, returning `tN`.
    pub fn bind(&mut self, ty: &str, expr: String) -> String {
        let name = format!("t{}", self.next);
        self.next += 1;
        self.lines.push(format!("let {name}: {ty} = {expr};"));
        name
    }

    /// `var tN: ty = expr;`, returning `tN`.
    pub fn var(&mut self, ty: &str, expr: String) -> String {
        let name = format!("v{}", self.next);
        self.next += 1;
        self.lines.push(format!("var {name}: {ty} = {expr};"));
        name
    }

    pub fn stmt(&mut self, s: String) {
        self.lines.push(s);
    }
}

/// The workgroup array of values kept in workgroup memory by kernels in
/// sequence (`codegen::sequence`), a word an element.
pub const WSM: &str = "wsm";

/// A tensor as a kernel sees it: the binding variable holding it and the
/// word it starts at inside that binding (bindings start at offsets the
/// device aligns, so a tensor may start a few words in). `chunk` is set
/// when the tensor spans several bindings (it is larger than the device's
/// binding limit): each binding holds `chunk` words and accessor functions
/// pick the binding.
#[derive(Clone, Debug, PartialEq)]
pub struct Slot {
    pub var: String,
    pub base: usize,
    /// Stores also go to workgroup array `WSM` from this word (a value
    /// read back by the host and read by later kernels in sequence:
    /// `codegen::sequence`).
    pub copy: Option<usize>,
    pub chunk: Option<usize>,
    /// Bound as `array<vec4<u32>>`: a word is a component of a vector.
    pub vec4: bool,
    /// Bound as `array<atomic<u32>>`: a kernel whose invocations own
    /// single elements stores packed ones in it (`store_lane`).
    pub atomic: bool,
}

impl Slot {
    fn at(&self, index: &str) -> String {
        if self.base == 0 {
            index.to_string()
        } else {
            format!("{}u + {index}", self.base)
        }
    }

    /// The 32-bit word at element-word `index` of the tensor.
    pub fn word(&self, index: &str) -> String {
        match self.chunk {
            None if self.vec4 => {
                let at = self.at(index);
                format!("{}[({at}) >> 2u][({at}) & 3u]", self.var)
            }
            None if self.atomic => format!("atomicLoad(&{}[{}])", self.var, self.at(index)),
            None => format!("{}[{}]", self.var, self.at(index)),
            Some(_) => format!("{}_ld({})", self.var, self.at(index)),
        }
    }

    /// A statement storing `value` (a u32) at word `index`.
    pub fn set_word(&self, index: &str, value: &str) -> String {
        match self.chunk {
            None if self.vec4 => {
                let at = self.at(index);
                format!("{}[({at}) >> 2u][({at}) & 3u] = {value};", self.var)
            }
            None if self.atomic => {
                format!("atomicStore(&{}[{}], {value});", self.var, self.at(index))
            }
            None => match self.copy {
                Some(0) => format!(
                    "{}[{}] = {value}; {WSM}[{index}] = {value};",
                    self.var,
                    self.at(index)
                ),
                Some(c) => format!(
                    "{}[{}] = {value}; {WSM}[{c}u + {index}] = {value};",
                    self.var,
                    self.at(index)
                ),
                None => format!("{}[{}] = {value};", self.var, self.at(index)),
            },
            Some(_) => format!("{}_st({}, {value});", self.var, self.at(index)),
        }
    }

    /// Statements setting the bits `mask` of word `index` to `bits` (an
    /// atomic slot's: other invocations set the word's other lanes).
    fn set_bits(&self, index: &str, mask: &str, bits: &str) -> String {
        match self.chunk {
            Some(_) => format!("{}_sb({}, {mask}, {bits});", self.var, self.at(index)),
            None => {
                let at = self.at(index);
                format!(
                    "atomicAnd(&{v}[{at}], ~({mask})); atomicOr(&{v}[{at}], {bits});",
                    v = self.var
                )
            }
        }
    }
}

/// The declarations (and accessor functions of split tensors) for the
/// bindings of a kernel: `vars[i]` is the variable of slot `i`, which
/// covers `chunks[i]` consecutive bindings of `chunk_words` words each,
/// as words or (never split) as `vec4<u32>`.
/// A binding variable of a kernel: its name, the bindings it takes (with
/// the words of each when split), and how its words are typed.
pub struct BindingVar {
    pub var: String,
    pub chunks: usize,
    pub chunk_words: Option<usize>,
    pub vec4: bool,
    pub atomic: bool,
}

pub fn declarations(vars: &[BindingVar], bindings: &[Binding]) -> Vec<String> {
    let mut out = vec![];
    let mut b = 0;
    for BindingVar {
        var,
        chunks,
        chunk_words,
        vec4,
        atomic,
    } in vars
    {
        let elem = match (*vec4, *atomic) {
            (true, _) => "vec4<u32>",
            (false, true) => "atomic<u32>",
            (false, false) => "u32",
        };
        let access = |i: usize| {
            if bindings[i].write {
                "read_write"
            } else {
                "read"
            }
        };
        match chunk_words {
            None => {
                out.push(format!(
                    "@group(0) @binding({b}) var<storage, {}> {var}: array<{elem}>;",
                    access(b)
                ));
                b += 1;
            }
            Some(cw) => {
                let write = bindings[b].write;
                let mut ld = format!("fn {var}_ld(i: u32) -> u32 {{");
                let mut st = format!("fn {var}_st(i: u32, v: u32) {{");
                let mut sb = format!("fn {var}_sb(i: u32, m: u32, v: u32) {{");
                for c in 0..*chunks {
                    out.push(format!(
                        "@group(0) @binding({b}) var<storage, {}> {var}c{c}: array<{elem}>;",
                        access(b)
                    ));
                    let lo = c * cw;
                    let w = format!("{var}c{c}[i - {lo}u]");
                    let (load, store, bits) = if *atomic {
                        (
                            format!("atomicLoad(&{w})"),
                            format!("atomicStore(&{w}, v);"),
                            format!("atomicAnd(&{w}, ~m); atomicOr(&{w}, v);"),
                        )
                    } else {
                        (w.clone(), format!("{w} = v;"), String::new())
                    };
                    if c + 1 < *chunks {
                        let _ = write!(ld, " if (i < {}u) {{ return {load}; }}", lo + cw);
                        let _ = write!(st, " if (i < {}u) {{ {store} return; }}", lo + cw);
                        let _ = write!(sb, " if (i < {}u) {{ {bits} return; }}", lo + cw);
                    } else {
                        let _ = write!(ld, " return {load}; }}");
                        let _ = write!(st, " {store} }}");
                        let _ = write!(sb, " {bits} }}");
                    }
                    b += 1;
                }
                out.push(ld);
                if write {
                    out.push(st);
                }
                if *atomic {
                    out.push(sb);
                }
            }
        }
    }
    out
}

/// Reads element `index` (a u32 expression) of a `dtype` buffer stored at
/// word `base` of `pool`, packed (see `per_word`) or a word per element.
pub fn load(slot: &Slot, index: &str, dtype: DType, packed: bool) -> String {
    match (dtype, packed && per_word(dtype) > 1) {
        (DType::Bool, true) => {
            let w = slot.word(&format!("({index} >> 2u)"));
            format!("((({w} >> (({index} & 3u) << 3u)) & 0xffu) != 0u)")
        }
        (DType::F16, true) => {
            let w = slot.word(&format!("({index} >> 1u)"));
            format!("unpack2x16float({w} >> (({index} & 1u) << 4u)).x")
        }
        // The byte moved to the top, then shifted back with its sign.
        (DType::I8, true) => {
            let w = slot.word(&format!("({index} >> 2u)"));
            format!("(bitcast<i32>({w} << ((3u - ({index} & 3u)) << 3u)) >> 24u)")
        }
        _ => {
            let word = slot.word(index);
            match dtype {
                DType::F32 | DType::F16 => format!("bitcast<f32>({word})"),
                DType::I8 | DType::I32 | DType::I64 => format!("bitcast<i32>({word})"),
                DType::U32 => word,
                DType::Bool => format!("({word} != 0u)"),
            }
        }
    }
}

/// `value` (in its shader type) as the bits of lane `lane` of a packed word.
pub fn pack_lane(dtype: DType, value: &str, lane: usize) -> String {
    match dtype {
        DType::Bool => format!("(select(0u, 1u, {value}) << {}u)", 8 * lane),
        DType::F16 => format!("(k_f16_bits({value}) << {}u)", 16 * lane),
        DType::I8 => format!("((bitcast<u32>({value}) & 0xffu) << {}u)", 8 * lane),
        _ => unreachable!("{dtype} is not packed"),
    }
}

/// Element `index` (a u32 expression) of a packed `dtype` buffer: its
/// word's index, its lane, the lane's bit mask in the word, and `value`
/// (in its shader type) as the bits of that lane.
fn lane_of(index: &str, dtype: DType, value: &str) -> (String, String, String, String) {
    let per = per_word(dtype);
    let width = 32 / per;
    let lane = format!("({index} & {}u)", per - 1);
    let shift = format!("({lane} << {}u)", width.trailing_zeros());
    let bits = match dtype {
        DType::Bool => format!("select(0u, 1u, {value})"),
        DType::F16 => format!("k_f16_bits({value})"),
        DType::I8 => format!("(bitcast<u32>({value}) & 0xffu)"),
        _ => unreachable!("{dtype} is not packed"),
    };
    (
        format!("({index} >> {}u)", per.trailing_zeros()),
        lane,
        format!("({}u << {shift})", (1u64 << width) - 1),
        format!("({bits} << {shift})"),
    )
}

/// Writes `value` (in its shader type) as element `index` of a packed
/// buffer bound atomically: only its lane of the word, which other
/// invocations may be writing at the same time.
pub fn store_lane(slot: &Slot, index: &str, dtype: DType, value: &str) -> String {
    let (word, _, mask, bits) = lane_of(index, dtype, value);
    slot.set_bits(&word, &mask, &bits)
}

/// Writes `value` as element `index` of a packed buffer where the
/// invocation stores every lane of the word, in order: gathered in `pk`
/// (a `u32` var), the word stored whole with its last lane.
pub fn store_run_lane(slot: &Slot, index: &str, dtype: DType, value: &str, pk: &str) -> String {
    let (word, lane, _, bits) = lane_of(index, dtype, value);
    format!(
        "{pk} = select({pk}, 0u, {lane} == 0u) | {bits}; if ({lane} == {}u) {{ {} }}",
        per_word(dtype) - 1,
        slot.set_word(&word, pk)
    )
}

/// Writes `value` (in its shader type) as element `index` of a buffer
/// with a word per element.
pub fn store(slot: &Slot, index: &str, dtype: DType, value: &str) -> String {
    slot.set_word(index, &word(dtype, value))
}

/// `value` (in its shader type) as the 32-bit word a buffer with a word
/// per element stores.
pub fn word(dtype: DType, value: &str) -> String {
    match dtype {
        DType::F32 => format!("bitcast<u32>({value})"),
        DType::F16 => format!("bitcast<u32>(k_round_f16({value}))"),
        DType::I8 | DType::I32 | DType::I64 => format!("bitcast<u32>({value})"),
        DType::U32 => value.to_string(),
        DType::Bool => format!("select(0u, 1u, {value})"),
    }
}

/// Element `index` of a word (unpacked) read as its shader type from the
/// 32-bit word expression `w`.
pub fn from_word(dtype: DType, w: &str) -> String {
    match dtype {
        DType::F32 | DType::F16 => format!("bitcast<f32>({w})"),
        DType::I8 | DType::I32 | DType::I64 => format!("bitcast<i32>({w})"),
        DType::U32 => w.to_string(),
        DType::Bool => format!("({w} != 0u)"),
    }
}

/// Converts a shader value of dtype `from` to dtype `to` with the store
/// semantics of `DType::cast` (truncation toward zero, `!= 0` for bool,
/// f16 rounding).
pub fn cast(value: &str, from: DType, to: DType) -> String {
    use DType::*;
    if from == to {
        return value.to_string();
    }
    // i64 is an i32 on the device (see `ty`).
    let dev = |d: DType| if d == I64 { I32 } else { d };
    let (from, to) = (dev(from), dev(to));
    if from == to {
        return value.to_string();
    }
    let v = value;
    match (from, to) {
        (Bool, F32 | F16) => format!("select(0.0, 1.0, {v})"),
        (Bool, I32) => format!("select(0i, 1i, {v})"),
        (Bool, U32) => format!("select(0u, 1u, {v})"),
        (F32 | F16, Bool) => format!("({v} != 0.0)"),
        (I32, Bool) => format!("({v} != 0i)"),
        (U32, Bool) => format!("({v} != 0u)"),
        (F32, F16) => format!("k_round_f16({v})"),
        (F16, F32) => v.to_string(),
        (I32 | U32, F32) => format!("f32({v})"),
        (I32 | U32, F16) => format!("k_round_f16(f32({v}))"),
        (F32 | F16, I32) => format!("i32({v})"),
        (F32 | F16, U32) => format!("u32(i32({v}))"),
        (I32, U32) => format!("bitcast<u32>({v})"),
        (U32, I32) => format!("bitcast<i32>({v})"),
        // i8 is an i32 on the device, wrapped to its 8 bits where made.
        (Bool, I8) => format!("select(0i, 1i, {v})"),
        (I8, Bool) => format!("({v} != 0i)"),
        (I8, F32 | F16) => format!("f32({v})"),
        (I8, I32) => v.to_string(),
        (I8, U32) => format!("bitcast<u32>({v})"),
        (F32 | F16, I8) => format!("k_wrap_i8(i32({v}))"),
        (I32, I8) => format!("k_wrap_i8({v})"),
        (U32, I8) => format!("k_wrap_i8(bitcast<i32>({v}))"),
        (a, b) => unreachable!("cast {a} -> {b} is covered above"),
    }
}

/// A literal of a dtype's shader type.
pub fn literal(v: f64, dtype: DType) -> String {
    match dtype {
        DType::F32 | DType::F16 => {
            // NaN and infinities through the prelude's `k_f32_bits`: a
            // browser refuses them as constant expressions.
            if v.is_nan() {
                "k_f32_bits(0x7fc00000u)".into()
            } else if v.is_infinite() {
                if v > 0.0 {
                    "k_f32_bits(0x7f800000u)"
                } else {
                    "k_f32_bits(0xff800000u)"
                }
                .into()
            } else {
                format!("bitcast<f32>({}u)", (v as f32).to_bits())
            }
        }
        // Out-of-range i64 literals are refused before codegen
        // (`check_i64_literals`).
        // i32::MIN has no literal (`-2147483648i` negates one out of range).
        DType::I8 | DType::I32 | DType::I64 if v as i32 == i32::MIN => "(-2147483647i - 1i)".into(),
        DType::I8 | DType::I32 | DType::I64 => format!("{}i", v as i32),
        DType::U32 => format!("{}u", v as u32),
        DType::Bool => (v != 0.0).to_string(),
    }
}

/// A complete compute shader: binding declarations, the prelude and one
/// entry point whose body sees `gid` (the flat invocation index) and
/// `lid`/`wid`.
/// With `native_f16` the f16 conversions are the adapter's own
/// (`F16_NATIVE`, whose `enable f16;` leads the module); else integer
/// arithmetic (`F16_SOFT`).
pub fn shader(
    decls: &[String],
    body: &[String],
    workgroup: [u32; 3],
    shared: &[String],
    native_f16: bool,
) -> String {
    let mut s = header(decls, shared, native_f16);
    let _ = writeln!(
        s,
        "@compute @workgroup_size({}, {}, {})\nfn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {{",
        workgroup[0], workgroup[1], workgroup[2]
    );
    if workgroup[1] == 1 && workgroup[2] == 1 {
        let _ = writeln!(
            s,
            "    let gid: u32 = (wid.y * nwg.x + wid.x) * {}u + lid.x;",
            workgroup[0]
        );
    }
    for l in body {
        let _ = writeln!(s, "    {l}");
    }
    s.push_str("}\n");
    s
}

/// The declarations and helpers every shader starts with.
fn header(decls: &[String], shared: &[String], native_f16: bool) -> String {
    let mut s = String::new();
    if native_f16 {
        s.push_str(F16_NATIVE);
    }
    for d in decls.iter().chain(shared) {
        let _ = writeln!(s, "{d}");
    }
    s.push_str(PRELUDE);
    if !native_f16 {
        s.push_str(F16_SOFT);
    }
    s
}

/// A shader of its own functions and entry point (`lines`), after the
/// declarations and helpers.
pub fn module(decls: &[String], lines: &[String], shared: &[String], native_f16: bool) -> String {
    let mut s = header(decls, shared, native_f16);
    for l in lines {
        let _ = writeln!(s, "{l}");
    }
    s
}

/// Workgroups of `size` for `n` invocations of a 1-D kernel, folded into
/// two dimensions past the 65535 per-dimension limit.
pub fn grid(n: usize, size: u32) -> [u32; 3] {
    fold(n.div_ceil(size as usize))
}

/// `groups` workgroups, folded into two dimensions past the 65535
/// per-dimension limit (kernels index them as `wid.y * nwg.x + wid.x`).
/// Rows as even as the limit allows: fewer than `y` workgroups past
/// `groups` (a full row of 65535 would launch up to 65534 idle ones;
/// lavapipe took twice as long over 65536 groups of 64).
pub fn fold(groups: usize) -> [u32; 3] {
    let groups = groups.max(1);
    if groups <= 65535 {
        [groups as u32, 1, 1]
    } else {
        let y = groups.div_ceil(65535);
        [groups.div_ceil(y) as u32, y as u32, 1]
    }
}

/// Validates a shader with naga (parse and type-check), as every generated
/// and hand-written shader must pass.
pub fn validate(src: &str) -> Result<(), String> {
    let module = naga::front::wgsl::parse_str(src).map_err(|e| e.emit_to_string(src))?;
    naga::valid::Validator::new(
        naga::valid::ValidationFlags::all(),
        naga::valid::Capabilities::all(),
    )
    .validate(&module)
    .map_err(|e| format!("{e:?}"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::fold;

    #[test]
    fn folded_grids_cover_the_groups_with_fewer_idle_than_rows() {
        assert_eq!(fold(0), [1, 1, 1]);
        assert_eq!(fold(65535), [65535, 1, 1]);
        assert_eq!(fold(65536), [32768, 2, 1]);
        for groups in [
            65536,
            65537,
            131070,
            131071,
            1 << 20,
            (1 << 22) + 3,
            65535 * 65535,
        ] {
            let [x, y, z] = fold(groups);
            let launched = x as usize * y as usize;
            assert!(x <= 65535 && y <= 65535 && z == 1, "{groups}: {x} x {y}");
            assert!(launched >= groups, "{groups}: {x} x {y}");
            assert!(launched - groups < y as usize, "{groups}: {x} x {y}");
        }
    }
}
