//! Batching rules for `vmap`: how each op runs on arguments that carry a
//! batch dimension (always at position 0, `transform::Batcher`). Most are
//! "move the batch dimension, call the same op": elementwise ops align
//! ranks and broadcast, ops with dimension arguments shift them by one,
//! ops that accept leading batch dimensions (`matmul`, `linear`,
//! `layer_norm`, attention, `embedding`'s indices) take the batch as one.
//! A few compose other batched ops (`addmm` as `matmul` plus `add`).
//! What has no better rule runs once per batch element and stacks the
//! results (`per_element`): `as_strided_copy`, `as_strided_scatter`,
//! `index_put`, and the rare argument mixes the specific rules do not
//! cover; results are exact, the graph grows with the batch size.

use crate::id::ValueId;
use crate::ops::{Elem, Lowering, Reduction, RegionKind};
use crate::rule::{int, ints, t, Batch, Call, R};
use crate::schema::Arg;

type Out = R<Vec<(ValueId, bool)>>;

fn batched_tensors(b: &dyn Batch, c: &Call) -> Vec<ValueId> {
    c.args
        .iter()
        .flat_map(|a| a.tensors().into_iter().copied().collect::<Vec<_>>())
        .filter(|&v| b.is_batched(v))
        .collect()
}

fn all_batched(rs: Vec<ValueId>) -> Vec<(ValueId, bool)> {
    rs.into_iter().map(|r| (r, true)).collect()
}

fn wrap(d: i64, rank: usize) -> R<i64> {
    Ok(crate::meta::wrap_dim(d, rank.max(1))? as i64 + 1)
}

/// Runs the op once per batch element and stacks the results.
pub(crate) fn per_element(b: &mut dyn Batch, c: &Call) -> Out {
    let mut per: Vec<Vec<ValueId>> = vec![];
    for i in 0..b.size() {
        let mut args = vec![];
        for a in c.args {
            let mut err = None;
            let na = a.map(&mut |v: &ValueId| {
                if b.is_batched(*v) {
                    match b
                        .e()
                        .call("select_copy", vec![t(*v), int(0), int(i as i64)])
                    {
                        Ok(x) => x,
                        Err(m) => {
                            err = Some(m);
                            *v
                        }
                    }
                } else {
                    *v
                }
            });
            if let Some(m) = err {
                return Err(m);
            }
            args.push(na);
        }
        per.push(b.e().call_id(c.op, args)?.to_vec());
    }
    let n = per.first().map_or(0, Vec::len);
    let mut outs = vec![];
    for k in 0..n {
        let l: Vec<Option<ValueId>> = per.iter().map(|rs| Some(rs[k])).collect();
        outs.push((b.e().call("stack", vec![Arg::TensorList(l), int(0)])?, true));
    }
    Ok(outs)
}

/// Elementwise ops: batched operands padded to a common logical rank so
/// they broadcast as before; ops whose result has `self`'s shape get a
/// batched `self`.
pub(crate) fn elementwise(b: &mut dyn Batch, c: &Call) -> Out {
    let elem = c.op.def().lowering.elem();
    let self_shaped = matches!(
        elem,
        Some(Elem::MaskedFill | Elem::CopyFrom | Elem::Fill { .. })
    );
    let rank = c
        .args
        .iter()
        .flat_map(|a| a.tensors().into_iter().copied().collect::<Vec<_>>())
        .map(|v| b.lrank(v))
        .max()
        .unwrap_or(0);
    let mut args = vec![];
    for (i, a) in c.args.iter().enumerate() {
        args.push(match a {
            Arg::Tensor(v) if i == 0 && self_shaped => t(b.materialize(*v)?),
            Arg::Tensor(v) => t(b.align(*v, rank)?),
            other => other.clone(),
        });
    }
    if let (Some(Elem::MaskedFill), Some(Arg::Tensor(v))) = (elem, c.args.get(2)) {
        if b.is_batched(*v) {
            // The value must be 0-d: a batched one is a `where`.
            let d = b.e().dtype(c.tensor(0)?);
            let r = b.e().call(
                "where",
                vec![args[1].clone(), args[2].clone(), args[0].clone()],
            )?;
            return Ok(vec![(b.e().cast(r, d)?, true)]);
        }
    }
    if matches!(elem, Some(Elem::Fill { .. })) && matches!(args.get(1), Some(Arg::Tensor(_))) {
        // `fill` takes a 0-d value: a batched one is a copy.
        let r = b.e().call("copy", vec![args[0].clone(), args[1].clone()])?;
        return Ok(vec![(r, true)]);
    }
    Ok(all_batched(b.e().call_id(c.op, args)?.to_vec()))
}

/// Ops with one batched tensor (`self`) and dimension arguments: the
/// dimensions shifted past the batch. `extra` is added to the logical
/// rank the dimensions wrap against (`unsqueeze`: one more).
fn shifted(b: &mut dyn Batch, c: &Call, int_at: &[usize], list_at: &[usize], extra: usize) -> Out {
    let bt = batched_tensors(b, c);
    let x = c.tensor(0)?;
    if bt.len() != 1 || bt[0] != x {
        return per_element(b, c);
    }
    let r = b.lrank(x) + extra;
    let mut args = c.args.to_vec();
    for &i in int_at {
        if let Some(Arg::Int(d)) = args.get(i) {
            args[i] = int(wrap(*d, r)?);
        }
    }
    for &i in list_at {
        if let Some(Arg::IntList(l)) = args.get(i) {
            let l: Vec<i64> = l.iter().map(|&d| wrap(d, r)).collect::<R<_>>()?;
            args[i] = ints(&l);
        }
    }
    Ok(all_batched(b.e().call_id(c.op, args)?.to_vec()))
}

macro_rules! shift {
    ($name:ident, [$($i:expr),*], [$($l:expr),*], $extra:expr) => {
        pub(crate) fn $name(b: &mut dyn Batch, c: &Call) -> Out {
            shifted(b, c, &[$($i),*], &[$($l),*], $extra)
        }
    };
}

shift!(dim1, [1], [], 0);
shift!(dim2, [2], [], 0);
shift!(dims12, [1, 2], [], 0);
shift!(dims23, [2, 3], [], 0);
shift!(list1, [], [1], 0);
shift!(unsqueeze, [1], [], 1);

/// Reductions whose `dim` (argument 1) may be absent (every dimension).
pub(crate) fn reduction(b: &mut dyn Batch, c: &Call) -> Out {
    let x = c.tensor(0)?;
    let r = b.lrank(x);
    let all: Vec<i64> = (1..=r as i64).collect();
    let whole = match c.args.get(1) {
        None => true,
        Some(Arg::None) => true,
        Some(Arg::IntList(l)) => l.is_empty(),
        _ => false,
    };
    if !whole {
        return shifted(b, c, &[1], &[1], 0);
    }
    if r == 0 {
        // Nothing to reduce over but the batch: the op on each element is
        // the identity in shape.
        return per_element(b, c);
    }
    let mut args = c.args.to_vec();
    let Lowering::Reduce(red) = c.op.def().lowering else {
        return Err(format!("internal error: {} is no reduction", c.op.name()));
    };
    match red {
        Reduction::Sum | Reduction::Mean if c.args.len() <= 2 => {
            // The full reduction overload (`sum(self, dtype)`).
            let dtype = c.args.get(1).cloned().unwrap_or(Arg::None);
            args = vec![t(x), ints(&all), Arg::Bool(false), dtype];
        }
        _ => args[1] = ints(&all),
    }
    Ok(all_batched(b.e().call_id(c.op, args)?.to_vec()))
}

/// `prod`: `.dim_int` shifts its dim; the full product is each batch
/// element's row of a `[batch, -1]` reshape, multiplied along it.
pub(crate) fn prod(b: &mut dyn Batch, c: &Call) -> Out {
    if c.args.len() > 2 {
        return dim1(b, c);
    }
    let x = c.tensor(0)?;
    let size = b.size() as i64;
    let flat = b.e().call("reshape", vec![t(x), ints(&[size, -1])])?;
    let dtype = c.args.get(1).cloned().unwrap_or(Arg::None);
    let r = b
        .e()
        .call("prod", vec![t(flat), int(1), Arg::Bool(false), dtype])?;
    Ok(vec![(r, true)])
}

pub(crate) fn arg_extreme(b: &mut dyn Batch, c: &Call) -> Out {
    if !matches!(c.args.get(1), Some(Arg::None) | None) {
        return dim1(b, c);
    }
    let x = c.tensor(0)?;
    let r = b.lrank(x);
    let size = b.size();
    let n = b.e_ref().meta(x).numel() / size.max(1);
    let flat = b.e().view(x, &[size, n])?;
    let keepdim = matches!(c.args.get(2), Some(Arg::Bool(true)));
    let i = b
        .e()
        .call_id(c.op, vec![t(flat), int(1), Arg::Bool(keepdim)])?[0];
    let i = if keepdim {
        let mut s = vec![b.size()];
        s.extend(std::iter::repeat_n(1, r));
        b.e().view(i, &s)?
    } else {
        i
    };
    Ok(vec![(i, true)])
}

pub(crate) fn view(b: &mut dyn Batch, c: &Call) -> Out {
    let x = c.tensor(0)?;
    let Some(Arg::IntList(s)) = c.args.get(1) else {
        return per_element(b, c);
    };
    let mut sizes = vec![b.size() as i64];
    sizes.extend(s);
    let r = b.e().call_id(c.op, vec![t(x), ints(&sizes)])?[0];
    Ok(vec![(r, true)])
}

pub(crate) fn expand(b: &mut dyn Batch, c: &Call) -> Out {
    let Some(Arg::IntList(s)) = c.args.get(1) else {
        return per_element(b, c);
    };
    let x = b.align(c.tensor(0)?, s.len())?;
    let mut sizes = vec![b.size() as i64];
    sizes.extend(s);
    Ok(vec![(
        b.e().call("expand_copy", vec![t(x), ints(&sizes)])?,
        true,
    )])
}

pub(crate) fn permute(b: &mut dyn Batch, c: &Call) -> Out {
    let x = c.tensor(0)?;
    let r = b.lrank(x);
    let Some(Arg::IntList(p)) = c.args.get(1) else {
        return per_element(b, c);
    };
    let mut perm = vec![0i64];
    for &d in p {
        perm.push(wrap(d, r)?);
    }
    Ok(vec![(
        b.e().call("permute_copy", vec![t(x), ints(&perm)])?,
        true,
    )])
}

pub(crate) fn t_copy(b: &mut dyn Batch, c: &Call) -> Out {
    let x = c.tensor(0)?;
    if b.lrank(x) < 2 {
        return Ok(vec![(x, true)]);
    }
    Ok(vec![(b.e().transpose(x, 1, 2)?, true)])
}

pub(crate) fn squeeze(b: &mut dyn Batch, c: &Call) -> Out {
    let x = c.tensor(0)?;
    let l = b.logical(x);
    let dims: Vec<i64> = match c.args.get(1) {
        Some(Arg::Int(d)) => vec![*d],
        Some(Arg::IntList(v)) => v.clone(),
        _ => (0..l.len() as i64)
            .filter(|&d| l[d as usize] == 1)
            .collect(),
    };
    let dims: Vec<i64> = dims.iter().map(|&d| wrap(d, l.len())).collect::<R<_>>()?;
    if dims.is_empty() {
        return Ok(vec![(x, true)]);
    }
    Ok(vec![(
        b.e().call("squeeze_copy", vec![t(x), ints(&dims)])?,
        true,
    )])
}

pub(crate) fn repeat(b: &mut dyn Batch, c: &Call) -> Out {
    let Some(Arg::IntList(reps)) = c.args.get(1) else {
        return per_element(b, c);
    };
    let x = b.align(c.tensor(0)?, reps.len())?;
    let mut r = vec![1i64];
    r.extend(reps);
    Ok(vec![(b.e().call("repeat", vec![t(x), ints(&r)])?, true)])
}

/// Ops on the trailing dimensions only: the batch is one more leading one.
pub(crate) fn leading(b: &mut dyn Batch, c: &Call) -> Out {
    let bt = batched_tensors(b, c);
    if bt.len() != 1 || bt[0] != c.tensor(0)? {
        return per_element(b, c);
    }
    Ok(all_batched(b.e().call_id(c.op, c.args.to_vec())?.to_vec()))
}

/// `cat`/`stack`: every piece batched, the dimension shifted.
pub(crate) fn cat(b: &mut dyn Batch, c: &Call) -> Out {
    let l = c.list(0);
    let stack = c.op.def().lowering == Lowering::Map(Elem::Join { stack: true });
    let rank = l.iter().flatten().map(|&v| b.lrank(v)).max().unwrap_or(0);
    let mut nl = vec![];
    for v in l.iter() {
        nl.push(match v {
            // cat skips 1-d empty tensors: keep them unbatched.
            Some(v) if !stack && b.logical(*v) == [0] && rank != 1 => Some(*v),
            Some(v) => Some(b.materialize(*v)?),
            None => None,
        });
    }
    let d = match c.args.get(1) {
        Some(Arg::Int(d)) => wrap(*d, rank + stack as usize)?,
        _ => 1,
    };
    Ok(vec![(
        b.e().call_id(c.op, vec![Arg::TensorList(nl), int(d)])?[0],
        true,
    )])
}

/// Several tensors that must all be batched, and dimension arguments.
fn all_with_dims(b: &mut dyn Batch, c: &Call, ints_at: &[usize], wrap_rank_of: usize) -> Out {
    let r = b.lrank(c.tensor(wrap_rank_of)?);
    let mut args = vec![];
    for (i, a) in c.args.iter().enumerate() {
        args.push(match a {
            Arg::Tensor(v) => t(b.materialize(*v)?),
            Arg::Int(d) if ints_at.contains(&i) => int(wrap(*d, r)?),
            other => other.clone(),
        });
    }
    Ok(all_batched(b.e().call_id(c.op, args)?.to_vec()))
}

pub(crate) fn gather_like(b: &mut dyn Batch, c: &Call) -> Out {
    // gather/scatter/scatter_add(self, dim, index, src?): same ranks.
    all_with_dims(b, c, &[1], 0)
}

pub(crate) fn region_scatter(b: &mut dyn Batch, c: &Call) -> Out {
    let dims: &[usize] = match c.op.def().lowering {
        Lowering::RegionScatter {
            region: RegionKind::Diagonal,
            ..
        } => &[3, 4],
        _ => &[2],
    };
    all_with_dims(b, c, dims, 0)
}

pub(crate) fn take_along_dim(b: &mut dyn Batch, c: &Call) -> Out {
    if !matches!(c.args.get(2), Some(Arg::Int(_))) {
        return per_element(b, c);
    }
    all_with_dims(b, c, &[2], 0)
}

/// `index_add`/`index_copy`/`index_select`: a 1-d index that must not be
/// batched.
pub(crate) fn indexed_dim(b: &mut dyn Batch, c: &Call) -> Out {
    if b.is_batched(c.tensor(2)?) {
        return per_element(b, c);
    }
    // `index_select` (a gather) has no source to align.
    if matches!(
        c.op.def().lowering,
        Lowering::Map(crate::ops::Elem::IndexSelect { .. })
    ) {
        return dim1(b, c);
    }
    let r = b.lrank(c.tensor(0)?);
    let mut args = c.args.to_vec();
    args[0] = t(b.materialize(c.tensor(0)?)?);
    args[1] = int(wrap(int_of(c, 1)?, r)?);
    args[3] = t(b.materialize(c.tensor(3)?)?);
    Ok(all_batched(b.e().call_id(c.op, args)?.to_vec()))
}

fn int_of(c: &Call, i: usize) -> R<i64> {
    match c.args.get(i) {
        Some(Arg::Int(x)) => Ok(*x),
        _ => Err(format!(
            "internal error: argument {i} of {} is not an integer",
            c.op.name()
        )),
    }
}

pub(crate) fn index(b: &mut dyn Batch, c: &Call) -> Out {
    let l = c.list(1);
    let x = c.tensor(0)?;
    let adjacent = l.iter().all(Option::is_some);
    if !b.is_batched(x) || l.iter().flatten().any(|&v| b.is_batched(v)) || !adjacent {
        return per_element(b, c);
    }
    let mut nl = vec![None];
    nl.extend(l);
    Ok(vec![(
        b.e().call("index", vec![t(x), Arg::TensorList(nl)])?,
        true,
    )])
}

pub(crate) fn embedding(b: &mut dyn Batch, c: &Call) -> Out {
    if b.is_batched(c.tensor(0)?) {
        return per_element(b, c);
    }
    Ok(all_batched(b.e().call_id(c.op, c.args.to_vec())?.to_vec()))
}

/// `mm`, `bmm`, `matmul`: batched 1-d operands made matrices, ranks
/// aligned, then `matmul` (which broadcasts leading dimensions).
pub(crate) fn matmul(b: &mut dyn Batch, c: &Call) -> Out {
    let (x, y) = (c.tensor(0)?, c.tensor(1)?);
    let (rx, ry) = (b.lrank(x), b.lrank(y));
    let (xb, yb) = (b.is_batched(x), b.is_batched(y));
    let x2 = if xb && rx == 1 {
        b.e().unsqueeze(x, 1)?
    } else {
        x
    };
    let y2 = if yb && ry == 1 {
        b.e().unsqueeze(y, 2)?
    } else {
        y
    };
    b.mark(x2, xb);
    b.mark(y2, yb);
    let (lx, ly) = (b.lrank(x2), b.lrank(y2));
    let rank = [(lx, xb || lx >= 2), (ly, yb || ly >= 2)]
        .iter()
        .filter(|p| p.1)
        .map(|p| p.0)
        .max()
        .unwrap_or(2);
    let x3 = if lx >= 2 { b.align(x2, rank)? } else { x2 };
    let y3 = if ly >= 2 { b.align(y2, rank)? } else { y2 };
    let mut r = b.e().call("matmul", vec![t(x3), t(y3)])?;
    let rr = b.e().rank(r) as i64;
    if yb && ry == 1 {
        r = b.e().call("squeeze_copy", vec![t(r), int(rr - 1)])?;
    }
    if xb && rx == 1 {
        let rr = b.e().rank(r) as i64;
        r = b.e().call(
            "squeeze_copy",
            vec![t(r), int(if ry == 1 && yb { rr - 1 } else { rr - 2 })],
        )?;
    }
    Ok(vec![(r, true)])
}

/// `addmm`/`baddbmm`: `beta * self + alpha * matmul(m1, m2)`, batched.
pub(crate) fn addmm(b: &mut dyn Batch, c: &Call) -> Out {
    let (s, m1, m2) = (c.tensor(0)?, c.tensor(1)?, c.tensor(2)?);
    let p = b.call("matmul", vec![t(m1), t(m2)])?;
    let alpha = c.args.get(4).cloned().unwrap_or(Arg::Int(1));
    let beta = c.args.get(3).cloned().unwrap_or(Arg::Int(1));
    let p = b.call("mul", vec![t(p), alpha])?;
    let sb = b.call("mul", vec![t(s), beta])?;
    let r = b.call("add", vec![t(sb), t(p)])?;
    Ok(vec![(r, b.is_batched(r))])
}

pub(crate) fn linear(b: &mut dyn Batch, c: &Call) -> Out {
    let (x, w) = (c.tensor(0)?, c.tensor(1)?);
    let bias = c.opt_tensor(2);
    if !b.is_batched(w) && !bias.is_some_and(|v| b.is_batched(v)) {
        return Ok(all_batched(b.e().call_id(c.op, c.args.to_vec())?.to_vec()));
    }
    let wt = b.call("transpose_copy", vec![t(w), int(0), int(1)])?;
    let mut r = b.call("matmul", vec![t(x), t(wt)])?;
    if let Some(bias) = bias {
        r = b.call("add", vec![t(r), t(bias)])?;
    }
    Ok(vec![(r, true)])
}

pub(crate) fn layer_norm(b: &mut dyn Batch, c: &Call) -> Out {
    let x = c.tensor(0)?;
    let (w, bias) = (c.opt_tensor(2), c.opt_tensor(3));
    let affine_batched =
        w.is_some_and(|v| b.is_batched(v)) || bias.is_some_and(|v| b.is_batched(v));
    if !affine_batched {
        let x = b.materialize(x)?;
        let mut args = c.args.to_vec();
        args[0] = t(x);
        return Ok(all_batched(b.e().call_id(c.op, args)?.to_vec()));
    }
    let x = b.materialize(x)?;
    let mut args = c.args.to_vec();
    args[0] = t(x);
    args[2] = Arg::None;
    args[3] = Arg::None;
    let mut r = b.e().call_id(c.op, args)?[0];
    b.mark(r, true);
    if let Some(w) = w {
        r = b.call("mul", vec![t(r), t(w)])?;
    }
    if let Some(bias) = bias {
        r = b.call("add", vec![t(r), t(bias)])?;
    }
    Ok(vec![(r, true)])
}

pub(crate) fn attention(b: &mut dyn Batch, c: &Call) -> Out {
    let rank = (0..3)
        .map(|i| c.tensor(i).map(|v| b.lrank(v)))
        .collect::<R<Vec<_>>>()?;
    let r = rank.into_iter().max().unwrap_or(2);
    let mut args = c.args.to_vec();
    for (i, a) in c.args.iter().enumerate().take(4) {
        if let Arg::Tensor(v) = a {
            let al = b.align(*v, r)?;
            args[i] = t(if i < 3 { b.materialize(al)? } else { al });
        }
    }
    Ok(all_batched(b.e().call_id(c.op, args)?.to_vec()))
}

/// `max` / `min`: along a dim (values and indices), or of everything
/// (`amax` / `amin` over the logical dims).
pub(crate) fn max_min(b: &mut dyn Batch, c: &Call) -> Out {
    if matches!(c.args.get(1), Some(Arg::Int(_))) {
        dim1(b, c)
    } else {
        let x = c.tensor(0)?;
        let all: Vec<i64> = (1..=b.lrank(x) as i64).collect();
        let high = matches!(c.op.def().lowering, Lowering::Extreme { high: true, .. });
        let op = if high { "amax" } else { "amin" };
        if all.is_empty() {
            return Ok(vec![(x, true)]);
        }
        Ok(vec![(
            b.e().call(op, vec![t(x), ints(&all), Arg::Bool(false)])?,
            true,
        )])
    }
}
