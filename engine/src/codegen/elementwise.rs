//! Elementwise kernels: one kernel computing several values of one
//! shape (later ones reading earlier ones from registers), packed bool
//! and f16 outputs a word per invocation.

use super::*;

/// A result tiled for transposing reads (`Gen::transposed_tile`).
pub(super) struct Tile {
    /// The result's shape as the views see it (`Affine::simplified`).
    sizes: Vec<usize>,
    /// The dimension along which the views read their sources' rows.
    row: usize,
    /// (node, result, index map, source) of each view.
    views: Vec<(NodeId, usize, Affine, ValueId)>,
}

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
        let packs = group
            .iter()
            .any(|v| self.locs.get(v).is_some_and(|l| l.packed));
        if self.tile_transposes && !packs {
            if let Some(tile) = self.transposed_tile(group) {
                return self.map_group_tiled(group, tile);
            }
        }
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
            let mut members = vec![];
            for &v in group {
                let Def::Node(n, k) = g.values[v].def else {
                    return Err(bug("a kernel for an input"));
                };
                let x = self.node_at(n, k, &idx)?;
                self.memo.insert((v, idx.clone()), x.clone());
                members.push((v, x));
            }
            for (v, x) in self.stores_last(members) {
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
        let label = self.group_label(group);
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
        let label = self.group_label(group);
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
        self.vec.top = self.depth();
        let mut words: HashMap<ValueId, (String, Vec<String>)> = HashMap::new();
        for i in &idx {
            self.own = i.clone();
            let mut members = vec![];
            for &v in group {
                let Def::Node(n, k) = g.values[v].def else {
                    return Err(bug("a kernel for an input"));
                };
                let x = self.node_at(n, k, i)?;
                self.memo.insert((v, i.clone()), x.clone());
                members.push((v, x));
            }
            for (v, x) in self.stores_last(members) {
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

    /// The transposing view copies `group` reads at its own element
    /// (`index::own_view_copies`) that one tiling serves: stored 32-bit
    /// sources, read along a dimension other than the innermost, both
    /// at least a tile wide.
    fn transposed_tile(&self, group: &[ValueId]) -> Option<Tile> {
        let g = self.g;
        let side = self.transpose_tile;
        let mut tile: Option<Tile> = None;
        for (n, k) in crate::index::own_view_copies(g, self.s, group) {
            let node = &g.nodes[n];
            let (Rule::ViewCopy(view), Some(&Arg::Tensor(input))) =
                (&node.op.def().rule, node.args.first())
            else {
                continue;
            };
            let d = g.meta(input).dtype;
            if self.locs.get(&input).is_none_or(|l| l.packed) || wgsl::per_word(d) != 1 {
                continue;
            }
            let Ok(a) = Affine::view(g, *view, g.meta(input), &node.args[1..], k) else {
                continue;
            };
            let s = a.simplified();
            let Some((&c, &cs)) = s.sizes.last().zip(s.strides.last()) else {
                continue;
            };
            let Some(row) = s.strides.iter().position(|&st| st == 1) else {
                continue;
            };
            if cs <= 1 || c < side || s.sizes[row] < side {
                continue;
            }
            match &mut tile {
                None => {
                    tile = Some(Tile {
                        sizes: s.sizes.clone(),
                        row,
                        views: vec![(n, k, a, input)],
                    })
                }
                Some(t) if t.sizes == s.sizes && t.row == row => t.views.push((n, k, a, input)),
                Some(_) => {}
            }
        }
        let t = tile?;
        // Workgroups: tiles along the columns, the rows, then the rest.
        let rest = numel(&t.sizes) / (t.sizes[t.row] * t.sizes[t.sizes.len() - 1]);
        let fits = |n: usize| n <= 65535;
        (fits(t.sizes[t.row].div_ceil(side))
            && fits(t.sizes[t.sizes.len() - 1].div_ceil(side))
            && fits(rest))
        .then_some(t)
    }

    /// `map_group` over square tiles (`transpose_tile` a side) of the
    /// result (viewed as `tile.sizes`, rows along `tile.row`): each invocation first loads the element of
    /// the transposing views' sources at the transposed position in the
    /// tile, so a row of invocations reads a row of the source; after the
    /// barrier it computes its own element, reading those views from
    /// workgroup memory, and stores along the result's rows.
    fn map_group_tiled(&mut self, group: &[ValueId], tile: Tile) -> R<KernelCode> {
        let g = self.g;
        let side = self.transpose_tile;
        self.vec4_ranges.clear();
        let Tile { sizes, row, views } = tile;
        let last = sizes.len() - 1;
        let (rows, cols) = (sizes[row], sizes[last]);
        let others: Vec<usize> = (0..sizes.len())
            .filter(|&d| d != row && d != last)
            .collect();
        let rest: Vec<String> = {
            let os: Vec<usize> = others.iter().map(|&d| sizes[d]).collect();
            self.unravel("wid.z", &os)
        };
        let strides = contiguous_strides(&sizes);
        let element = |gen: &mut Self, r: &str, c: &str| {
            let mut m = vec!["0u".to_string(); sizes.len()];
            for (&d, x) in others.iter().zip(&rest) {
                m[d] = x.clone();
            }
            m[row] = r.to_string();
            m[last] = c.to_string();
            gen.ravel(&m, &strides, 0)
        };
        // Workgroups of `self.workgroup` invocations: `side` wide, each
        // invocation handling `per` rows of the tile (CPU adapters: 16x4,
        // GPUs: 32x8, four rows each).
        let high = (self.workgroup as usize / side).clamp(1, side);
        let per = side / high;
        let t = u(side);
        let r0 = self.body.bind("u32", format!("wid.y * {t}"));
        let c0 = self.body.bind("u32", format!("wid.x * {t}"));
        let mut tiles = HashMap::new();
        for (i, (n, k, _, input)) in views.iter().enumerate() {
            tiles.insert((*n, *k), format!("tile{i}"));
            self.shared.push(format!(
                "var<workgroup> tile{i}: array<{}, {}>;",
                ty(g.meta(*input).dtype),
                side * (side + 1)
            ));
        }
        // The transposed positions, clamped into the result: every
        // invocation reaches the barrier.
        let rt = self
            .body
            .bind("u32", format!("min({r0} + lid.x, {})", u(rows - 1)));
        for j in 0..per {
            let ty_ = self.body.bind("u32", format!("lid.y + {}", u(j * high)));
            let ct = self
                .body
                .bind("u32", format!("min({c0} + {ty_}, {})", u(cols - 1)));
            let at = element(self, &rt, &ct);
            for (i, (_, _, a, input)) in views.iter().enumerate() {
                let src = self.index_at(a, &at);
                let x = self.value_at(*input, &src)?;
                self.body
                    .stmt(format!("tile{i}[lid.x * {} + {ty_}] = {x};", u(side + 1)));
            }
        }
        self.body.stmt("workgroupBarrier();".into());
        let c = self.body.bind("u32", format!("{c0} + lid.x"));
        self.tiles = tiles;
        let mut computed = Ok(());
        for j in 0..per {
            // Rows grow with `j`: past the end, so are the later ones.
            let ty_ = self.body.bind("u32", format!("lid.y + {}", u(j * high)));
            let r = self.body.bind("u32", format!("{r0} + {ty_}"));
            self.body.stmt(format!(
                "if ({r} >= {} || {c} >= {}) {{ return; }}",
                u(rows),
                u(cols)
            ));
            let e = element(self, &r, &c);
            self.tile_at = format!("{ty_} * {} + lid.x", u(side + 1));
            computed = self.members_at(group, &e);
            if computed.is_err() {
                break;
            }
        }
        self.tiles.clear();
        self.own = "gid".into();
        computed?;
        let label = self.group_label(group);
        let grid = [
            cols.div_ceil(side) as u32,
            rows.div_ceil(side) as u32,
            (numel(&sizes) / (rows * cols)) as u32,
        ];
        Ok(self.finish(label, grid, [side as u32, high as u32, 1]))
    }

    /// A multi-output kernel's label: its members' names.
    fn group_label(&self, group: &[ValueId]) -> String {
        group
            .iter()
            .map(|&v| self.g.values[v].name.clone().unwrap_or_default())
            .collect::<Vec<_>>()
            .join("+")
    }

    /// Each member of `group` at element `e` (a tiled group's, or those a
    /// reduction folds, `Gen::prologue`): computed, the stored ones stored.
    pub(super) fn members_at(&mut self, group: &[ValueId], e: &str) -> R<()> {
        self.own = e.to_string();
        let mut members = vec![];
        for &v in group {
            let Def::Node(n, k) = self.g.values[v].def else {
                return Err(bug("a kernel for an input"));
            };
            let x = self.node_at(n, k, e)?;
            self.memo.insert((v, e.to_string()), x.clone());
            members.push((v, x));
        }
        for (v, x) in self.stores_last(members) {
            if !self.registers.contains(&v) {
                self.store_to(v, e, &x)?;
            }
        }
        Ok(())
    }

    /// The members of one element in the order their stores go: members
    /// written into a buffer another member reads (a dying input,
    /// `lower::reuse_dying_inputs`) last, once every member has loaded it.
    fn stores_last(&self, mut members: Vec<(ValueId, String)>) -> Vec<(ValueId, String)> {
        members.sort_by_key(|(v, _)| self.s.alias_of.contains_key(v));
        members
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
