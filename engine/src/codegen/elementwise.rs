//! Elementwise kernels: one kernel computing several values of one
//! shape (later ones reading earlier ones from registers), packed bool
//! and f16 outputs a word per invocation.

use super::*;

impl Gen<'_> {
    /// One kernel computing every value of `group` (elementwise values of
    /// one shape): inputs are read once, and later members read earlier
    /// ones from registers. With packed outputs each invocation computes
    /// the elements of whole words (4 per bool word, 2 per f16 word), so
    /// no two invocations write one word.
    pub fn map_group(&mut self, group: &[ValueId]) -> R<KernelCode> {
        // Codegen's own check of what `index::fits_group` decided: members are
        // read only at the invocation's element.
        self.group = group.to_vec();
        let k = self.map_group_inner(group);
        self.group.clear();
        k
    }

    fn map_group_inner(&mut self, group: &[ValueId]) -> R<KernelCode> {
        if self.vectorize {
            if let Some(k) = self.map_group_vec4(group)? {
                return Ok(k);
            }
        }
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
        self.guard(count.div_ceil(lanes));
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

    /// `map_group` four elements an invocation, with the tensors the plan
    /// chose (`lower::vec4_ranges`: read and written only at those
    /// elements) bound as `vec4<u32>`: one 16-byte load or store instead
    /// of four. `None` when the plan chose none.
    fn map_group_vec4(&mut self, group: &[ValueId]) -> R<Option<KernelCode>> {
        if self.vec4_ranges.is_empty() {
            return Ok(None);
        }
        let g = self.g;
        let count = g.meta(group[0]).numel();
        self.vec4_body(group, count)?;
        let label = group
            .iter()
            .map(|&v| g.values[v].name.clone().unwrap_or_default())
            .collect::<Vec<_>>()
            .join("+");
        Ok(Some(self.finish(
            label,
            wgsl::grid(count / 4, self.workgroup),
            [self.workgroup, 1, 1],
        )))
    }

    /// The body of `map_group_vec4`.
    fn vec4_body(&mut self, group: &[ValueId], count: usize) -> R<()> {
        let g = self.g;
        self.guard(count / 4);
        let idx: Vec<String> = (0..4)
            .map(|l| self.body.bind("u32", format!("gid * 4u + {}", u(l))))
            .collect();
        for (l, i) in idx.iter().enumerate() {
            self.vec.lanes.insert(i.clone(), l);
        }
        let mut words: HashMap<ValueId, (String, Vec<String>)> = HashMap::new();
        for i in &idx {
            self.own = i.clone();
            for &v in group {
                let Def::Node(n, k) = g.values[v].def else {
                    return Err(bug("a kernel for an input"));
                };
                let x = self.node_at(n, k, i)?;
                if !self.registers.contains(&v) {
                    let (slot, _) = self.slot_of(v, true)?;
                    let d = g.meta(v).dtype;
                    if self.vec.slots.contains(&slot.var) {
                        let w = self.body.bind("u32", wgsl::word(d, &x));
                        words.entry(v).or_insert((slot.var, vec![])).1.push(w);
                    } else {
                        self.body.stmt(store(&slot, i, d, &x));
                    }
                }
                self.memo.insert((v, i.clone()), x);
            }
        }
        self.own = "gid".into();
        for &v in group {
            if let Some((var, w)) = words.get(&v) {
                self.body
                    .stmt(format!("{var}[gid] = vec4<u32>({});", w.join(", ")));
            }
        }
        Ok(())
    }

    pub(super) fn map_kernel(
        &mut self,
        v: ValueId,
        label: String,
        f: impl FnOnce(&mut Self, &str) -> R<String>,
    ) -> R<KernelCode> {
        let n = self.meta(v).numel();
        self.guard(n);
        let x = f(self, "gid")?;
        self.store_to(v, "gid", &x)?;
        Ok(self.finish(label, wgsl::grid(n, self.workgroup), [self.workgroup, 1, 1]))
    }
}
