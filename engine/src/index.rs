//! Index maps: how element `i` of an inlined op's result reads its
//! operands. One description serves the code generator (which emits it as
//! WGSL arithmetic), the scatter race check (which evaluates it for each
//! invocation) and fusion legality (which asks whether a chain of maps is
//! the identity, i.e. whether a kernel reads a value only at the element
//! it computes).

use crate::fusion::Schedule;
use kiln_functionalize::graph::{Def, Graph, NodeId, ValueId};
use kiln_functionalize::meta::{broadcast_strides, contiguous_strides, wrap_dim, Meta};
use kiln_functionalize::ops::args::ArgsExt;
use kiln_functionalize::ops::{self, Elem, Lowering, RegionKind, Rule};
use kiln_functionalize::schema::Arg;
use std::collections::HashMap;

/// `offset + Σ_d m_d * strides_d` where `m` is flat index `i` unravelled
/// row-major over `sizes`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Affine {
    pub sizes: Vec<usize>,
    pub strides: Vec<usize>,
    pub offset: usize,
}

impl Affine {
    pub fn identity(sizes: &[usize]) -> Affine {
        Affine {
            sizes: sizes.to_vec(),
            strides: contiguous_strides(sizes),
            offset: 0,
        }
    }

    /// Element `i` of `out` reads `operand` (broadcast to `out`) here.
    pub fn broadcast(out: &[usize], operand: &Meta) -> Affine {
        if operand.sizes[..] == out[..] {
            return Affine::identity(out);
        }
        let st = broadcast_strides(&Meta::contiguous(operand.dtype, operand.sizes.clone()), out);
        Affine {
            sizes: out.to_vec(),
            strides: st.into_vec(),
            offset: 0,
        }
    }

    /// Result `k` of view op `view` (with `args` after the tensor) over a
    /// contiguous tensor of `base`'s shape.
    pub fn view(
        g: &Graph,
        view: ops::OpId,
        base: &Meta,
        args: &[Arg<ValueId>],
        k: usize,
    ) -> Result<Affine, String> {
        let cm = Meta::contiguous(base.dtype, base.sizes.clone());
        let mut va: Vec<Arg<&Meta>> = vec![Arg::Tensor(&cm)];
        va.extend(args.iter().map(|a| a.map(&mut |v| g.meta(*v))));
        let mut metas = ops::infer(view, &va)?;
        if k >= metas.len() {
            return Err(format!("{} has no result {k}", view.name()));
        }
        let m = metas.swap_remove(k);
        Ok(Affine {
            sizes: m.sizes.to_vec(),
            strides: m.strides.to_vec(),
            offset: m.offset,
        })
    }

    /// The same map over the fewest dimensions: size-1 dimensions dropped,
    /// neighbours merged where the outer stride is the inner dimension's
    /// extent (a contiguous run, or a run of broadcast zeros), so emitted
    /// code divides once per remaining dimension.
    pub fn simplified(&self) -> Affine {
        let mut sizes: Vec<usize> = vec![];
        let mut strides: Vec<usize> = vec![];
        for (&s, &st) in self.sizes.iter().zip(&self.strides) {
            if s == 1 {
                continue;
            }
            match (sizes.last_mut(), strides.last_mut()) {
                (Some(ps), Some(pst)) if *pst == st * s => {
                    *ps *= s;
                    *pst = st;
                }
                _ => {
                    sizes.push(s);
                    strides.push(st);
                }
            }
        }
        Affine {
            sizes,
            strides,
            offset: self.offset,
        }
    }

    /// Does the map take each aligned quad of elements `4q..4q+3` to an
    /// aligned quad, lane to lane (a row broadcast over rows of a multiple
    /// of 4, a slice at such an offset)? Then a kernel computing four
    /// elements an invocation loads the four it reads as one vector.
    pub fn keeps_quads(&self) -> bool {
        let a = self.simplified();
        let n = a.sizes.len();
        n > 0
            && a.sizes[n - 1].is_multiple_of(4)
            && a.strides[n - 1] == 1
            && a.offset.is_multiple_of(4)
            && a.strides[..n - 1].iter().all(|st| st.is_multiple_of(4))
    }

    /// Is this map a bijection onto a contiguous tensor's elements (a
    /// permutation of a reshape: every element read once)? Then an
    /// element of the source has one place here (`Gen::permuted_at`).
    pub fn is_permutation(&self) -> bool {
        self.offset == 0 && kiln_functionalize::meta::fills_block(&self.sizes, &self.strides)
    }

    /// Reads element `i` itself (dimensions of size 1 aside).
    pub fn is_identity(&self) -> bool {
        let want = contiguous_strides(&self.sizes);
        self.offset == 0
            && self
                .sizes
                .iter()
                .zip(self.strides.iter().zip(&want))
                .all(|(&s, (a, b))| s <= 1 || a == b)
    }

    /// Reads one element whatever `i` is.
    pub fn is_constant(&self) -> bool {
        self.sizes
            .iter()
            .zip(&self.strides)
            .all(|(&s, &st)| s <= 1 || st == 0)
    }

    pub fn eval(&self, mut i: usize) -> usize {
        let mut at = self.offset;
        for (&s, &st) in self.sizes.iter().zip(&self.strides).rev() {
            if s > 0 {
                at += (i % s) * st;
                i /= s;
            }
        }
        at
    }
}

/// The region a `<view>_scatter` writes, in closed form over the output's
/// multi-index (so a kernel tests membership without searching).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Region {
    /// `start <= m[dim] < end`, `(m[dim] - start) % step == 0`.
    Slice {
        dim: usize,
        start: usize,
        end: usize,
        step: usize,
    },
    Select {
        dim: usize,
        index: usize,
    },
    /// `m[d2] - m[d1] == offset`.
    Diagonal {
        offset: i64,
        d1: usize,
        d2: usize,
    },
    /// `as_strided_scatter`'s view where no two of its elements share a
    /// position and its strides nest (each at least the span of the
    /// smaller ones: a strided sub-block, a diagonal): the flat position
    /// `p` minus `offset` divided by the strides from the largest, every
    /// quotient within its size and nothing left over. `out`: the
    /// output's contiguous strides; `dims`: (source dim, size, stride) of
    /// the dims longer than 1, largest stride first; `rank`: the source's.
    Strided {
        out: Vec<usize>,
        dims: Vec<(usize, usize, usize)>,
        offset: usize,
        rank: usize,
    },
}

impl Region {
    /// The region of scatter node `n` over its output `out`.
    pub fn of(g: &Graph, n: NodeId, out: &Meta) -> Result<Region, String> {
        let node = &g.nodes[n];
        let a: Vec<Arg<&Meta>> = node
            .args
            .iter()
            .map(|a| a.map(&mut |v| g.meta(*v)))
            .collect();
        let wrap = |d: i64| wrap_dim(d, out.dim());
        let region = match node.op.def().lowering {
            Lowering::RegionScatter { region, .. } => region,
            Lowering::StridedScatter(_) => return Region::strided(g, n, out),
            _ => return Err(format!("{} has no closed-form region", node.op.name())),
        };
        Ok(match region {
            RegionKind::Slice => {
                let dim = wrap(a.int(2)?)?;
                let size = out.sizes[dim] as i64;
                let clampb = |v: i64| -> i64 { (if v < 0 { v + size } else { v }).clamp(0, size) };
                let start = clampb(a.opt_int(3)?.unwrap_or(0));
                let end = clampb(a.opt_int(4)?.unwrap_or(i64::MAX)).max(start);
                Region::Slice {
                    dim,
                    start: start as usize,
                    end: end as usize,
                    step: a.int(5)?.max(1) as usize,
                }
            }
            RegionKind::Select => {
                let dim = wrap(a.int(2)?)?;
                let i = a.int(3)?;
                let size = out.sizes[dim] as i64;
                Region::Select {
                    dim,
                    index: (if i < 0 { i + size } else { i }) as usize,
                }
            }
            RegionKind::Diagonal => Region::Diagonal {
                offset: a.int(2)?,
                d1: wrap(a.int(3)?)?,
                d2: wrap(a.int(4)?)?,
            },
        })
    }

    /// `as_strided_scatter` node `n`'s view over its contiguous output,
    /// where it nests (`Region::Strided`).
    fn strided(g: &Graph, n: NodeId, out: &Meta) -> Result<Region, String> {
        let (offset, rank, dims) = crate::fusion::nested_strided_view(g, n)
            .ok_or("the strided view overlaps itself or interleaves")?;
        Ok(Region::Strided {
            out: contiguous_strides(&out.sizes),
            dims,
            offset,
            rank,
        })
    }

    /// Whether multi-index `m` (expressions) lies in the region, and the
    /// source multi-index there, as WGSL.
    pub fn emit(&self, m: &[String]) -> (String, Vec<String>) {
        match *self {
            Region::Slice {
                dim,
                start,
                end,
                step,
            } => {
                let x = &m[dim];
                let pred = format!(
                    "({x} >= {start}u && {x} < {end}u && ({x} - {start}u) % {step}u == 0u)"
                );
                let mut sm = m.to_vec();
                sm[dim] = format!("(({x} - {start}u) / {step}u)");
                (pred, sm)
            }
            Region::Select { dim, index } => {
                let pred = format!("({} == {index}u)", m[dim]);
                let mut sm = m.to_vec();
                sm.remove(dim);
                (pred, sm)
            }
            Region::Diagonal { offset, d1, d2 } => {
                let (x1, x2) = (&m[d1], &m[d2]);
                let pred = format!("(i32({x2}) - i32({x1}) == {offset}i)");
                let k = if offset >= 0 { x1.clone() } else { x2.clone() };
                let mut sm: Vec<String> = (0..m.len())
                    .filter(|&d| d != d1 && d != d2)
                    .map(|d| m[d].clone())
                    .collect();
                sm.push(k);
                (pred, sm)
            }
            Region::Strided {
                ref out,
                ref dims,
                offset,
                rank,
            } => {
                let p: Vec<String> = m
                    .iter()
                    .zip(out)
                    .map(|(x, st)| format!("{x} * {st}u"))
                    .collect();
                let p = format!(
                    "({})",
                    if p.is_empty() {
                        "0u".into()
                    } else {
                        p.join(" + ")
                    }
                );
                let mut pred = vec![format!("{p} >= {offset}u")];
                let mut r = format!("({p} - {offset}u)");
                let mut sm = vec!["0u".to_string(); rank];
                for &(d, size, st) in dims {
                    let a = format!("({r} / {st}u)");
                    pred.push(format!("{a} < {size}u"));
                    sm[d] = a;
                    r = format!("({r} % {st}u)");
                }
                pred.push(format!("{r} == 0u"));
                (format!("({})", pred.join(" && ")), sm)
            }
        }
    }

    /// `emit` evaluated: the source multi-index when `m` is in the region.
    pub fn eval(&self, m: &[usize]) -> Option<Vec<usize>> {
        match *self {
            Region::Slice {
                dim,
                start,
                end,
                step,
            } => {
                let x = m[dim];
                (x >= start && x < end && (x - start).is_multiple_of(step)).then(|| {
                    let mut sm = m.to_vec();
                    sm[dim] = (x - start) / step;
                    sm
                })
            }
            Region::Select { dim, index } => (m[dim] == index).then(|| {
                let mut sm = m.to_vec();
                sm.remove(dim);
                sm
            }),
            Region::Diagonal { offset, d1, d2 } => {
                (m[d2] as i64 - m[d1] as i64 == offset).then(|| {
                    let mut sm: Vec<usize> = (0..m.len())
                        .filter(|&d| d != d1 && d != d2)
                        .map(|d| m[d])
                        .collect();
                    sm.push(if offset >= 0 { m[d1] } else { m[d2] });
                    sm
                })
            }
            Region::Strided {
                ref out,
                ref dims,
                offset,
                rank,
            } => {
                let p: usize = m.iter().zip(out).map(|(x, st)| x * st).sum();
                let mut r = p.checked_sub(offset)?;
                let mut sm = vec![0; rank];
                for &(d, size, st) in dims {
                    sm[d] = r / st;
                    if sm[d] >= size {
                        return None;
                    }
                    r %= st;
                }
                (r == 0).then_some(sm)
            }
        }
    }
}

pub use kiln_functionalize::meta::unravel;

/// How an inlined op's element reads one operand.
#[derive(Clone, Debug, PartialEq)]
pub enum Read {
    /// At an affine map of the element.
    At(ValueId, Affine),
    /// Only at element 0 (a fill value).
    First(ValueId),
    /// A region scatter's source: at the source index where the element is
    /// in `region`, nowhere else.
    Source(ValueId, Region),
    /// At an index no affine map describes (`flip`, `repeat`, padding).
    Other(ValueId),
}

/// The operand reads of result `k` of node `n`, computed inline at its
/// element `i`; `Err` when the op is not computed inline (a kernel of its
/// own, or a view left in the program).
pub fn reads(g: &Graph, n: NodeId, k: usize) -> Result<Vec<Read>, String> {
    let node = &g.nodes[n];
    let def = node.op.def();
    let out = g.meta(node.results[k]);
    // Tensors in lists too (`index`'s indices).
    let tensors = |skip: usize| -> Vec<ValueId> {
        node.args
            .iter()
            .skip(skip)
            .flat_map(|a| a.tensors().into_iter().copied())
            .collect()
    };
    let at = |t: ValueId| Read::At(t, Affine::broadcast(&out.sizes, g.meta(t)));
    let elem = match def.lowering {
        Lowering::Map(e) | Lowering::Free(e) => e,
        // Self at the element; the index and the values anywhere.
        Lowering::IndexPut if crate::fusion::index_put_map(g, n).is_some() => {
            let t = tensors(0);
            let mut r = vec![Read::At(t[0], Affine::identity(&out.sizes))];
            r.extend(t[1..].iter().map(|&x| Read::Other(x)));
            return Ok(r);
        }
        Lowering::RegionScatter { .. } | Lowering::StridedScatter(_) => {
            let t = tensors(0);
            let (base, src) = (t[0], t[1]);
            return Ok(vec![
                Read::At(base, Affine::identity(&out.sizes)),
                Read::Source(src, Region::of(g, n, out)?),
            ]);
        }
        _ => return Err(format!("{} is not computed inline", def.name)),
    };
    match elem {
        Elem::Pointwise | Elem::Same | Elem::Cast | Elem::Triangle { .. } | Elem::MaskedFill => {
            Ok(tensors(0).into_iter().map(at).collect())
        }
        // Each input fills a region of the result: a slice along `dim`
        // (`cat`), one index of a new `dim` (`stack`).
        Elem::Join { stack } => {
            let d = match node.args.get(1) {
                Some(Arg::Int(d)) => wrap_dim(*d, out.dim())?,
                _ => return Err(format!("{}: no dim", def.name)),
            };
            let mut start = 0;
            let mut out_reads = vec![];
            for (i, t) in node.args[0].tensors().into_iter().copied().enumerate() {
                let tm = g.meta(t);
                let region = if stack {
                    Region::Select { dim: d, index: i }
                } else if tm.dim() == 1 && tm.sizes[0] == 0 {
                    continue;
                } else {
                    let len = tm.sizes[d];
                    start += len;
                    Region::Slice {
                        dim: d,
                        start: start - len,
                        end: start,
                        step: 1,
                    }
                };
                out_reads.push(Read::Source(t, region));
            }
            Ok(out_reads)
        }
        // `copy(self, src)` reads only `src`.
        Elem::CopyFrom => Ok(tensors(1).into_iter().map(at).collect()),
        Elem::ViewCopy => {
            let Rule::ViewCopy(view) = def.rule else {
                return Err(format!("{} is no view copy", def.name));
            };
            let [input] = tensors(0)[..1] else {
                return Err(format!("{}: no input", def.name));
            };
            Ok(vec![Read::At(
                input,
                Affine::view(g, view, g.meta(input), &node.args[1..], k)?,
            )])
        }
        Elem::Fill { value } => Ok(match node.args.get(value) {
            Some(Arg::Tensor(t)) => vec![Read::First(*t)],
            _ => vec![],
        }),
        // The index at the element (broadcast), self anywhere.
        Elem::Remap(_) | Elem::Index => Ok(tensors(0).into_iter().map(Read::Other).collect()),
        // The index at the element's position along `dim`, self anywhere.
        Elem::IndexSelect { index, dim } => {
            let [src, idx] = tensors(0)[..] else {
                return Err(format!("{}: argument {index} is not a tensor", def.name));
            };
            let (outer, inner) = index_select_split(g.meta(src), &node.args, dim)?;
            let nidx = g.meta(idx).numel();
            Ok(vec![
                Read::Other(src),
                Read::At(
                    idx,
                    Affine {
                        sizes: vec![outer, nidx, inner],
                        strides: vec![0, 1, 0],
                        offset: 0,
                    },
                ),
            ])
        }
        Elem::GatherAlong { .. } => {
            let t = tensors(0);
            Ok(vec![Read::Other(t[0]), at(t[1])])
        }
        // `self` at the element; the index and the source anywhere.
        Elem::IndexAdd | Elem::ScatterInto { .. } => {
            let t = tensors(0);
            let mut r = vec![Read::At(t[0], Affine::identity(&out.sizes))];
            r.extend(t[1..].iter().map(|&x| Read::Other(x)));
            Ok(r)
        }
        // Factories and fills of a literal read nothing.
        Elem::Constant { .. } | Elem::Arange => Ok(vec![]),
    }
}

/// `index_select(self, dim, ...)`'s result as `[outer, index, inner]`
/// around `dim` (argument `dim` of `args`; absent: dimension 0, an
/// `embedding`'s rows): the sizes before and after it.
pub fn index_select_split(
    src: &Meta,
    args: &[Arg<ValueId>],
    dim: Option<usize>,
) -> Result<(usize, usize), String> {
    let d = match dim.map(|i| args.get(i)) {
        None => 0,
        Some(Some(&Arg::Int(d))) => d,
        Some(_) => return Err("index_select: no dim".into()),
    };
    if src.sizes.is_empty() {
        return Ok((1, 1));
    }
    let d = wrap_dim(d, src.dim())?;
    Ok((
        src.sizes[..d].iter().product(),
        src.sizes[d + 1..].iter().product(),
    ))
}

/// Where an inlined value is read, relative to the element a kernel
/// invocation computes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
enum Pos {
    /// At the invocation's own element.
    Own,
    /// At the source index of region scatter `n`, itself read at `Own`:
    /// there the scatter's own view of its base is the base at `Own`.
    Source(NodeId),
    /// At the element whose index is the own one's with its dims permuted
    /// (`Walk::perms`): two transposes that cancel read the own element.
    Permuted(usize),
    /// Somewhere in the own element's row block (`Walk::rows`): a row
    /// kernel holds the block in registers.
    Row,
    /// In the quad the own element's aligned quad maps to, at its lane
    /// (`Affine::keeps_quads`, `Walk::quads`).
    Quad,
    Elsewhere,
}

/// Whether elementwise value `v` can join the fused kernel computing
/// `group` (reads group members only at its own index). Of the same shape,
/// or of as many elements where no member reads a transposing view (each
/// invocation computes every member at its flat index; a kernel tiling a
/// transpose serves one shape).
pub fn fits_group(g: &Graph, s: &Schedule, group: &[ValueId], v: ValueId) -> bool {
    let Some(&first) = group.first() else {
        return true;
    };
    let Def::Node(n, k) = g.values[v].def else {
        return false;
    };
    let shaped = g.meta(first).sizes == g.meta(v).sizes
        || (g.meta(first).numel() == g.meta(v).numel() && {
            let mut all = group.to_vec();
            all.push(v);
            !reads_transposed(g, s, &all)
        });
    if !shaped || s.inplace.contains_key(&v) || s.inplace.contains_key(&first) {
        return false;
    }
    reads_own_only(g, s, n, k, group, false)
}

/// Does a kernel computing `group` read a stored value through a view
/// that moves its innermost dimension (`own_view_copies`)?
fn reads_transposed(g: &Graph, s: &Schedule, group: &[ValueId]) -> bool {
    own_view_copies(g, s, group).into_iter().any(|(n, k)| {
        let node = &g.nodes[n];
        let (Rule::ViewCopy(view), Some(&Arg::Tensor(input))) =
            (&node.op.def().rule, node.args.first())
        else {
            return true;
        };
        Affine::view(g, *view, g.meta(input), &node.args[1..], k).map_or(true, |a| {
            let a = a.simplified();
            a.strides.last().is_some_and(|&st| st > 1)
        })
    })
}

/// Does computing `v` read the buffer of `root` only at the invocation's
/// own index? (Every value living in the buffer is read from it before
/// the invocation's store: at the own element only is fine.)
pub fn reads_only_at_own_index(g: &Graph, s: &Schedule, v: ValueId, root: ValueId) -> bool {
    let Def::Node(n, k) = g.values[v].def else {
        return false;
    };
    reads_own_only(g, s, n, k, &s.sharing(root), false)
}

/// Does computing `v` read the buffer of `root` only at the invocation's
/// own index or in the quad its own aligned quad maps to, at its lane
/// (`Pos::Quad`)? A kernel of four elements an invocation then loads
/// each quad it reads as one vector (a bias row broadcast over rows).
pub fn reads_in_quads(g: &Graph, s: &Schedule, v: ValueId, root: ValueId) -> bool {
    let Def::Node(n, k) = g.values[v].def else {
        return false;
    };
    walk_reads(g, s, n, k, &s.sharing(root), false, None, true)
}

/// `reads_only_at_own_index`, also where the own element is reached
/// through permutations that cancel (`t(f(t(p)))` read back into `p`'s
/// layout): for a result written over `root`'s buffer, which the
/// invocation loads from memory before its store at any index expression.
/// Not for kernel members, read from registers by the index expression.
pub fn reads_root_at_own_element(g: &Graph, s: &Schedule, v: ValueId, root: ValueId) -> bool {
    let Def::Node(n, k) = g.values[v].def else {
        return false;
    };
    reads_own_only(g, s, n, k, &s.sharing(root), true)
}

/// Can result `k` of node `n` be computed inline by an invocation that may
/// read the buffers of `members` (kernel outputs, a buffer written in
/// place) only at its own element, with every op on the way computed
/// inline? Decided on the index maps, for any size.
/// `permutations`: reads through dim permutations that cancel count as
/// the own element (`Pos::Permuted`).
pub fn reads_own_only(
    g: &Graph,
    s: &Schedule,
    n: NodeId,
    k: usize,
    members: &[ValueId],
    permutations: bool,
) -> bool {
    walk_reads(g, s, n, k, members, permutations, None, false)
}

/// The view copies (node, result) of stored values that the kernel
/// computing `group` reads at its own element: reached from the members
/// through reads at the element itself, computed inline. Where such a
/// view transposes, the kernel can stage it through workgroup memory
/// (`Gen::transposed_tile`).
pub fn own_view_copies(g: &Graph, s: &Schedule, group: &[ValueId]) -> Vec<(NodeId, usize)> {
    let mut found = vec![];
    walk_own(g, s, group, |n, k, rs| {
        if let (Rule::ViewCopy(_), [Read::At(input, _)]) = (&g.nodes[n].op.def().rule, rs) {
            if s.is_materialized.contains(input) {
                found.push((n, k));
            }
            return false;
        }
        true
    });
    found
}

/// The stored values the kernel computing `group` reads, with the maps
/// it reads them through, from nodes it computes inline at its own
/// element (as `own_view_copies` walks).
pub fn own_stored_reads(g: &Graph, s: &Schedule, group: &[ValueId]) -> Vec<(ValueId, Affine)> {
    let mut found = vec![];
    walk_own(g, s, group, |_, _, rs| {
        for r in rs {
            if let Read::At(t, a) = r {
                if s.is_materialized.contains(t) {
                    found.push((*t, a.clone()));
                }
            }
        }
        true
    });
    found
}

/// Calls `visit` with each node result computed inline at the own
/// element of the kernel computing `group` (the members, then what they
/// read at that element itself, not stored) and its reads; `visit` says
/// whether to go on into them.
fn walk_own(
    g: &Graph,
    s: &Schedule,
    group: &[ValueId],
    mut visit: impl FnMut(NodeId, usize, &[Read]) -> bool,
) {
    let mut seen = std::collections::HashSet::new();
    let mut stack: Vec<ValueId> = group.to_vec();
    while let Some(v) = stack.pop() {
        let Def::Node(n, k) = g.values[v].def else {
            continue;
        };
        if !seen.insert(v) {
            continue;
        }
        let Ok(rs) = reads(g, n, k) else {
            continue;
        };
        if !visit(n, k, &rs) {
            continue;
        }
        for r in rs {
            if let Read::At(t, a) = r {
                if a.is_identity() && !s.is_materialized.contains(&t) {
                    stack.push(t);
                }
            }
        }
    }
}

struct Walk<'a> {
    members: &'a [ValueId],
    roots: &'a [ValueId],
    memo: &'a mut HashMap<(ValueId, Pos), bool>,
    /// Dim permutations of `Pos::Permuted`: for each dim of the value
    /// read, the dim of the element read at `Own` it takes its index from.
    perms: Vec<Vec<usize>>,
    /// Track permutations at all (else any other index is elsewhere).
    permutations: bool,
    /// Row blocks (`Pos::Row`): every value read splits, flat, into this
    /// many blocks of consecutive elements, the invocation computing an
    /// element holding its block of each member.
    rows: Option<usize>,
    /// Track reads in quads (`Pos::Quad`; else they are elsewhere).
    quads: bool,
}

/// Can value `v` be read anywhere in a row block of `rows` blocks
/// (`Pos::Row`) by an invocation holding the same block of each of
/// `members` (a row kernel, `chain::chain_rows`), reading no other block
/// of theirs and no other buffer of theirs? Members without a buffer (an
/// epilogue's product result) are the invocation's too. Decided on the
/// index maps.
pub fn reads_rows_only(
    g: &Graph,
    s: &Schedule,
    v: ValueId,
    members: &[ValueId],
    rows: usize,
) -> bool {
    if members.contains(&v) {
        return true;
    }
    if s.is_materialized.contains(&v) {
        return !members
            .iter()
            .any(|m| s.is_materialized.contains(m) && s.root(*m) == s.root(v));
    }
    node_reads_rows_only(g, s, v, members, rows)
}

/// `reads_rows_only` for the node computing member `v` (an elementwise
/// value, a kernel's tail): its reads, each anywhere in the block.
pub fn node_reads_rows_only(
    g: &Graph,
    s: &Schedule,
    v: ValueId,
    members: &[ValueId],
    rows: usize,
) -> bool {
    let Def::Node(n, k) = g.values[v].def else {
        return false;
    };
    walk_reads(g, s, n, k, members, false, Some(rows), false)
}

/// Do the reads of result `k` of node `n`, its element read at `Own`
/// (`Row` with `rows`), reach `members` only where `Walk` allows?
#[allow(clippy::too_many_arguments)]
fn walk_reads(
    g: &Graph,
    s: &Schedule,
    n: NodeId,
    k: usize,
    members: &[ValueId],
    permutations: bool,
    rows: Option<usize>,
    quads: bool,
) -> bool {
    // Members without a buffer share none.
    let roots: Vec<ValueId> = members
        .iter()
        .filter(|m| s.is_materialized.contains(m))
        .map(|&m| s.root(m))
        .collect();
    let mut memo = HashMap::new();
    let mut w = Walk {
        members,
        roots: &roots,
        memo: &mut memo,
        perms: vec![],
        permutations,
        rows,
        quads,
    };
    let pos = if rows.is_some() { Pos::Row } else { Pos::Own };
    match reads(g, n, k) {
        Ok(rs) => rs.iter().all(|r| read_ok(g, s, n, r, pos, &mut w)),
        Err(_) => false,
    }
}

/// Does an element of a value of `sizes`, in row block `b` of `rows`
/// blocks, read through `a` only elements of block `b` of `t` (of `numel`
/// elements)? The leading dims making the blocks must map to `t`'s blocks
/// stride for stride, the rest stay within one block.
fn keeps_rows(a: &Affine, numel: usize, rows: usize) -> bool {
    let total: usize = a.sizes.iter().product();
    if rows <= 1 {
        return true;
    }
    if !total.is_multiple_of(rows) || !numel.is_multiple_of(rows) {
        return false;
    }
    let width = numel / rows;
    // The leading dims whose product is `rows`.
    let mut lead = 1;
    let mut p = 0;
    while lead < rows && p < a.sizes.len() {
        lead *= a.sizes[p];
        p += 1;
    }
    if lead != rows {
        return false;
    }
    let cs = contiguous_strides(&a.sizes[..p]);
    let leads_ok = (0..p).all(|d| a.sizes[d] <= 1 || a.strides[d] == cs[d] * width);
    let span: usize = a.offset
        + (p..a.sizes.len())
            .map(|d| (a.sizes[d].max(1) - 1) * a.strides[d])
            .sum::<usize>();
    leads_ok && span < width
}

/// Does a region scatter's element of `sizes` in row block `b` of `rows`
/// read its source (of `numel` elements) in block `b`? Where the region
/// narrows or picks a dim past those making the blocks.
fn region_keeps_rows(sizes: &[usize], region: &Region, numel: usize, rows: usize) -> bool {
    if rows <= 1 {
        return true;
    }
    let dim = match *region {
        Region::Slice { dim, .. } | Region::Select { dim, .. } => dim,
        _ => return false,
    };
    let mut lead = 1;
    let mut p = 0;
    while lead < rows && p < sizes.len() {
        lead *= sizes[p];
        p += 1;
    }
    lead == rows && dim >= p && numel.is_multiple_of(rows)
}

/// For each dim of map `a` over a contiguous tensor of `base` sizes, the
/// base dim it walks, where `a` is a permutation of the base's dims (same
/// sizes and strides, every element once); `None` for any other map.
pub fn permuted_dims(a: &Affine, base: &[usize]) -> Option<Vec<usize>> {
    let cs = contiguous_strides(base);
    if a.offset != 0 || a.sizes.len() != base.len() {
        return None;
    }
    let mut used = vec![false; cs.len()];
    a.sizes
        .iter()
        .zip(&a.strides)
        .map(|(&size, &stride)| {
            let j = (0..cs.len())
                .find(|&j| !used[j] && base[j] == size && (size <= 1 || cs[j] == stride))?;
            used[j] = true;
            Some(j)
        })
        .collect()
}

/// Where value `t` is read through map `a` by a value read at `pos`
/// (whose sizes are `a.sizes`): `Own` where permutations cancel, another
/// permutation, or elsewhere.
fn permuted_pos(g: &Graph, t: ValueId, a: &Affine, pos: Pos, w: &mut Walk) -> Pos {
    let dims: Vec<usize> = match pos {
        Pos::Own => (0..a.sizes.len()).collect(),
        Pos::Permuted(i) => w.perms[i].clone(),
        Pos::Source(_) | Pos::Row | Pos::Quad | Pos::Elsewhere => return Pos::Elsewhere,
    };
    if !w.permutations {
        return Pos::Elsewhere;
    }
    let tm = g.meta(t);
    if dims.len() != a.sizes.len() {
        return Pos::Elsewhere;
    }
    let Some(perm) = permuted_dims(a, &tm.sizes) else {
        return Pos::Elsewhere;
    };
    let mut to = vec![0; perm.len()];
    for (k, &j) in perm.iter().enumerate() {
        to[j] = dims[k];
    }
    if to.iter().enumerate().all(|(j, &d)| j == d) {
        return Pos::Own;
    }
    let i = match w.perms.iter().position(|p| *p == to) {
        Some(i) => i,
        None => {
            w.perms.push(to);
            w.perms.len() - 1
        }
    };
    Pos::Permuted(i)
}

fn read_ok(g: &Graph, s: &Schedule, n: NodeId, r: &Read, pos: Pos, w: &mut Walk) -> bool {
    if let (Some(rows), Pos::Own | Pos::Row) = (w.rows, pos) {
        let kept = match r {
            Read::At(t, a) => keeps_rows(a, g.meta(*t).numel(), rows),
            Read::Source(t, region) => {
                let Some(&y) = g.nodes[n].results.first() else {
                    return false;
                };
                region_keeps_rows(&g.meta(y).sizes, region, g.meta(*t).numel(), rows)
            }
            Read::First(_) | Read::Other(_) => false,
        };
        if kept {
            let (Read::At(t, _) | Read::Source(t, _)) = r else {
                return false;
            };
            return value_ok(g, s, *t, Pos::Row, w);
        }
    }
    match r {
        Read::At(t, a)
            if a.is_identity() && (pos == Pos::Own || g.meta(*t).sizes[..] == a.sizes[..]) =>
        {
            value_ok(g, s, *t, pos, w)
        }
        Read::At(t, a) if w.quads && matches!(pos, Pos::Own | Pos::Quad) && a.keeps_quads() => {
            value_ok(g, s, *t, Pos::Quad, w)
        }
        Read::At(t, a) => {
            let p = permuted_pos(g, *t, a, pos, w);
            value_ok(g, s, *t, p, w)
        }
        Read::First(t) | Read::Other(t) => value_ok(g, s, *t, Pos::Elsewhere, w),
        Read::Source(t, _) => {
            let p = if pos == Pos::Own {
                Pos::Source(n)
            } else {
                Pos::Elsewhere
            };
            value_ok(g, s, *t, p, w)
        }
    }
}

fn value_ok(g: &Graph, s: &Schedule, v: ValueId, pos: Pos, w: &mut Walk) -> bool {
    if w.rows.is_some() && w.members.contains(&v) {
        return pos == Pos::Own || pos == Pos::Row;
    }
    if s.is_materialized.contains(&v) {
        // A member is read from the invocation's registers (at its own
        // element only); another value in a member's buffer would be read
        // from memory, where the kernel's stores may not have landed yet
        // (packed and vector stores come last).
        return if w.members.contains(&v) {
            pos == Pos::Own || pos == Pos::Row || pos == Pos::Quad
        } else {
            !w.roots.contains(&s.root(v))
        };
    }
    if let Some(&b) = w.memo.get(&(v, pos)) {
        return b;
    }
    let Def::Node(m, k) = g.values[v].def else {
        return true;
    };
    // The scatter's own view of its base, read at the source index, is the
    // base at the scatter's element (the code generator reuses that load).
    if let Pos::Source(sc) = pos {
        if let (true, Some(&Arg::Tensor(base))) = (
            crate::fusion::is_scatter_view_copy(g, sc, v),
            g.nodes[sc].args.first(),
        ) {
            return value_ok(g, s, base, Pos::Own, w);
        }
    }
    let ok = match reads(g, m, k) {
        Ok(rs) => rs.iter().all(|r| read_ok(g, s, m, r, pos, w)),
        Err(_) => false,
    };
    w.memo.insert((v, pos), ok);
    ok
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn affine_maps_follow_strides() {
        // Column 1 of a 3x4 row-major matrix.
        let col = Affine {
            sizes: vec![3],
            strides: vec![4],
            offset: 1,
        };
        assert_eq!((0..3).map(|i| col.eval(i)).collect::<Vec<_>>(), [1, 5, 9]);
        // A transposed 2x3 view of a 3x2 matrix.
        let t = Affine {
            sizes: vec![2, 3],
            strides: vec![1, 2],
            offset: 0,
        };
        assert_eq!(
            (0..6).map(|i| t.eval(i)).collect::<Vec<_>>(),
            [0, 2, 4, 1, 3, 5]
        );
        assert!(!t.is_identity());
        // Size-1 dimensions do not matter.
        let r = Affine {
            sizes: vec![3, 1],
            strides: vec![1, 7],
            offset: 0,
        };
        assert!(r.is_identity());
        let b = Affine::broadcast(
            &[4, 3],
            &Meta::contiguous(kiln_functionalize::DType::F32, vec![3]),
        );
        assert_eq!(
            (0..6).map(|i| b.eval(i)).collect::<Vec<_>>(),
            [0, 1, 2, 0, 1, 2]
        );
        assert!(!b.is_identity() && !b.is_constant());
    }

    #[test]
    fn regions_evaluate_as_they_emit() {
        let s = Region::Slice {
            dim: 0,
            start: 1,
            end: 7,
            step: 3,
        };
        assert_eq!(s.eval(&[4, 2]), Some(vec![1, 2]));
        assert_eq!(s.eval(&[5, 2]), None);
        let d = Region::Diagonal {
            offset: -1,
            d1: 0,
            d2: 1,
        };
        assert_eq!(d.eval(&[3, 2]), Some(vec![2]));
        assert_eq!(d.eval(&[2, 2]), None);
        let (pred, sm) = d.emit(&["a".into(), "b".into()]);
        assert_eq!(pred, "(i32(b) - i32(a) == -1i)");
        assert_eq!(sm, ["b"]);
    }
}
