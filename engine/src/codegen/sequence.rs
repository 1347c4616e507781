//! Kernels in sequence in one workgroup: a small program's kernels, each
//! a function the workgroup calls for every workgroup of the kernel's own
//! grid in turn, with a barrier between kernels, so that the values they
//! make stay in workgroup memory (`WSM`) instead of going to memory and
//! back (those read back or by later launches stored to memory too). One launch instead of several; a kernel of a few hundred
//! elements costs a launch more than its arithmetic (lavapipe: 0.05-0.24
//! ms a kernel for cnn_block's, which move 100 B to 10 KB each).

use super::siblings::{
    invocations, shared_bytes, shared_name, whole_workgroup, Part, WORKGROUP_STORAGE,
};
use super::*;

pub(crate) use crate::wgsl::WSM;

/// Bytes of workgroup memory the kept values may take (the kernels' own
/// arrays share the rest: `sequence` checks the sum).
pub(crate) const WSM_LIMIT: usize = WORKGROUP_STORAGE as usize;

/// The parts as one kernel of a single workgroup; `Err(i)` where part `i`
/// cannot run in it with those before it (a workgroup of another size
/// that it needs whole, workgroup memory declared otherwise under one name
/// or past `WORKGROUP_STORAGE` together with `wsm_words`).
fn sequence(parts: &[Part], wsm_words: usize) -> Result<Part, usize> {
    // The workgroup: that of the first part needing its own whole, else
    // the largest; the others run several of their workgroups in one
    // iteration, or one over several.
    let size = match parts.iter().find(|p| whole_workgroup(p)) {
        Some(p) => invocations(p.wg),
        None => parts
            .iter()
            .map(|p| invocations(p.wg))
            .max()
            .ok_or(0usize)?,
    };
    let mut shared: Vec<String> = vec![format!(
        "var<workgroup> {WSM}: array<u32, {}>;",
        wsm_words.max(1)
    )];
    let mut functions = vec![];
    let mut main = vec![
        // A 1 the shader compiler cannot see: constant loop bounds get
        // unrolled (see `Gen::row_chain`).
        "let one: u32 = min(nwg.x, 1u);".to_string(),
    ];
    for (i, p) in parts.iter().enumerate() {
        let s = invocations(p.wg);
        let whole = whole_workgroup(p);
        if s != size && (whole || (!size.is_multiple_of(s) && !s.is_multiple_of(size))) {
            return Err(i);
        }
        for d in &p.shared {
            match shared.iter().position(|x| shared_name(x) == shared_name(d)) {
                Some(at) if shared[at] != *d => match wider(&shared[at], d) {
                    Some(w) => shared[at] = w,
                    None => return Err(i),
                },
                Some(_) => {}
                None => shared.push(d.clone()),
            }
        }
        if shared_bytes(&shared) > WORKGROUP_STORAGE {
            return Err(i);
        }
        let [x, y, z] = p.grid;
        let groups = x * y * z;
        let [a, b, _] = p.wg;
        let unflat = |l: &str| {
            if p.wg == [size, 1, 1] {
                format!("vec3<u32>({l}, 0u, 0u)")
            } else {
                format!("vec3<u32>({l} % {a}u, {l} / {a}u % {b}u, {l} / {}u)", a * b)
            }
        };
        let wid = |w: &str| format!("vec3<u32>({w} % {x}u, {w} / {x}u % {y}u, {w} / {}u)", x * y);
        // Times the opaque 1: kernels hide constant loop bounds behind
        // `nwg` (`Gen::row_chain`).
        let nwg = format!("vec3<u32>({x}u * one, {y}u * one, {z}u * one)");
        let mut f = vec![format!(
            "fn k{i}(wid: vec3<u32>, lid: vec3<u32>, nwg: vec3<u32>) {{"
        )];
        if p.wg[1..] == [1, 1] {
            f.push(format!(
                "    let gid: u32 = (wid.y * nwg.x + wid.x) * {a}u + lid.x;"
            ));
        }
        f.extend(p.lines.iter().map(|l| format!("    {l}")));
        f.push("}".into());
        functions.push(f.join("\n"));
        main.push(format!("// {}", p.label.replace('\n', " ")));
        if s < size {
            // Several of the part's workgroups an iteration, `s` lanes each.
            let k = size / s;
            main.push(format!(
                "for (var w: u32 = 0u; w < {}u * one; w = w + 1u) {{",
                groups.div_ceil(k)
            ));
            main.push(format!("    let pw = w * {k}u + lid.x / {s}u;"));
            main.push(format!(
                "    if (pw < {groups}u) {{ k{i}({}, {}, {nwg}); }}",
                wid("pw"),
                unflat(&format!("(lid.x % {s}u)"))
            ));
        } else if s > size {
            // One of the part's workgroups over several iterations.
            let m = s / size;
            main.push(format!(
                "for (var w: u32 = 0u; w < {}u * one; w = w + 1u) {{",
                groups * m
            ));
            main.push(format!("    let pw = w / {m}u;"));
            main.push(format!("    let pl = w % {m}u * {size}u + lid.x;"));
            main.push(format!("    k{i}({}, {}, {nwg});", wid("pw"), unflat("pl")));
        } else {
            main.push(format!(
                "for (var w: u32 = 0u; w < {groups}u * one; w = w + 1u) {{"
            ));
            main.push(format!(
                "    k{i}({}, {}, {nwg});",
                wid("w"),
                unflat("lid.x")
            ));
            if whole {
                // Its workgroup arrays are the next workgroup's.
                main.push("    workgroupBarrier();".into());
            }
        }
        main.push("}".into());
        if i + 1 < parts.len() {
            // What it wrote, in memory or in the workgroup's, is what the
            // next kernel reads.
            main.push("storageBarrier();".into());
            main.push("workgroupBarrier();".into());
        }
    }
    let mut lines = functions;
    lines.push(String::new());
    lines.push(format!(
        "@compute @workgroup_size({size}, 1, 1)\nfn main(@builtin(local_invocation_id) lid: vec3<u32>, @builtin(num_workgroups) nwg: vec3<u32>) {{"
    ));
    lines.extend(main.into_iter().map(|l| format!("    {l}")));
    lines.push("}".into());
    Ok(Part {
        label: parts
            .iter()
            .map(|p| p.label.as_str())
            .collect::<Vec<_>>()
            .join(" ; "),
        grid: [1, 1, 1],
        wg: [size, 1, 1],
        lines,
        shared,
        words_shared: false,
    })
}

/// The wider of two declarations of one workgroup array of one element
/// type (kernels in sequence use it one after another).
fn wider(a: &str, b: &str) -> Option<String> {
    let parse = |d: &str| -> Option<(String, u64)> {
        let (head, n) = d.trim_end_matches(">;").rsplit_once(',')?;
        Some((head.to_string(), n.trim().parse().ok()?))
    };
    let ((ha, na), (hb, nb)) = (parse(a)?, parse(b)?);
    (ha == hb).then(|| {
        if na >= nb {
            a.to_string()
        } else {
            b.to_string()
        }
    })
}

impl Gen<'_> {
    /// Starts kernels in sequence: until `end_sequence`, each kernel
    /// generated is kept as a part, and the values of `in_workgroup` are
    /// read and stored at their words of `WSM` (`wsm_words` long).
    /// Values of `through` are also stored in memory (read back by the
    /// host), read from workgroup memory.
    pub fn begin_sequence(
        &mut self,
        in_workgroup: HashMap<ValueId, usize>,
        through: HashSet<ValueId>,
        wsm_words: usize,
    ) {
        self.parts = Some(vec![]);
        self.sequential = true;
        self.in_workgroup = in_workgroup;
        self.written_through = through;
        self.wsm_words = wsm_words;
    }

    /// Parts kept so far (the kernels generated since `begin_sequence`).
    pub fn parts_so_far(&self) -> usize {
        self.parts.as_ref().map_or(0, Vec::len)
    }

    /// The kernels generated since `begin_sequence` as one kernel of one
    /// workgroup, or `Err(i)` where part `i` cannot join those before it
    /// (nothing kept: generate again).
    pub fn end_sequence(&mut self) -> Result<KernelCode, usize> {
        let parts = self.parts.take().unwrap_or_default();
        self.sequential = false;
        self.in_workgroup.clear();
        self.written_through.clear();
        let joined = sequence(&parts, self.wsm_words);
        let subgroup = std::mem::take(&mut self.uses_subgroup);
        let (decls, bindings) = self.take_bindings();
        let k = joined?;
        Ok(KernelCode {
            label: k.label,
            wgsl: wgsl::module(&decls, &k.lines, &k.shared, false),
            wgsl_f16: (self.shader_f16 && wgsl::converts_to_f16(&k.lines))
                .then(|| wgsl::module(&decls, &k.lines, &k.shared, true)),
            grid: k.grid,
            bindings,
            subgroup,
        })
    }

    /// The slot of value `v` where it is kept in workgroup memory (read
    /// there; stored there alone, or also at `loc` in memory where it is
    /// written through).
    pub(super) fn workgroup_slot(&mut self, v: ValueId, loc: Loc, write: bool) -> Option<Slot> {
        let &base = self.in_workgroup.get(&v)?;
        if write && self.written_through.contains(&v) {
            let m = self.meta(v);
            let words = wgsl::words(m.dtype, m.numel(), loc.packed);
            let mut slot = self.slot(loc, words, true);
            slot.copy = Some(base);
            return Some(slot);
        }
        Some(Slot {
            var: WSM.into(),
            base,
            copy: None,
            chunk: None,
            vec4: false,
            atomic: false,
        })
    }
}
