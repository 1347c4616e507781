//! Elementwise kernels: one kernel computing several values of one
//! shape (later ones reading earlier ones from registers), packed bool
//! and f16 outputs a word per invocation.

use super::*;

impl Gen<'_> {
    /// Whether elementwise value `v` can join the fused kernel computing
    /// `group` (same shape; reads group members only at its own index).
    pub fn fits_group(&mut self, group: &[ValueId], v: ValueId) -> bool {
        let Some(&first) = group.first() else {
            return true;
        };
        let g = self.g;
        let Def::Node(n, k) = g.values[v].def else {
            return false;
        };
        if g.meta(first).sizes != g.meta(v).sizes
            || self.s.inplace.contains_key(&v)
            || self.s.inplace.contains_key(&first)
        {
            return false;
        }
        let saved = (
            std::mem::take(&mut self.body),
            std::mem::take(&mut self.memo),
            std::mem::take(&mut self.shared),
            std::mem::take(&mut self.slots),
        );
        self.group = group.to_vec();
        for &m in group {
            self.memo.insert((m, "gid".into()), "0".into());
        }
        let ok = self.node_at(n, k, "gid").is_ok();
        self.group.clear();
        (self.body, self.memo, self.shared, self.slots) = saved;
        ok
    }

    /// Does computing `v` read the buffer of `root` only at the
    /// invocation's own index?
    pub fn reads_only_at_own_index(&mut self, v: ValueId, root: ValueId) -> bool {
        let Def::Node(n, k) = self.g.values[v].def else {
            return false;
        };
        let saved = (
            std::mem::take(&mut self.body),
            std::mem::take(&mut self.memo),
            std::mem::take(&mut self.shared),
            std::mem::take(&mut self.slots),
        );
        self.group = vec![root];
        self.memo.insert((root, "gid".into()), "0".into());
        let ok = self.node_at(n, k, "gid").is_ok();
        self.group.clear();
        (self.body, self.memo, self.shared, self.slots) = saved;
        ok
    }

    /// One kernel computing every value of `group` (elementwise values of
    /// one shape): inputs are read once, and later members read earlier
    /// ones from registers. With packed outputs each invocation computes
    /// the elements of whole words (4 per bool word, 2 per f16 word), so
    /// no two invocations write one word.
    pub fn map_group(&mut self, group: &[ValueId]) -> R<KernelCode> {
        let g = self.g;
        let count = g.meta(group[0]).numel();
        let packed: Vec<(ValueId, Loc)> = group
            .iter()
            .filter_map(|&v| self.locs.get(&v).filter(|l| l.packed).map(|l| (v, *l)))
            .collect();
        let lanes = packed
            .iter()
            .map(|(v, _)| wgsl::per_word(g.meta(*v).dtype))
            .max()
            .unwrap_or(1);
        self.body.stmt(format!(
            "if (gid >= {}) {{ return; }}",
            u(count.div_ceil(lanes))
        ));
        // One accumulator per packed output word this invocation writes.
        let mut acc: HashMap<ValueId, Vec<String>> = HashMap::new();
        for (v, _) in &packed {
            let per = wgsl::per_word(g.meta(*v).dtype);
            let words = (0..lanes / per)
                .map(|_| self.body.var("u32", "0u".into()))
                .collect();
            acc.insert(*v, words);
        }
        for lane in 0..lanes {
            let idx = if lanes == 1 {
                "gid".to_string()
            } else {
                self.body
                    .bind("u32", format!("gid * {} + {}", u(lanes), u(lane)))
            };
            self.own = idx.clone();
            for &v in group {
                let Def::Node(n, k) = g.values[v].def else {
                    return Err(bug("a kernel for an input"));
                };
                let x = self.node_at(n, k, &idx)?;
                match acc.get(&v) {
                    Some(words) => {
                        let per = wgsl::per_word(g.meta(v).dtype);
                        let w = &words[lane / per];
                        let bits = wgsl::pack_lane(g.meta(v).dtype, &x, lane % per);
                        self.body.stmt(format!("{w} = {w} | {bits};"));
                    }
                    None if self.registers.contains(&v) => {}
                    // Lanes past the end compute garbage and store nothing.
                    None if lanes > 1 => {
                        let (slot, _) = self.slot_of(v, true)?;
                        let st = store(&slot, &idx, g.meta(v).dtype, &x);
                        self.body
                            .stmt(format!("if ({idx} < {}) {{ {st} }}", u(count)));
                    }
                    None => self.store_to(v, &idx, &x)?,
                }
                self.memo.insert((v, idx.clone()), x);
            }
        }
        self.own = "gid".into();
        for (v, _) in &packed {
            let per = wgsl::per_word(g.meta(*v).dtype);
            let total = wgsl::words(g.meta(*v).dtype, count, true);
            let (slot, _) = self.slot_of(*v, true)?;
            for (i, w) in acc[v].iter().enumerate() {
                let at = self
                    .body
                    .bind("u32", format!("gid * {} + {}", u(lanes / per), u(i)));
                let st = slot.set_word(&at, w);
                self.body
                    .stmt(format!("if ({at} < {}) {{ {st} }}", u(total)));
            }
        }
        let label = group
            .iter()
            .map(|&v| g.values[v].name.clone().unwrap_or_default())
            .collect::<Vec<_>>()
            .join("+");
        Ok(self.finish(
            label,
            wgsl::grid(count.div_ceil(lanes), self.workgroup),
            [self.workgroup, 1, 1],
        ))
    }

    pub(super) fn map_kernel(
        &mut self,
        v: ValueId,
        label: String,
        f: impl FnOnce(&mut Self, &str) -> R<String>,
    ) -> R<KernelCode> {
        let n = self.meta(v).numel();
        self.body
            .stmt(format!("if (gid >= {}) {{ return; }}", u(n)));
        let x = f(self, "gid")?;
        self.store_to(v, "gid", &x)?;
        Ok(self.finish(label, wgsl::grid(n, self.workgroup), [self.workgroup, 1, 1]))
    }
}
