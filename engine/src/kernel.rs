//! What a compiled program is at run time: kernels (WGSL, grid,
//! bindings), where each value lives, what a run returns. The compiler
//! (`lower`) produces it, exports store it, and the runtime alone loads it
//! without the functionalizer or the code generator.

use kiln_dtype::DType;
use std::collections::HashMap;

/// The storage a tensor lives in: a parameter's buffer (per-run input,
/// or a session constant) or the planned arena of intermediates.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Buf {
    Param(usize),
    Arena,
}

/// One storage binding of a kernel: a byte range of a buffer.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Binding {
    pub buf: Buf,
    pub offset: u64,
    pub size: u64,
    /// Bound read-write (the kernel writes it, or writes another range of
    /// the same buffer: one buffer in one dispatch is either read-only in
    /// every binding or writable in every binding).
    pub write: bool,
}

/// Where a materialized value lives: a buffer and a word offset in it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Loc {
    pub buf: Buf,
    pub word: usize,
    /// Bools and f16 values packed 4 and 2 to a word (`wgsl::per_word`);
    /// values written by kernels other than elementwise ones take a word
    /// per element (their invocations cannot own whole words).
    pub packed: bool,
}

/// One generated kernel. Its WGSL names no absolute offset (tensors are
/// bound range by range), so identical kernels of identical layers or
/// shape buckets are one pipeline.
#[derive(Clone, Debug)]
pub struct KernelCode {
    pub label: String,
    pub wgsl: String,
    /// The same kernel with the adapter's own f16 conversions
    /// (`wgsl::F16_NATIVE`), where it converts to f16 and was compiled for
    /// an adapter with `shader-f16`: what runs where the device has the
    /// feature (`KernelCode::source`).
    pub wgsl_f16: Option<String>,
    pub grid: [u32; 3],
    /// Storage bindings in binding order.
    pub bindings: Vec<Binding>,
    /// Uses subgroup operations (the adapter needs `Features::SUBGROUP`):
    /// set where codegen emits them, read by exports' requirements.
    pub subgroup: bool,
}

impl KernelCode {
    /// The shader to run on a device with (`native_f16`) or without the
    /// `shader-f16` feature.
    pub fn source(&self, native_f16: bool) -> &String {
        match &self.wgsl_f16 {
            Some(w) if native_f16 => w,
            _ => &self.wgsl,
        }
    }
}

/// How tensors are bound, from the device's limits.
#[derive(Clone, Copy, Debug)]
pub struct BindingRules {
    /// Words a binding's offset must be a multiple of.
    pub align_words: usize,
    /// The most words one binding may cover.
    pub max_words: usize,
}

/// One binding of a kernel over tensors of one buffer (words `start` to
/// `end`): tensors whose bindings would overlap are bound once, together
/// (`lower::binding_windows`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Window {
    pub buf: Buf,
    pub start: usize,
    pub end: usize,
    /// Tensors bound through it.
    pub tensors: usize,
}

/// How a tensor of `words` words at word `word` of its buffer is bound.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Span {
    /// The binding's first word (`word` rounded down to the alignment).
    pub start: usize,
    /// Bindings it takes (more than one past the largest binding).
    pub chunks: usize,
    /// Words of each binding when split.
    pub chunk_words: usize,
}

impl BindingRules {
    /// The bindings of a tensor: one codegen binds and the plan counts.
    pub fn span(&self, word: usize, words: usize) -> Span {
        let start = word / self.align_words * self.align_words;
        let total = word - start + words.max(1);
        let chunk_words =
            (self.max_words / self.align_words * self.align_words).max(self.align_words);
        let chunks = if total <= self.max_words {
            1
        } else {
            total.div_ceil(chunk_words)
        };
        Span {
            start,
            chunks,
            chunk_words,
        }
    }
}

impl Default for BindingRules {
    /// WebGPU's defaults: 256-byte offsets, 128 MiB bindings.
    fn default() -> Self {
        BindingRules {
            align_words: 64,
            max_words: (128 << 20) / 4,
        }
    }
}

/// What a kernel records in the status word: eager raises an error where
/// these happen, so a run must not return a result.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// An i64 value outside the device's 32-bit range (`wgsl::ty`).
    I64Range = 0,
    /// An index outside its dimension.
    IndexRange = 1,
}

/// Elements of `d` per 32-bit word in a packed buffer: bools and i8 take
/// a byte and f16 values half a word, as in eager memory; other dtypes a
/// word.
pub fn per_word(d: DType) -> usize {
    match d {
        DType::Bool | DType::I8 => 4,
        DType::F16 => 2,
        DType::F32 | DType::I32 | DType::I64 | DType::U32 => 1,
    }
}

/// Words holding `n` elements of `d`, packed or one element per word.
pub fn words(d: DType, n: usize, packed: bool) -> usize {
    if packed {
        n.div_ceil(per_word(d))
    } else {
        n
    }
}

/// Invocations of a 1-D kernel's workgroup where the device does not say
/// (`CompileOptions::workgroup`).
pub const WORKGROUP: u32 = 256;

/// A kernel of a compiled program.
#[derive(Clone, Debug)]
pub struct Kernel {
    pub code: KernelCode,
    /// The source ops this kernel computes (fused producers included).
    pub ops: Vec<String>,
    pub bytes_read: usize,
    pub bytes_written: usize,
    /// Arithmetic operations: 2 M N K for matrix products, one per element
    /// and fused op otherwise.
    pub flops: usize,
}

/// Memory figures of a compiled program, in bytes (4 bytes an element on
/// the GPU, whatever the dtype).
#[derive(Clone, Debug, Default)]
pub struct MemoryStats {
    /// Parameters (inputs and constants).
    pub io: usize,
    /// The planned arena of intermediates and outputs.
    pub arena: usize,
    /// The most arena bytes alive at once: no plan can do better.
    pub lower_bound: usize,
    /// One buffer per materialized value.
    pub naive: usize,
    /// Every value of the functional graph in its own buffer.
    pub naive_unfused: usize,
    /// What eager execution of the source program holds at its peak.
    pub eager_peak: usize,
}

impl MemoryStats {
    pub fn planned_peak(&self) -> usize {
        self.io + self.arena
    }
}

/// A value a run binds, reads back or returns, as the runtime knows it.
#[derive(Clone, Debug, PartialEq)]
pub struct ValueInfo {
    /// Its name in the functionalized program (unique there).
    pub name: String,
    pub dtype: DType,
    pub sizes: Vec<usize>,
}

impl ValueInfo {
    pub fn numel(&self) -> usize {
        self.sizes.iter().product()
    }

    /// `f32[2, 3]`, as the text format writes types.
    pub fn type_string(&self) -> String {
        let dims: Vec<String> = self.sizes.iter().map(|s| s.to_string()).collect();
        format!("{}[{}]", self.dtype.name(), dims.join(", "))
    }
}

/// An output taken on the host as a view of a read-back buffer (no copy
/// kernel): its elements at `offset + sum(index * strides)` of `base`.
#[derive(Clone, Debug, PartialEq)]
pub struct HostView {
    pub base: Val,
    pub sizes: Vec<usize>,
    pub strides: Vec<usize>,
    pub offset: usize,
}

/// A value of a program: an index into `Program::values`.
pub type Val = usize;

/// Where a parameter's contents live (`Program::param_slot`): `words`
/// words from `word` of parameter `buffer`'s buffer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ParamSlot {
    pub buffer: usize,
    pub word: usize,
    pub words: usize,
}

/// A program ready to load on a device: kernels, bindings and the memory
/// plan, with no graph (what the runtime alone loads from an export).
#[derive(Clone, Debug)]
pub struct Program {
    /// The program's name.
    pub name: String,
    /// Every value the plan names: parameters, outputs, read-back buffers
    /// and every value with a location.
    pub values: Vec<ValueInfo>,
    /// The parameters in order.
    pub params: Vec<Val>,
    /// The functionalized program's statements in order (`%y = op(...)`),
    /// named when a kernel reports a fault at one.
    pub statements: Vec<String>,
    /// What a run returns: the program's outputs, then the final value of
    /// each mutated parameter.
    pub outputs: Vec<Val>,
    /// What a run reads back: materialized outputs, and the buffers the
    /// other outputs are views of (taken on the host).
    pub readback: Vec<Val>,
    /// Outputs taken as views of a read-back buffer.
    pub host_views: HashMap<Val, HostView>,
    pub n_outputs: usize,
    /// The parameter index each extra output writes back to.
    pub mutated_inputs: Vec<usize>,
    pub kernels: Vec<Kernel>,
    pub locs: HashMap<Val, Loc>,
    /// Words of each parameter's buffer (0 for a parameter packed into
    /// another's, `param_slot`).
    pub param_words: Vec<usize>,
    /// Parameters bound to session constants (never written).
    pub constants: Vec<usize>,
    /// Parameters whose buffer a kernel writes (results written over a
    /// dying input): a run fills them anew each time.
    pub written_params: Vec<usize>,
    pub arena_words: usize,
    /// The arena word where kernels record a fault (`Fault`: an i64 result
    /// beyond the device's 32 bits, an index out of bounds) and the
    /// statement's position; `None` when no kernel can fault.
    pub status_word: Option<usize>,
    pub memory: MemoryStats,
    /// Bytes a run must move at least: every parameter read once, every
    /// output written once.
    pub min_bytes: usize,
}

impl Program {
    /// Parameter `i`'s value.
    pub fn param(&self, i: usize) -> &ValueInfo {
        &self.values[self.params[i]]
    }

    /// Value `v`.
    pub fn value(&self, v: Val) -> &ValueInfo {
        &self.values[v]
    }

    /// Where parameter `i`'s contents go: its own buffer, or a place in
    /// the buffer of the first of a pack of small parameters
    /// (`lower::pack_params`).
    pub fn param_slot(&self, i: usize) -> ParamSlot {
        let v = self.params[i];
        let m = self.value(v);
        match self.locs.get(&v) {
            Some(&Loc {
                buf: Buf::Param(b),
                word,
                packed,
            }) => ParamSlot {
                buffer: b,
                word,
                words: words(m.dtype, m.numel(), packed),
            },
            _ => ParamSlot {
                buffer: i,
                word: 0,
                words: self.param_words[i],
            },
        }
    }

    pub fn bytes_moved(&self) -> usize {
        self.kernels
            .iter()
            .map(|k| k.bytes_read + k.bytes_written)
            .sum()
    }

    /// A human-readable report: kernels with the ops each fuses, traffic
    /// against the minimum, and the planner's figures.
    pub fn stats(&self) -> String {
        use std::fmt::Write;
        let mut s = String::new();
        let _ = writeln!(s, "kernels: {}", self.kernels.len());
        for (i, k) in self.kernels.iter().enumerate() {
            let _ = writeln!(
                s,
                "  {i:3} {:<28} read {:>10} B  write {:>10} B  fuses: {}",
                k.code.label,
                k.bytes_read,
                k.bytes_written,
                k.ops.join(" ")
            );
        }
        let moved = self.bytes_moved();
        let _ = writeln!(
            s,
            "bytes moved: {moved} (minimum {}, ratio {:.3})",
            self.min_bytes,
            moved as f64 / self.min_bytes.max(1) as f64
        );
        let m = &self.memory;
        let _ = writeln!(
            s,
            "memory (bytes): planned peak {} = io {} + arena {}",
            m.planned_peak(),
            m.io,
            m.arena
        );
        let _ = writeln!(
            s,
            "  arena lower bound {}  naive (one buffer per materialized value) {}",
            m.lower_bound, m.naive
        );
        let _ = writeln!(
            s,
            "  naive unfused (one buffer per value) {}  eager reference peak {}",
            m.naive_unfused, m.eager_peak
        );
        let _ = writeln!(
            s,
            "  planned/eager {:.3}  arena/lower bound {:.3}",
            m.planned_peak() as f64 / m.eager_peak.max(1) as f64,
            m.arena as f64 / m.lower_bound.max(1) as f64
        );
        s
    }
}
