//! Custom functions' own kernels (`kiln_functionalize::custom::GpuKernel`):
//! the user's WGSL behind accessors Kiln generates for its operands (read
//! as any consumer reads, producers inlined) and outputs (stored into the
//! planned buffer), one dispatch per output.

use super::*;

impl Gen<'_> {
    pub(super) fn custom(&mut self, n: NodeId, v: ValueId, label: String) -> R<KernelCode> {
        let g = self.g;
        let node = &g.nodes[n];
        let def = node.op.def();
        let f = def
            .custom
            .clone()
            .ok_or_else(|| bug("a custom op without its function"))?;
        let metas: Vec<Arg<&Meta>> = node
            .args
            .iter()
            .map(|a| a.map(&mut |x| g.meta(*x)))
            .collect();
        let outs: Vec<Meta> = node.results.iter().map(|&r| g.meta(r).clone()).collect();
        let kernel = f.wgsl(&metas, &outs).ok_or_else(|| {
            CompileError::no_kernel(format!(
                "custom function `{}` has no GPU kernel (give it `wgsl`), or run with the reference backend",
                def.name
            ))
        })?;
        // Accessors, each generated in a body of its own.
        let tensors: Vec<ValueId> = node
            .args
            .iter()
            .flat_map(|a| a.tensors().into_iter().copied().collect::<Vec<_>>())
            .collect();
        for (j, &t) in tensors.iter().enumerate() {
            // Only what the kernel reads is bound (pipelines leave unused
            // bindings out of their layout).
            if !kernel.source.contains(&format!("kiln_in{j}(")) {
                continue;
            }
            let (body, memo) = (
                std::mem::take(&mut self.body),
                std::mem::take(&mut self.memo),
            );
            let x = self.value_at(t, "i")?;
            let lines = std::mem::replace(&mut self.body, body).lines;
            self.memo = memo;
            self.shared.push(format!(
                "fn kiln_in{j}(i: u32) -> {} {{\n    {}\n    return {x};\n}}",
                ty(g.meta(t).dtype),
                lines.join("\n    ")
            ));
        }
        for (k, &r) in node.results.iter().enumerate() {
            let t = ty(g.meta(r).dtype);
            if r == v && !kernel.source.contains(&format!("kiln_out{k}(")) {
                return Err(CompileError::no_kernel(format!(
                    "custom function `{}`: its kernel never writes output {k} (kiln_out{k})",
                    def.name
                )));
            }
            if r != v {
                self.shared
                    .push(format!("fn kiln_out{k}(i: u32, x: {t}) {{}}"));
                continue;
            }
            let (body, memo) = (
                std::mem::take(&mut self.body),
                std::mem::take(&mut self.memo),
            );
            self.store_to(v, "i", "x")?;
            let lines = std::mem::replace(&mut self.body, body).lines;
            self.memo = memo;
            self.shared.push(format!(
                "fn kiln_out{k}(i: u32, x: {t}) {{\n    {}\n}}",
                lines.join("\n    ")
            ));
        }
        self.shared.push(kernel.source.clone());
        self.body.stmt(format!(
            "if (gid >= {}) {{ return; }}",
            u(kernel.invocations)
        ));
        self.body.stmt("kiln_kernel(gid);".into());
        Ok(self.finish(
            label,
            wgsl::grid(kernel.invocations, self.workgroup),
            [self.workgroup, 1, 1],
        ))
    }
}
