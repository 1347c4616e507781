//! Independent kernels as one launch: sibling products reading the same
//! left operand (a transformer's Q, K and V projections, each with its own
//! epilogue; the shared operand's tiles read while they are still in
//! cache), and neighbouring kernels that neither read what the others
//! write nor write what they read (the reductions of one tensor, a K and a
//! V cache written in place). One grid whose workgroups pick their part by
//! `wid.x` (`lower::group_kernels` groups them): one launch instead of
//! several.

use super::*;

/// The workgroup size (invocations) of the launch a kernel joined, or of
/// its own (`None`: not one kernel). Grids of any shape join, workgroups
/// of any shape with as many invocations, and smaller ones that use no
/// workgroup memory (`join`).
pub type Shape = Option<u32>;

/// The invocations of a workgroup of shape `wg`.
pub(super) fn invocations(wg: [u32; 3]) -> u32 {
    wg.iter().product()
}

/// Bytes of the workgroup memory `decls` declare (`array<T, N>` of
/// scalars or vectors of 32 bits, or the most a declaration of another
/// form could need: all of it, so it joins nothing).
pub(super) fn shared_bytes(decls: &[String]) -> u64 {
    decls
        .iter()
        .map(|d| {
            let array = d
                .split_once("array<")
                .map(|(_, a)| a.trim_end_matches(">;"));
            let (ty, n) = array.and_then(|a| a.rsplit_once(',')).unwrap_or_default();
            let lanes = match ty.trim() {
                "f32" | "i32" | "u32" => Some(1),
                t if t.starts_with("vec2<") => Some(2),
                t if t.starts_with("vec3<") || t.starts_with("vec4<") => Some(4),
                _ => None,
            };
            match (lanes, n.trim().parse::<u64>()) {
                (Some(l), Ok(n)) => l * 4 * n,
                _ => WORKGROUP_STORAGE + 1,
            }
        })
        .sum()
}

/// WebGPU's default workgroup memory limit, which a joined kernel's
/// parts share (each part's own declarations fit it).
pub(super) const WORKGROUP_STORAGE: u64 = 16384;

/// One kernel's body, generated as if alone.
pub(super) struct Part {
    pub(super) label: String,
    pub(super) grid: [u32; 3],
    pub(super) wg: [u32; 3],
    pub(super) lines: Vec<String>,
    pub(super) shared: Vec<String>,
    /// Stores packed words lane by lane that it would store whole alone
    /// (`Gen::stores_runs`).
    pub(super) words_shared: bool,
}

/// The name a workgroup-memory declaration declares.
pub(super) fn shared_name(decl: &str) -> &str {
    decl.split('>')
        .nth(1)
        .and_then(|r| r.split(':').next())
        .unwrap_or(decl)
        .trim()
}

/// Do the part's invocations need the others of their workgroup
/// (workgroup memory, barriers, subgroup operations)? Those of parts
/// needing none can be packed several workgroups to one of the launch's,
/// or spread over several.
pub(super) fn whole_workgroup(p: &Part) -> bool {
    !p.shared.is_empty()
        || p.lines
            .iter()
            .any(|l| l.contains("Barrier") || l.contains("subgroup"))
}

/// The parts as one kernel: workgroup `wid.x` of the joined grid runs the
/// part whose columns it falls in, with `wid`, `nwg` and `gid` shadowed by
/// their values in that part's own grid (uniform: barriers stay legal).
/// Where the parts' grids differ in height or depth (a `bmm` of two
/// batches beside a broadcast `matmul` of eight), the joined grid is one
/// row of every part's workgroups and each part unfolds its own `wid`
/// from its offset in that row. Where their workgroups differ in shape
/// but not in size (a product's 8 x 8 tiles beside a reduction's 64
/// lanes), the joined workgroup is one row of invocations and each part
/// unfolds its own `lid` from the invocation's place in it (the same
/// linear index, so subgroups stay whole). A part of fewer invocations
/// that uses no workgroup memory, barrier or subgroup runs several of its
/// workgroups in one of the launch's (`packs`); a part of more
/// invocations needing none of them spreads each of its workgroups over
/// several of the launch's (`splits`: serial reductions of 256 beside
/// row reductions of 64 lanes). `None` where they cannot
/// share a launch: workgroups of other sizes, workgroup memory declared
/// differently under one name or past `WORKGROUP_STORAGE` together, or
/// too wide a grid.
fn join(parts: &[Part]) -> Option<Part> {
    let first = parts.first()?;
    // The launch's workgroup: that of the parts needing theirs whole, else
    // the largest.
    let size = match parts
        .iter()
        .filter(|p| whole_workgroup(p))
        .map(|p| invocations(p.wg))
        .max()
    {
        Some(s) => s,
        None => parts.iter().map(|p| invocations(p.wg)).max()?,
    };
    // Workgroups of a part in one of the launch's (`packs`), or the
    // launch's workgroups one of the part's takes (`splits`).
    let mut packs = vec![1u32; parts.len()];
    let mut splits = vec![1u32; parts.len()];
    for ((k, m), p) in packs.iter_mut().zip(splits.iter_mut()).zip(parts) {
        let s = invocations(p.wg);
        if s != size {
            if whole_workgroup(p) || (!size.is_multiple_of(s) && !s.is_multiple_of(size)) {
                return None;
            }
            (*k, *m) = (size / s.min(size), s / size.min(s));
        }
    }
    let packed = packs.iter().chain(&splits).any(|&k| k > 1);
    let flat = packed || parts.iter().any(|p| p.grid[1..] != first.grid[1..]);
    let lanes = packed || parts.iter().any(|p| p.wg != first.wg);
    // Kernels of other shapes join only where none gives up whole-word
    // stores of packed results for it (atomics lane by lane cost more
    // than the launch saved).
    if (flat || lanes) && parts.iter().any(|p| p.words_shared) {
        return None;
    }
    let wg = if lanes { [size, 1, 1] } else { first.wg };
    let mut shared: Vec<String> = vec![];
    let mut lines = vec![];
    let mut end = 0u32;
    for (i, ((p, &k), &m)) in parts.iter().zip(&packs).zip(&splits).enumerate() {
        for d in &p.shared {
            match shared.iter().find(|s| shared_name(s) == shared_name(d)) {
                Some(s) if s != d => return None,
                Some(_) => {}
                None => shared.push(d.clone()),
            }
        }
        let start = end;
        let [x, y, z] = p.grid;
        let groups = x.checked_mul(y)?.checked_mul(z)?;
        let width = if flat {
            groups.div_ceil(k).checked_mul(m)?
        } else {
            x
        };
        end = end.checked_add(width)?;
        lines.push(match i {
            0 => format!("if (wid.x < {end}u) {{"),
            _ if i + 1 == parts.len() => "} else {".to_string(),
            _ => format!("}} else if (wid.x < {end}u) {{"),
        });
        let s = invocations(p.wg);
        if k > 1 {
            // Workgroup `part_wg` of the part's own grid: its invocations are
            // those of the `s` lanes `lid.x / s` of the launch's.
            lines.push(format!(
                "let part_wg = (wid.x - {start}u) * {k}u + lid.x / {s}u;"
            ));
            lines.push(format!("if (part_wg < {groups}u) {{"));
        } else if m > 1 {
            // Workgroup `part_wg` of the part's own grid takes `m` of the
            // launch's, its invocations in order through them.
            lines.push(format!("let part_wg = (wid.x - {start}u) / {m}u;"));
            lines.push(format!(
                "let part_lid = (wid.x - {start}u) % {m}u * {size}u + lid.x;"
            ));
        } else {
            lines.push(format!("let part_wg = wid.x - {start}u;"));
        }
        lines.push(if flat {
            format!(
                "let wid = vec3<u32>(part_wg % {x}u, part_wg / {x}u % {y}u, part_wg / {}u);",
                x * y
            )
        } else {
            "let wid = vec3<u32>(part_wg, wid.y, wid.z);".to_string()
        });
        lines.push(format!("let nwg = vec3<u32>({x}u, {y}u, {z}u);"));
        if m > 1 {
            let [a, b, _] = p.wg;
            lines.push(format!(
                "let lid = vec3<u32>(part_lid % {a}u, part_lid / {a}u % {b}u, part_lid / {}u);",
                a * b
            ));
        } else if lanes && (k > 1 || p.wg[1..] != [1, 1]) {
            let [a, b, _] = p.wg;
            lines.push(format!(
                "let lid = vec3<u32>(lid.x % {a}u, lid.x / {a}u % {b}u, lid.x % {s}u / {}u);",
                a * b
            ));
        }
        if p.wg[1..] == [1, 1] {
            // `wgsl::shader`'s flat invocation index, in the part's grid.
            lines.push(format!(
                "let gid: u32 = (wid.y * nwg.x + wid.x) * {}u + lid.x;",
                p.wg[0]
            ));
        }
        lines.extend(p.lines.iter().cloned());
        if k > 1 {
            lines.push("}".into());
        }
    }
    lines.push("}".into());
    let label = parts
        .iter()
        .map(|p| p.label.as_str())
        .collect::<Vec<_>>()
        .join(" | ");
    let grid = if flat {
        [end, 1, 1]
    } else {
        [end, first.grid[1], first.grid[2]]
    };
    (end <= 65535 && shared_bytes(&shared) <= WORKGROUP_STORAGE).then_some(Part {
        label,
        grid,
        wg,
        lines,
        shared,
        words_shared: parts.iter().any(|p| p.words_shared),
    })
}

impl Gen<'_> {
    /// The kernels computing the independent kernels' values `grp`, two or
    /// more, each with the values it computes: all in one launch, or where
    /// they cannot all share one (`join`), each in the first launch it can
    /// share (recorded in `apart` for the next plan).
    pub fn siblings(&mut self, grp: &[ValueId]) -> R<Vec<(Vec<ValueId>, Vec<KernelCode>)>> {
        let parts = self.parts_of(grp)?;
        if let Some(code) = parts.as_deref().and_then(|p| self.joined(p)) {
            return Ok(vec![(grp.to_vec(), vec![code])]);
        }
        // Start again from a clean slate: each kernel joins the first
        // launch it can share (workgroups of its size, workgroup memory
        // that fits beside theirs), or starts one.
        self.uses_subgroup = false;
        drop(self.take_bindings());
        let Some(parts) = parts else {
            self.apart.extend(grp.iter().map(|&v| (v, None)));
            return grp
                .iter()
                .map(|&v| Ok((vec![v], self.kernel(v)?)))
                .collect();
        };
        // Each launch: its workgroup size, whether a part needs it whole,
        // its kernels.
        let mut clusters: Vec<(u32, bool, Vec<ValueId>)> = vec![];
        // Parts needing their workgroups whole first; the others join a
        // launch of their own workgroup size first, else any whose size
        // divides or is divided by theirs.
        let mut order: Vec<(&ValueId, &Part)> = grp.iter().zip(&parts).collect();
        order.sort_by_key(|(_, p)| !whole_workgroup(p));
        for (&v, part) in order {
            let size = invocations(part.wg);
            let whole = whole_workgroup(part);
            let mut tries: Vec<usize> = (0..clusters.len()).collect();
            tries.sort_by_key(|&i| clusters[i].0 != size);
            let mut at = None;
            for i in tries {
                let trial: Vec<ValueId> = clusters[i].2.iter().copied().chain([v]).collect();
                if self.join_of(&trial)? {
                    at = Some(i);
                    break;
                }
            }
            match at {
                Some(i) => {
                    let c = &mut clusters[i];
                    if !c.1 {
                        c.0 = if whole { size } else { c.0.max(size) };
                    }
                    c.1 |= whole;
                    c.2.push(v);
                }
                None => clusters.push((size, whole, vec![v])),
            }
        }
        let mut out = vec![];
        for (size, _, vals) in clusters {
            let mut shape = Some(size);
            if vals.len() > 1 {
                let parts = self.parts_of(&vals)?;
                if let Some(code) = parts.as_deref().and_then(|p| self.joined(p)) {
                    self.apart.extend(vals.iter().map(|&v| (v, shape)));
                    out.push((vals, vec![code]));
                    continue;
                }
                self.uses_subgroup = false;
                drop(self.take_bindings());
                shape = None;
            }
            self.apart.extend(vals.iter().map(|&v| (v, shape)));
            for v in vals {
                let codes = self.kernel(v)?;
                out.push((vec![v], codes));
            }
        }
        Ok(out)
    }

    /// Can the kernels of `vals` share a launch (`join`)? Generated to
    /// see, the bindings dropped again.
    fn join_of(&mut self, vals: &[ValueId]) -> R<bool> {
        let ok = self.parts_of(vals)?.as_deref().and_then(join).is_some();
        self.uses_subgroup = false;
        drop(self.take_bindings());
        Ok(ok)
    }

    /// Elementwise kernels sharing a launch (`lower::join_map_launches`),
    /// each computing its group of `units`, and at most one kernel of
    /// another kind (a unit of one value): one kernel, or where their
    /// grids or workgroups cannot be joined, a kernel each (recorded in
    /// `apart` for the next plan). Each with the values it computes.
    pub fn map_launch(&mut self, units: &[&[ValueId]]) -> R<Vec<(Vec<ValueId>, Vec<KernelCode>)>> {
        let (g, s) = (self.g, self.s);
        let map = |unit: &[ValueId]| crate::fusion::is_map(g, s, unit[0]);
        let parts = self.parts_with(units, |gen, unit| {
            if map(unit) {
                gen.map_group(unit).map(drop)
            } else {
                gen.kernel(unit[0]).map(drop)
            }
        })?;
        let all: Vec<ValueId> = units.iter().flat_map(|u| u.iter().copied()).collect();
        if let Some(code) = parts.as_deref().and_then(|p| self.joined(p)) {
            return Ok(vec![(all, vec![code])]);
        }
        self.uses_subgroup = false;
        drop(self.take_bindings());
        self.apart.extend(all.iter().map(|&v| (v, None)));
        units
            .iter()
            .map(|unit| {
                let codes = if map(unit) {
                    vec![self.map_group(unit)?]
                } else {
                    self.kernel(unit[0])?
                };
                Ok((unit.to_vec(), codes))
            })
            .collect()
    }

    /// The parts as one kernel with the bindings generated for them;
    /// `None` (the bindings kept) where they cannot share a launch.
    fn joined(&mut self, parts: &[Part]) -> Option<KernelCode> {
        let k = join(parts)?;
        let subgroup = std::mem::take(&mut self.uses_subgroup);
        let (decls, bindings) = self.take_bindings();
        Some(KernelCode {
            label: k.label,
            wgsl: wgsl::shader(&decls, &k.lines, k.wg, &k.shared, false),
            wgsl_f16: (self.shader_f16 && wgsl::converts_to_f16(&k.lines))
                .then(|| wgsl::shader(&decls, &k.lines, k.wg, &k.shared, true)),
            grid: k.grid,
            bindings,
            subgroup,
        })
    }

    /// Each value's kernel body, generated as if alone with the bindings
    /// of all kept for one launch; `None` unless each is one kernel.
    fn parts_of(&mut self, vals: &[ValueId]) -> R<Option<Vec<Part>>> {
        self.parts_with(vals, |gen, &v| gen.kernel(v).map(drop))
    }

    /// The kernel body `generate` makes of each of `items`, kept as parts
    /// with the bindings of all; `None` unless each is one kernel.
    fn parts_with<T>(
        &mut self,
        items: &[T],
        mut generate: impl FnMut(&mut Self, &T) -> R<()>,
    ) -> R<Option<Vec<Part>>> {
        self.parts = Some(vec![]);
        let mut generated = Ok(());
        for item in items {
            generated = generate(self, item);
            if generated.is_err() {
                break;
            }
        }
        let parts = self.parts.take().unwrap_or_default();
        generated?;
        Ok((parts.len() == items.len()).then_some(parts))
    }
}
