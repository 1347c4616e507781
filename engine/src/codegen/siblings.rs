//! Sibling products as one kernel: products reading the same left operand
//! with the same rows (a transformer's Q, K and V projections), each with
//! its own epilogue, launched as one grid whose workgroups pick their
//! product by `wid.x` (`lower::group_kernels` groups them). One launch
//! instead of three, and the shared operand's tiles read while they are
//! still in cache.

use super::*;

/// One product's kernel body, generated as if alone.
pub(super) struct Part {
    pub(super) label: String,
    pub(super) grid: [u32; 3],
    pub(super) wg: [u32; 3],
    pub(super) lines: Vec<String>,
    pub(super) shared: Vec<String>,
}

/// The name a workgroup-memory declaration declares.
fn shared_name(decl: &str) -> &str {
    decl.split('>')
        .nth(1)
        .and_then(|r| r.split(':').next())
        .unwrap_or(decl)
        .trim()
}

/// The parts as one kernel: workgroup `wid.x` of the joined grid runs the
/// part whose columns it falls in, with `wid` shadowed by its place in that
/// part's grid (uniform: barriers stay legal). `None` where they cannot
/// share a launch: other workgroup shapes, rows or batches, workgroup
/// memory declared differently under one name, a body reading the grid's
/// size, or too wide a grid.
fn join(parts: &[Part]) -> Option<Part> {
    let first = parts.first()?;
    let mut shared: Vec<String> = vec![];
    let mut lines = vec![];
    let mut end = 0u32;
    for (i, p) in parts.iter().enumerate() {
        if p.wg != first.wg
            || p.grid[1..] != first.grid[1..]
            || p.lines.iter().any(|l| l.contains("nwg"))
        {
            return None;
        }
        for d in &p.shared {
            match shared.iter().find(|s| shared_name(s) == shared_name(d)) {
                Some(s) if s != d => return None,
                Some(_) => {}
                None => shared.push(d.clone()),
            }
        }
        let start = end;
        end = end.checked_add(p.grid[0])?;
        lines.push(match i {
            0 => format!("if (wid.x < {end}u) {{"),
            _ if i + 1 == parts.len() => "} else {".to_string(),
            _ => format!("}} else if (wid.x < {end}u) {{"),
        });
        if start > 0 {
            lines.push(format!(
                "let wid = vec3<u32>(wid.x - {start}u, wid.y, wid.z);"
            ));
        }
        lines.extend(p.lines.iter().cloned());
    }
    lines.push("}".into());
    let label = parts
        .iter()
        .map(|p| p.label.as_str())
        .collect::<Vec<_>>()
        .join(" | ");
    (end <= 65535).then_some(Part {
        label,
        grid: [end, first.grid[1], first.grid[2]],
        wg: first.wg,
        lines,
        shared,
    })
}

impl Gen<'_> {
    /// The kernel computing the sibling products (or their epilogue tails)
    /// `grp`, two or more, or where they cannot share a launch, a kernel
    /// each (generated again: the joined attempt's bindings are dropped).
    pub fn siblings(&mut self, grp: &[ValueId]) -> R<Vec<KernelCode>> {
        self.parts = Some(vec![]);
        let mut generated = Ok(());
        for &v in grp {
            generated = self.kernel(v).map(drop);
            if generated.is_err() {
                break;
            }
        }
        let parts = self.parts.take().unwrap_or_default();
        let subgroup = std::mem::take(&mut self.uses_subgroup);
        let joined = (parts.len() == grp.len()).then(|| join(&parts)).flatten();
        match (generated, joined) {
            (Ok(()), Some(k)) => {
                let (decls, bindings) = self.take_bindings();
                Ok(vec![KernelCode {
                    label: k.label,
                    wgsl: wgsl::shader(&decls, &k.lines, k.wg, &k.shared),
                    grid: k.grid,
                    bindings,
                    subgroup,
                }])
            }
            (generated, _) => {
                // Start again from a clean slate: a kernel each.
                drop(self.take_bindings());
                generated?;
                let mut out = vec![];
                for &v in grp {
                    out.extend(self.kernel(v)?);
                }
                Ok(out)
            }
        }
    }
}
