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

/// An elementwise kernel of blocks of 4 columns and 4 or 8 rows
/// (`Gen::map_group_blocked`).
pub(crate) struct Blocks {
    /// The result as the views see it: matrices of `rows` x `cols`.
    rows: usize,
    cols: usize,
    /// (node, result) of each transposing view copy, and its stored source.
    views: Vec<(NodeId, usize, ValueId)>,
}

impl Blocks {
    /// The stored sources read four rows at a time (bound as vectors).
    pub(crate) fn sources(&self) -> impl Iterator<Item = ValueId> + '_ {
        self.views.iter().map(|&(_, _, src)| src)
    }
}

/// The 4x4 blocks of `group` (an elementwise kernel of one shape, its
/// matrices `rows` x `cols` by its two innermost dims, both multiples of
/// 4), where they serve a transposing view copy it reads at its own
/// element or a stored row it broadcasts down the rows. Views served:
/// those whose source, a 32-bit tensor of its own buffer range, is read
/// with stride 1 down the result's rows, along the result's columns as a
/// dim of its own, and at multiples of 4 otherwise, so the four rows of a
/// block's column are an aligned quad of the source. Other views are read
/// as usual. Decided here for both the plan (`lower::vec4_ranges` binds
/// the sources as vectors) and the code.
pub(crate) fn transposed_blocks(
    g: &Graph,
    s: &Schedule,
    locs: &HashMap<ValueId, Loc>,
    group: &[ValueId],
) -> Option<Blocks> {
    let sizes = &g.meta(*group.first()?).sizes;
    let d = sizes.len();
    let (rows, cols) = (sizes[d.checked_sub(2)?], sizes[d - 1]);
    if group.iter().any(|&v| g.meta(v).sizes != *sizes)
        || !rows.is_multiple_of(4)
        || !cols.is_multiple_of(4)
    {
        return None;
    }
    let overlaps = |a: &Loc, an: usize, b: &Loc, bn: usize| {
        a.buf == b.buf && a.word < b.word + bn && b.word < a.word + an
    };
    let mut views = vec![];
    for (n, k) in crate::index::own_view_copies(g, s, group) {
        let node = &g.nodes[n];
        let (Rule::ViewCopy(view), Some(&Arg::Tensor(input))) =
            (&node.op.def().rule, node.args.first())
        else {
            continue;
        };
        let Ok(a) = Affine::view(g, *view, g.meta(input), &node.args[1..], k) else {
            continue;
        };
        let a = a.simplified();
        let e = a.sizes.len();
        if e < 2 || a.strides[e - 1] <= 1 {
            // Not transposing: its quads are read as vectors as they are.
            continue;
        }
        let aligned = a.sizes[e - 1] == cols
            && a.strides[e - 2] == 1
            && a.sizes[e - 2].is_multiple_of(4)
            && a.offset.is_multiple_of(4)
            && a.strides[..e - 2].iter().all(|st| st.is_multiple_of(4))
            && a.strides[e - 1].is_multiple_of(4);
        let Some(loc) = locs.get(&input) else {
            continue;
        };
        let words = g.meta(input).numel();
        let own_range = !loc.packed
            && wgsl::per_word(g.meta(input).dtype) == 1
            && !group.iter().any(|v| {
                locs.get(v)
                    .is_some_and(|l| overlaps(l, g.meta(*v).numel(), loc, words))
            });
        if aligned && own_range {
            views.push((n, k, input));
        }
    }
    // Without a transposing view, blocks still pay where a stored row is
    // broadcast down the rows: one vector load for the block's four rows.
    let broadcast = || {
        crate::index::own_stored_reads(g, s, group)
            .iter()
            .any(|(_, a)| !a.is_identity() && a.keeps_quads() && row_step(a, cols, 4) == Some(0))
    };
    (!views.is_empty() || broadcast()).then_some(Blocks { rows, cols, views })
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
        // Blocks pay only through vector loads: none in a shared launch.
        if self.vectorize && self.transpose_blocks && !packs && !self.vec4_ranges.is_empty() {
            if let Some(b) = transposed_blocks(self.g, self.s, self.locs, group) {
                let vec4 = |v: ValueId| {
                    self.locs.get(&v).is_some_and(|l| {
                        self.vec4_ranges
                            .contains(&(l.buf, l.word, self.g.meta(v).numel()))
                    })
                };
                if b.sources().all(vec4) {
                    return self.map_group_blocked(group, b);
                }
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
        self.guard(count / 4);
        let idx: Vec<String> = (0..4)
            .map(|l| self.body.bind("u32", format!("gid * 4u + {}", u(l))))
            .collect();
        self.vec.top = self.depth();
        self.vec4_quad(group, "gid", &idx)
    }

    /// `map_group` in blocks of 4 columns and 4 or 8 rows of the result's
    /// matrices (`blocks`): an invocation computes the block's rows in turn
    /// as `map_group_vec4` computes a quad, reading each transposing view's
    /// rows of a column from one vector load of its source a quad of rows
    /// (`block_view_at`), and a row broadcast down the rows once.
    fn map_group_blocked(&mut self, group: &[ValueId], blocks: Blocks) -> R<KernelCode> {
        let count = self.g.meta(group[0]).numel();
        let Blocks { rows, cols, views } = blocks;
        // Transposing: blocks of 8 rows where they fit (two quads of each
        // source column), consecutive invocations down the rows (so
        // neighbouring lanes read neighbouring quads of the source's
        // rows). lavapipe, 4096 x 4096 chain: 58-81 ms in 4x4 blocks along
        // the rows, 34-63 ms so; the plain chain 41-54 ms.
        let transposing = !views.is_empty();
        let h = if transposing && rows.is_multiple_of(8) {
            8
        } else {
            4
        };
        let invocations = count / (4 * h);
        self.guard(invocations);
        let (across, down) = (cols / 4, rows / h);
        let (cb, rb) = if transposing {
            let rb = self.body.bind("u32", format!("gid % {}", u(down)));
            let cb = self
                .body
                .bind("u32", format!("(gid / {}) % {}", u(down), u(across)));
            (cb, rb)
        } else {
            let cb = self.body.bind("u32", format!("gid % {}", u(across)));
            let rb = self
                .body
                .bind("u32", format!("(gid / {}) % {}", u(across), u(down)));
            (cb, rb)
        };
        let m = self.body.bind("u32", format!("gid / {}", u(across * down)));
        let base = self.body.bind(
            "u32",
            format!(
                "{m} * {} + {rb} * {} + {cb} * 4u",
                u(rows * cols),
                u(h * cols)
            ),
        );
        let elems: Vec<Vec<String>> = (0..h)
            .map(|i| {
                (0..4)
                    .map(|j| {
                        let off = i * cols + j;
                        if off == 0 {
                            base.clone()
                        } else {
                            self.body.bind("u32", format!("{base} + {}", u(off)))
                        }
                    })
                    .collect()
            })
            .collect();
        let quads: Vec<String> = (0..h)
            .map(|i| {
                self.body
                    .bind("u32", format!("({base} >> 2u) + {}", u(i * cols / 4)))
            })
            .collect();
        self.vec.top = self.depth();
        let mut at = HashMap::new();
        for (i, row) in elems.iter().enumerate() {
            for (j, e) in row.iter().enumerate() {
                at.insert(e.clone(), (i, j));
            }
        }
        self.vec.block = Some(super::BlockState {
            at,
            quad_rows: (0..h).step_by(4).map(|i| elems[i].clone()).collect(),
            cols,
            height: h,
            views: views.iter().map(|&(n, k, src)| ((n, k), src)).collect(),
        });
        let mut done = Ok(());
        for (q, row) in quads.iter().zip(&elems) {
            done = self.vec4_quad(group, q, row);
            if done.is_err() {
                break;
            }
        }
        self.vec.block = None;
        done?;
        let label = self.group_label(group);
        Ok(self.finish(
            label,
            wgsl::grid(invocations, self.workgroup),
            [self.workgroup, 1, 1],
        ))
    }

    /// Element `idx` of transposing view copy (`n`, `k`) in a kernel of
    /// blocks: its lane of the source's quad under the block's column and
    /// quad of rows (one vector load for four rows). `None` elsewhere (or
    /// where a branch would hide the load from later rows): read as usual.
    pub(super) fn block_view_at(&mut self, n: NodeId, k: usize, idx: &str) -> R<Option<String>> {
        let Some(b) = &self.vec.block else {
            return Ok(None);
        };
        let (Some(&(row, col)), Some(&src)) = (b.at.get(idx), b.views.get(&(n, k))) else {
            return Ok(None);
        };
        let quad_row = b.quad_rows[row / 4][col].clone();
        if self.depth() != self.vec.top {
            return Ok(None);
        }
        let g = self.g;
        let node = &g.nodes[n];
        let Rule::ViewCopy(view) = node.op.def().rule else {
            return Err(bug("a blocked view that is no view copy"));
        };
        let a = Affine::view(g, view, g.meta(src), &node.args[1..], k).map_err(bug)?;
        let (slot, loc) = self.slot_of(src, false)?;
        if !slot.vec4 || slot.chunk.is_some() || slot.atomic || loc.packed {
            return Ok(None);
        }
        // Rows 4..7 of the block: the next quad down the source's row.
        let first = self.quad_first(&a, &quad_row);
        let w = self.quad_word(&slot, &first, row % 4);
        let d = g.meta(src).dtype;
        Ok(Some(self.body.bind(ty(d), wgsl::from_word(d, &w))))
    }

    /// The members of `group` at the four elements `idx` of the result's
    /// aligned quad `q` (a vector index), reading and storing the buffers
    /// bound as vectors one vector each.
    fn vec4_quad(&mut self, group: &[ValueId], q: &str, idx: &[String]) -> R<()> {
        let g = self.g;
        self.vec.lanes = idx
            .iter()
            .enumerate()
            .map(|(l, i)| (i.clone(), l))
            .collect();
        self.vec.quad = q.to_string();
        self.vec.loaded.clear();
        let mut words: HashMap<ValueId, (String, Vec<String>)> = HashMap::new();
        for i in idx {
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
                    .stmt(format!("{var}[{q}] = vec4<u32>({});", w.join(", ")));
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
