//! Gathers: `embedding` and `index_select`.

use super::*;

impl Gen<'_> {
    pub(super) fn gather(&mut self, n: NodeId, v: ValueId, label: String) -> R<KernelCode> {
        let g = self.g;
        let node = &g.nodes[n];
        let om = g.meta(v).clone();
        let count = om.numel();
        self.guard(count);
        let (src, idx, dim) = match node.op.name() {
            "embedding" => (
                *node.args[0].tensors()[0],
                *node.args[1].tensors()[0],
                0usize,
            ),
            _ => {
                let s = *node.args[0].tensors()[0];
                let d = match node.args[1] {
                    Arg::Int(d) => {
                        kiln_functionalize::meta::wrap_dim(d, g.meta(s).dim()).map_err(bug)?
                    }
                    _ => return Err(bug("index_select dim")),
                };
                (s, *node.args[2].tensors()[0], d)
            }
        };
        let sm = g.meta(src).clone();
        let sizes = &sm.sizes;
        let (outer, len, inner) = if sizes.is_empty() {
            (1, 1, 1)
        } else {
            (
                sizes[..dim].iter().product::<usize>(),
                sizes[dim],
                sizes[dim + 1..].iter().product::<usize>(),
            )
        };
        let nidx = g.meta(idx).numel();
        // out = [outer, nidx, inner]
        let o = self.body.bind("u32", format!("gid / {}", u(nidx * inner)));
        let p = self
            .body
            .bind("u32", format!("(gid / {}) % {}", u(inner), u(nidx)));
        let q = self.body.bind("u32", format!("gid % {}", u(inner)));
        let iv = self.value_at(idx, &p)?;
        let iv = self
            .body
            .bind("i32", cast(&iv, g.meta(idx).dtype, DType::I32));
        self.flag_index(n, &iv, len, false)?;
        let r = self.body.bind(
            "u32",
            format!("u32(clamp({iv}, 0i, {}i))", len.max(1) as i32 - 1),
        );
        let at = self.body.bind(
            "u32",
            format!("({o} * {} + {r}) * {} + {q}", u(len), u(inner)),
        );
        let _ = outer;
        let x = self.value_at(src, &at)?;
        self.store_to(v, "gid", &x)?;
        Ok(self.finish(
            label,
            wgsl::grid(count, self.workgroup),
            [self.workgroup, 1, 1],
        ))
    }
}
