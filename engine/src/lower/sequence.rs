//! Which launches of a plan run in sequence in one workgroup
//! (`codegen::sequence`), and the values they keep in workgroup memory:
//! runs of launches small enough that one workgroup computes them sooner
//! than the launches would start, and where the values they make live.

use super::*;
use crate::codegen::sequence::WSM_LIMIT;
use std::ops::Range;

use crate::fusion::{SEQUENCE_BYTES, SEQUENCE_FLOPS};

/// The runs of launches (by index) that may run in sequence: consecutive
/// launches of no custom kernel and no packed store lane by lane, within
/// the budgets above and the device's bindings (the arena and the
/// parameters they touch).
pub(super) fn segments(
    e: &Emit,
    members: &[Vec<usize>],
    options: &CompileOptions,
) -> Vec<Range<usize>> {
    let mut out = vec![];
    let mut start = 0;
    let mut params: HashSet<usize> = HashSet::new();
    let (mut flops, mut bytes) = (0, 0);
    for (l, m) in members.iter().enumerate() {
        let (f, b, ok) = e.launch_budget(m);
        let mut touched = params.clone();
        touched.extend(e.params_of(m));
        let fits = ok
            && flops + f <= SEQUENCE_FLOPS
            && bytes + b <= SEQUENCE_BYTES
            // The arena, its status word with it: one binding.
            && touched.len() < options.max_bindings;
        if fits {
            (flops, bytes, params) = (flops + f, bytes + b, touched);
            continue;
        }
        if l - start > 1 {
            out.push(start..l);
        }
        // This launch starts the next run, if it can be in one.
        (start, flops, bytes) = (l, f, b);
        params = e.params_of(m);
        if !ok || f > SEQUENCE_FLOPS || b > SEQUENCE_BYTES {
            (start, flops, bytes) = (l + 1, 0, 0);
            params.clear();
        }
    }
    if members.len() - start.min(members.len()) > 1 {
        out.push(start..members.len());
    }
    out
}

/// Values kept in workgroup memory by kernels in sequence.
#[derive(Default)]
struct Placement {
    /// Each value's first word there.
    at: HashMap<ValueId, usize>,
    /// Those also stored in memory (read back, or read by later launches).
    through: HashSet<ValueId>,
    /// Arena buffers made by the kernels: read from workgroup memory by
    /// them, never from memory.
    kept: HashSet<ValueId>,
    /// The words it takes.
    words: usize,
}

impl Placement {
    /// The buffers of `kept` no version of which is stored in memory.
    fn alone(&self, sched: &schedule::Schedule) -> HashSet<ValueId> {
        let stored: HashSet<ValueId> = self.through.iter().map(|&v| sched.root(v)).collect();
        self.kept.difference(&stored).copied().collect()
    }
}

/// A run of launches generated as one kernel, the launches it took (up to
/// `end`) and the arena words it binds.
pub(super) struct Done {
    pub(super) kernel: Kernel,
    pub(super) end: usize,
    pub(super) arena_words: usize,
    /// Buffers (roots) it keeps in workgroup memory alone.
    pub(super) alone: HashSet<ValueId>,
}

/// The launches of `run` (from its first, as many as can) as one kernel
/// in sequence; `None` where fewer than two can.
pub(super) fn emit(
    e: &Emit,
    gen: &mut Gen,
    life: &Lifetimes,
    members: &[Vec<usize>],
    run: Range<usize>,
    options: &CompileOptions,
) -> Result<Option<Done>, CompileError> {
    let (start, mut end) = (run.start, run.end);
    let status = gen
        .status
        .ok_or_else(|| CompileError::internal(Stage::Codegen, "no status word placed"))?;
    // Each buffer is bound whole, in one binding.
    let widest = e.layout.param_words.iter().copied().max().unwrap_or(0);
    if (status + 1).max(widest) > options.rules.max_words {
        return Ok(None);
    }
    while end - start > 1 {
        let Some(place) = e.placement(life, members, start..end) else {
            return Ok(None);
        };
        let words = place.words;
        if words * 4 > WSM_LIMIT {
            end -= 1;
            continue;
        }
        gen.vec4_ranges = HashSet::new();
        gen.windows = e.whole_buffers(status + 1);
        gen.lane_stores = vec![];
        gen.begin_sequence(place.at.clone(), place.through.clone(), words);
        // Kernels that need no workgroup of theirs (rows an invocation,
        // products in register blocks, no tiles through workgroup
        // memory): they share the one workgroup whatever its size.
        let saved = barrier_free(gen, (usize::MAX, false, false, None, None));
        // A launch that cannot be generated as a part (a form the
        // families refuse without their own workgroups or bindings) ends
        // the run there; alone it is generated as ever.
        let mut owner = vec![];
        let mut failed = None;
        for (pos, m) in members[start..end].iter().enumerate() {
            if e.parts_of(gen, m).is_err() {
                failed = Some(pos);
                break;
            }
            owner.resize(gen.parts_so_far(), pos);
        }
        barrier_free(gen, saved);
        let joined = gen.end_sequence();
        let at = match (failed, joined) {
            (None, Ok(code)) => {
                let kernel = e.sequence_kernel(code, &members[start..end], &place, options)?;
                return Ok(Some(Done {
                    kernel,
                    end,
                    arena_words: status + 1,
                    alone: place.alone(e.sched),
                }));
            }
            (Some(pos), _) => pos,
            (None, Err(part)) => owner.get(part).copied().unwrap_or(0),
        };
        if at == 0 {
            break;
        }
        end = start + at;
    }
    Ok(None)
}

/// The codegen choices kernels in sequence override: tiles from which
/// rows, rows through workgroup memory, transposes in tiles, subgroups,
/// the grid-stride cap.
type Choices = (usize, bool, bool, Option<usize>, Option<usize>);

/// Sets `gen`'s choices to `c`, returning those it had.
fn barrier_free(gen: &mut Gen, c: Choices) -> Choices {
    let old = (
        gen.tile_min_rows,
        gen.workgroup_rows,
        gen.tile_transposes,
        gen.subgroup,
        gen.grid_stride,
    );
    (
        gen.tile_min_rows,
        gen.workgroup_rows,
        gen.tile_transposes,
        gen.subgroup,
        gen.grid_stride,
    ) = c;
    old
}

impl Emit<'_> {
    /// Flops and bytes of launch `m` as a launch of its own, and whether
    /// it may run in sequence.
    fn launch_budget(&self, m: &[usize]) -> (usize, usize, bool) {
        let (g, sched) = (self.g, self.sched);
        let mut flops = 0;
        let mut ok = true;
        for &i in m {
            let grp = &self.groups[i];
            let c = KernelCost::of(g, sched, grp, self.registers, self.packing);
            flops += kernel_flops(g, sched, grp, c.ops.len(), c.elements);
            for &v in grp {
                let custom = g
                    .node_of(v)
                    .is_some_and(|n| g.nodes[n].op.def().lowering == Lowering::Custom);
                ok &= !custom && !stores_lanes_in(g, sched, self.packing, grp, v);
            }
        }
        let c = launch_cost(g, sched, self.groups, m, self.registers, self.packing);
        (flops, c.bytes_read + c.written, ok)
    }

    /// The parameters launch `m` reads or writes.
    fn params_of(&self, m: &[usize]) -> HashSet<usize> {
        let mut out = HashSet::new();
        for &i in m {
            let grp = &self.groups[i];
            for v in read_values(self.g, self.sched, grp)
                .into_iter()
                .chain(grp.iter().copied())
            {
                if let Some(Loc {
                    buf: Buf::Param(p), ..
                }) = self.layout.locs.get(&v)
                {
                    out.insert(*p);
                }
            }
        }
        out
    }

    /// Where kernels in sequence `run` keep values in workgroup memory:
    /// every version (the in-place results sharing a buffer) of a buffer
    /// made there, packed ones aside. Arena buffers at their own
    /// words (the arena's plan keeps apart what lives together), the
    /// parameters' after them (results over a parameter dying in the run);
    /// the versions read back or by later kernels stored in memory too (an
    /// earlier version a later one overwrites whole is not).
    fn placement(
        &self,
        life: &Lifetimes,
        members: &[Vec<usize>],
        run: Range<usize>,
    ) -> Option<Placement> {
        let (g, sched) = (self.g, self.sched);
        let mut span: HashMap<ValueId, (usize, usize)> = HashMap::new();
        for (l, m) in members.iter().enumerate() {
            for &i in m {
                let grp = &self.groups[i];
                for v in read_values(g, sched, grp)
                    .into_iter()
                    .chain(grp.iter().copied())
                {
                    let e = span.entry(sched.root(v)).or_insert((l, l));
                    *e = (e.0.min(l), e.1.max(l));
                }
            }
        }
        // Buffers first touched in the run (made there).
        let inside = |r: &ValueId| span.get(r).is_some_and(|(a, _)| run.contains(a));
        // Versions read back or by later kernels: those, and what a
        // region written in place or a reshape leaves of the version
        // before.
        let mut through = HashSet::new();
        let mut stack: Vec<ValueId> = life.readback.clone();
        for m in &members[run.end..] {
            for &i in m {
                stack.extend(read_values(g, sched, &self.groups[i]));
            }
        }
        while let Some(v) = stack.pop() {
            if !through.insert(v) {
                continue;
            }
            if let Some(&b) = sched.inplace.get(&v) {
                stack.push(b);
            } else if let Some(&b) = sched.alias_of.get(&v) {
                // A reshape is the version it views; a kernel's result
                // over a dying input overwrites that input whole.
                if !life.step.contains_key(&v) {
                    stack.push(b);
                }
            }
        }
        let mut place = Placement::default();
        let mut owners: Vec<(ValueId, Loc)> =
            self.layout.locs.iter().map(|(&v, &l)| (v, l)).collect();
        owners.sort_by_key(|(v, _)| *v);
        owners.retain(|(v, l)| !l.packed && !g.inputs.contains(v) && inside(&sched.root(*v)));
        let words = |v: ValueId| self.packing.bytes(g, sched, sched.root(v)) / 4;
        for &(v, _) in owners.iter().filter(|(_, l)| l.buf == Buf::Arena) {
            // Every arena buffer has its word there (the same values
            // planned again): none, no sequence.
            let at = *self.workgroup_words.get(&sched.root(v))?;
            place.kept.insert(sched.root(v));
            place.at.insert(v, at);
            place.words = place.words.max(at + words(v));
        }
        // Results over a dying parameter, where the parameter's contents
        // are not theirs (a kernel overwrote them whole on the way):
        // after the arena's words, one range a parameter.
        let overwritten = |mut v: ValueId| loop {
            match (sched.inplace.get(&v), sched.alias_of.get(&v)) {
                (Some(&b), _) => v = b,
                (None, Some(_)) if life.step.contains_key(&v) => return true,
                (None, Some(&b)) => v = b,
                (None, None) => return false,
            }
        };
        let mut params: HashMap<ValueId, usize> = HashMap::new();
        for &(v, _) in owners
            .iter()
            .filter(|(v, l)| l.buf != Buf::Arena && overwritten(*v))
        {
            let r = sched.root(v);
            let next = place.words;
            let at = *params.entry(r).or_insert(next);
            place.words = place.words.max(at + words(v));
            place.at.insert(v, at);
        }
        place.through = place
            .at
            .keys()
            .copied()
            .filter(|v| through.contains(v))
            .collect();
        Some(place)
    }

    /// Every buffer bound whole, once: the arena up to `arena_words` and
    /// each parameter (kernels in sequence bind each buffer once).
    fn whole_buffers(&self, arena_words: usize) -> Vec<Window> {
        let mut out = vec![Window {
            buf: Buf::Arena,
            start: 0,
            end: arena_words,
            tensors: 2,
        }];
        for (i, &w) in self.layout.param_words.iter().enumerate() {
            if w > 0 {
                out.push(Window {
                    buf: Buf::Param(i),
                    start: 0,
                    end: w,
                    tensors: 2,
                });
            }
        }
        out
    }

    /// Generates the kernels of launch `m` one after another (as parts of
    /// a sequence: independent kernels need not share a launch).
    fn parts_of(&self, gen: &mut Gen, m: &[usize]) -> Result<(), CompileError> {
        let (g, sched) = (self.g, self.sched);
        for &i in m {
            let grp = &self.groups[i];
            if let Some(&rows) = sched.chains.get(&grp[0]) {
                gen.row_chain(grp, rows)?;
            } else if let Some(r) = folded_reduction(g, sched, grp) {
                gen.prologue = grp[..grp.len() - 1].to_vec();
                let done = gen.kernel(r);
                gen.prologue.clear();
                done?;
            } else if is_map(g, sched, grp[0]) {
                if g.meta(grp[0]).numel() > 0 {
                    gen.map_group(grp)?;
                }
            } else {
                for &v in grp {
                    gen.kernel(v)?;
                }
            }
        }
        Ok(())
    }

    /// The kernel of launches `run` in sequence, with what it moves: the
    /// buffers it reads once each, what it stores, nothing of the values
    /// in workgroup memory (those written through: their stores).
    fn sequence_kernel(
        &self,
        code: crate::kernel::KernelCode,
        run: &[Vec<usize>],
        place: &Placement,
        options: &CompileOptions,
    ) -> Result<Kernel, CompileError> {
        let (g, sched) = (self.g, self.sched);
        // Values in workgroup memory alone store nothing, as registers.
        let mut unstored = self.registers.clone();
        unstored.extend(place.at.keys().filter(|v| !place.through.contains(v)));
        let mut cost = KernelCost {
            ops: vec![],
            bytes_read: 0,
            written: 0,
            elements: 0,
        };
        let mut flops = 0;
        let mut charged: HashMap<ValueId, usize> = HashMap::new();
        for &i in run.iter().flatten() {
            let grp = &self.groups[i];
            let whole =
                is_map(g, sched, grp[0]) || grp.len() == 1 || sched.chains.contains_key(&grp[0]);
            let units: Vec<&[ValueId]> = match whole {
                true => vec![&grp[..]],
                false => grp.chunks(1).collect(),
            };
            for unit in units {
                let (one, reads) = KernelCost::one(g, sched, unit, &unstored, self.packing);
                flops += kernel_flops(g, sched, unit, one.ops.len(), one.elements);
                cost.ops.extend(one.ops);
                cost.written += one.written;
                cost.elements = cost.elements.max(one.elements);
                for (r, b) in reads {
                    if !place.kept.contains(&r) {
                        let c = charged.entry(r).or_default();
                        *c = (*c).max(b);
                    }
                }
            }
        }
        cost.bytes_read = charged.values().sum();
        checked_kernel(code, options.max_bindings, &cost, flops)
    }
}
