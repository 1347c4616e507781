//! How a value written into a view's result reaches the view's input
//! (`OpDef::inverse`, PyTorch's `FunctionalInverses`): the one
//! implementation of each view's write-back, used by the functionalization
//! pass (a mutation through a view) and by the views' gradients (a view's
//! gradient is the cotangent written back into zeros).

use super::{lookup, views, Inverse, OpId};
use crate::meta::{wrap_dim, Meta};
use crate::schema::Arg;

/// What the write-back calls (`None`: the written value is the input's new
/// value itself).
pub type Call<V> = Option<(OpId, Vec<Arg<V>>)>;

impl Inverse {
    /// Writes the child into a copy of the parent (a scatter), rather than
    /// transforming the child alone.
    pub fn needs_parent(self) -> bool {
        matches!(
            self,
            Inverse::Scatter(_)
                | Inverse::Narrow
                | Inverse::Piece
                | Inverse::Unbind
                | Inverse::AsStrided
        )
    }
}

fn op(name: &str) -> Result<OpId, String> {
    lookup(name).ok_or_else(|| format!("internal error: no op {name}"))
}

/// A view applied: `view` with `args` (those after `self`), result `index`.
pub struct ViewStep<'a, V> {
    pub view: OpId,
    pub args: &'a [Arg<V>],
    pub index: usize,
}

/// The call writing `child` (the result of `step` applied to a tensor like
/// `parent_meta`) back into `parent`. `copies`: views in the result are their `_copy`
/// forms (functional programs), else views (`child_meta` decides between
/// `view` and `reshape`). `parent` is needed only where
/// `Inverse::needs_parent`.
pub fn write_back<V: Clone>(
    step: ViewStep<'_, V>,
    parent: Option<V>,
    parent_meta: &Meta,
    child: V,
    child_meta: &Meta,
    copies: bool,
) -> Result<Call<V>, String> {
    let ViewStep { view, args, index } = step;
    let t = Arg::Tensor;
    let inverse = view
        .def()
        .inverse
        .ok_or_else(|| format!("{} has no inverse", view.name()))?;
    let as_view = |v: OpId| {
        if copies {
            v.def().counterpart.unwrap_or(v)
        } else {
            v
        }
    };
    let base = || {
        parent.clone().map(t).ok_or_else(|| {
            format!(
                "internal error: {}'s write-back without a parent",
                view.name()
            )
        })
    };
    let int = |i: usize| match args.get(i) {
        Some(Arg::Int(x)) => Ok(*x),
        _ => Err(format!(
            "internal error: argument {} of {} is not an integer",
            i + 1,
            view.name()
        )),
    };
    let slice = |start: i64, end: i64, d: usize| -> Result<Vec<Arg<V>>, String> {
        Ok(vec![
            base()?,
            t(child.clone()),
            Arg::Int(d as i64),
            Arg::Int(start),
            Arg::Int(end),
            Arg::Int(1),
        ])
    };
    Ok(Some(match inverse {
        Inverse::Scatter(s) => {
            let mut a = vec![base()?, t(child)];
            a.extend(args.iter().cloned());
            (s, a)
        }
        Inverse::Narrow => {
            let d = wrap_dim(int(0)?, parent_meta.dim())?;
            let size = parent_meta.sizes[d] as i64;
            let start = int(1)?;
            let s = if start < 0 { start + size } else { start };
            (op("slice_scatter")?, slice(s, s + int(2)?, d)?)
        }
        Inverse::Piece => {
            // `split` / `chunk`: the piece is a slice of the parent.
            let mut metas: Vec<Arg<&Meta>> = vec![Arg::Tensor(parent_meta)];
            metas.extend(args.iter().map(|x| x.map(&mut |_| parent_meta)));
            let pieces = super::infer(view, &metas)?;
            let d = wrap_dim(int(1)?, parent_meta.dim())?;
            let start: usize = pieces[..index].iter().map(|m| m.sizes[d]).sum();
            let end = start + pieces[index].sizes[d];
            (op("slice_scatter")?, slice(start as i64, end as i64, d)?)
        }
        Inverse::Unbind => (
            op("select_scatter")?,
            vec![base()?, t(child), args[0].clone(), Arg::Int(index as i64)],
        ),
        Inverse::AsStrided => {
            let mut a = vec![base()?, t(child)];
            a.extend(args.iter().cloned());
            (op("as_strided_scatter")?, a)
        }
        Inverse::Involution => {
            let mut a = vec![t(child)];
            a.extend(args.iter().cloned());
            (as_view(view), a)
        }
        Inverse::Permute => {
            let Some(Arg::IntList(dims)) = args.first() else {
                return Err("internal error: permute without dims".into());
            };
            let n = dims.len();
            let mut inv = vec![0i64; n];
            for (i, &d) in dims.iter().enumerate() {
                inv[wrap_dim(d, n)?] = i as i64;
            }
            (as_view(view), vec![t(child), Arg::IntList(inv)])
        }
        Inverse::Unsqueeze => {
            let d = wrap_dim(int(0)?, parent_meta.dim() + 1)?;
            (as_view(op("squeeze")?), vec![t(child), Arg::Int(d as i64)])
        }
        Inverse::Reshape => {
            let sizes = Arg::IntList(parent_meta.sizes.iter().map(|&s| s as i64).collect());
            let name = if copies {
                "view_copy"
            } else if views::compute_stride(
                &child_meta.sizes,
                &child_meta.strides,
                &parent_meta.sizes,
            )
            .is_some()
            {
                "view"
            } else {
                "reshape"
            };
            (op(name)?, vec![t(child), sizes])
        }
        Inverse::Identity => return Ok(None),
    }))
}
