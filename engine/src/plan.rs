//! The memory planner: intermediates share one arena, placed greedily by
//! size (Pisarchyk & Lee 2020, "greedy by size for offset calculation"):
//! largest first, each at the lowest offset that overlaps no placed buffer
//! whose lifetime intersects its own.

use std::collections::HashSet;

/// A buffer to place: its size, the steps (kernel indices) during which
/// it must hold its contents, inclusive, and the alignment of its offset.
#[derive(Clone, Debug)]
pub struct Request {
    pub bytes: usize,
    pub first: usize,
    pub last: usize,
    pub align: usize,
    /// Bound by a binding of its own wherever a kernel binds it (a vector
    /// array, or one too large to share): buffers bound with it stay out
    /// of its binding windows. Others bound together may share windows:
    /// codegen binds overlapping windows as one binding
    /// (`lower::binding_windows`).
    pub own_window: bool,
}

#[derive(Clone, Debug, Default)]
pub struct MemoryPlan {
    /// Byte offset of each request in the arena.
    pub offsets: Vec<usize>,
    /// Arena size: the planned peak of intermediates.
    pub arena_bytes: usize,
    /// The most bytes of requests alive at once: no plan can do better.
    pub lower_bound: usize,
    /// One buffer per request, none reused.
    pub naive: usize,
}

/// Places `requests`. Requests one kernel binds together (a set of
/// `bound` each), one of them with a window of its own, keep their binding
/// windows apart: a binding starts at the offset rounded down to `window`
/// bytes, and no binding of a dispatch may overlap a writable one, so such
/// a pair never shares a `window`-aligned block.
pub fn plan(requests: &[Request], window: usize, bound: &[Vec<usize>]) -> MemoryPlan {
    let window = window.max(1);
    let up = |b: usize, a: usize| b.div_ceil(a.max(1)) * a.max(1);
    let mut together: HashSet<(usize, usize)> = HashSet::new();
    for set in bound {
        for &a in set {
            for &b in set {
                if a != b && (requests[a].own_window || requests[b].own_window) {
                    together.insert((a, b));
                }
            }
        }
    }
    // First fit in a few orders (largest first, longest-lived first, by
    // first step, largest in bytes x steps first, most aligned first and of
    // those the ones whose size is no multiple of their alignment last, so
    // that only word-aligned ones follow them): the smallest arena wins,
    // the first order on ties.
    let keys: [OrderKey; 5] = [
        |r| (usize::MAX - r.bytes, 0),
        |r| (usize::MAX - span(r), usize::MAX - r.bytes),
        |r| (r.first, usize::MAX - r.bytes),
        |r| (usize::MAX - r.bytes.saturating_mul(span(r)), 0),
        |r| {
            let ragged = usize::from(r.bytes % r.align.max(1) != 0);
            (usize::MAX - 2 * r.align + ragged, usize::MAX - r.bytes)
        },
    ];
    let steps = requests.iter().map(|r| r.last + 1).max().unwrap_or(0);
    let mut live = vec![0usize; steps];
    for r in requests {
        for l in &mut live[r.first..=r.last] {
            *l += r.bytes;
        }
    }
    let lower_bound = live.into_iter().max().unwrap_or(0);
    let mut best: Option<(usize, Vec<usize>)> = None;
    let keep = |order: &[usize], best: &mut Option<(usize, Vec<usize>)>| {
        let (arena, offsets) = first_fit(requests, order, window, &together);
        if best.as_ref().is_none_or(|(a, _)| arena < *a) {
            *best = Some((arena, offsets));
        }
    };
    for key in keys {
        let mut order: Vec<usize> = (0..requests.len()).collect();
        order.sort_by_key(|&i| (key(&requests[i]), i));
        keep(&order, &mut best);
    }
    // A few buffers: every order, until one meets the lower bound (binding
    // windows and alignment leave gaps no greedy order may avoid).
    if requests.len() <= EVERY_ORDER {
        let mut order: Vec<usize> = (0..requests.len()).collect();
        let mut c = vec![0; order.len()];
        let mut i = 0;
        while i < order.len() && best.as_ref().is_some_and(|(a, _)| *a > lower_bound) {
            if c[i] < i {
                order.swap(if i % 2 == 0 { 0 } else { c[i] }, i);
                keep(&order, &mut best);
                c[i] += 1;
                i = 0;
            } else {
                c[i] = 0;
                i += 1;
            }
        }
    }
    let (arena, offsets) = best.unwrap_or_default();
    MemoryPlan {
        offsets,
        arena_bytes: arena,
        lower_bound,
        naive: requests.iter().map(|r| up(r.bytes, window)).sum(),
    }
}

/// Plans of at most this many buffers try every placement order (Heap's
/// algorithm: 5040 first fits at most).
const EVERY_ORDER: usize = 7;

/// A placement order: requests by increasing key.
type OrderKey = fn(&Request) -> (usize, usize);

/// Steps a request lives.
fn span(r: &Request) -> usize {
    r.last + 1 - r.first
}

/// Each request in `order` at the lowest offset free of the buffers placed
/// before it that live at the same time (for one bound with it, their whole
/// binding windows): the arena's end and the offsets.
fn first_fit(
    requests: &[Request],
    order: &[usize],
    window: usize,
    together: &HashSet<(usize, usize)>,
) -> (usize, Vec<usize>) {
    let up = |b: usize, a: usize| b.div_ceil(a.max(1)) * a.max(1);
    let down = |b: usize| b / window * window;
    let mut offsets = vec![0; requests.len()];
    let mut placed: Vec<usize> = vec![];
    let mut arena = 0;
    for &i in order {
        let r = &requests[i];
        let size = up(r.bytes.max(1), 4);
        // Intervals taken by placed buffers alive at the same time: their
        // bytes, or for one bound with it, their whole binding window.
        let mut taken: Vec<(usize, usize)> = placed
            .iter()
            .filter(|&&j| requests[j].first <= r.last && r.first <= requests[j].last)
            .map(|&j| {
                let (o, e) = (offsets[j], offsets[j] + up(requests[j].bytes.max(1), 4));
                if together.contains(&(i, j)) {
                    (down(o), up(e, window))
                } else {
                    (o, e)
                }
            })
            .collect();
        taken.sort();
        let mut at = 0;
        for (s, e) in taken {
            if at + size <= s {
                break;
            }
            at = up(at.max(e), r.align);
        }
        offsets[i] = at;
        // The arena ends at the last word in use.
        arena = arena.max(at + size);
        placed.push(i);
    }
    (arena, offsets)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tensors_bound_together_keep_their_binding_windows_apart() {
        let req = |bytes| Request {
            bytes,
            first: 0,
            last: 1,
            align: 16,
            own_window: true,
        };
        let reqs = [req(20), req(20), req(8)];
        // Apart: packed at 16 bytes, the 8 first (68 bytes; the 20s
        // first would end at 72).
        assert_eq!(plan(&reqs, 256, &[]).offsets, vec![16, 48, 0]);
        // 0 and 1 bound by one kernel: 1 starts a window of its own; 2,
        // bound with neither, fills the gap.
        let p = plan(&reqs, 256, &[vec![0, 1]]);
        assert_eq!(p.offsets, vec![0, 256, 32]);
        assert_eq!(p.arena_bytes, 276);
        // Without windows of their own, bound together or not, they pack
        // (their kernel binds the shared window once).
        let shared: Vec<Request> = reqs
            .iter()
            .map(|r| Request {
                own_window: false,
                align: 4,
                ..r.clone()
            })
            .collect();
        let p = plan(&shared, 256, &[vec![0, 1]]);
        assert_eq!(p.offsets, vec![0, 20, 40]);
        assert_eq!(p.arena_bytes, 48);
        // One with a window of its own keeps the other out of it.
        let mut mixed = shared.clone();
        mixed[0].own_window = true;
        assert_eq!(plan(&mixed, 256, &[vec![0, 1]]).offsets, vec![0, 256, 20]);
    }

    #[test]
    fn the_best_of_several_orders_is_kept() {
        // Largest first puts the 16 bytes at 0 and the long-lived 12 after
        // them: 40 bytes. Longest-lived first reaches the lower bound, 36.
        let req = |bytes, first, last| Request {
            bytes,
            first,
            last,
            align: 4,
            own_window: false,
        };
        let reqs = [req(16, 0, 1), req(12, 1, 3), req(12, 2, 3), req(12, 2, 3)];
        let p = plan(&reqs, 4, &[]);
        assert_eq!(p.lower_bound, 36);
        assert_eq!(p.arena_bytes, 36, "{p:?}");
    }

    #[test]
    fn ragged_aligned_buffers_go_last() {
        // 28 bytes aligned to 32 first would leave a gap of 4 before the
        // next aligned one; after the word-aligned 36 bytes it ends the
        // arena at the lower bound.
        let req = |bytes, align| Request {
            bytes,
            first: 0,
            last: 0,
            align,
            own_window: false,
        };
        let reqs = [req(28, 32), req(32, 32), req(36, 4)];
        let p = plan(&reqs, 4, &[]);
        assert_eq!(p.lower_bound, 96);
        assert_eq!(p.arena_bytes, 96, "{p:?}");
    }

    #[test]
    fn chains_reuse_memory() {
        // a -> b -> c -> d: each buffer lives from its kernel to the next.
        let reqs: Vec<Request> = (0..4)
            .map(|i| Request {
                bytes: 1000,
                first: i,
                last: i + 1,
                align: 16,
                own_window: true,
            })
            .collect();
        let p = plan(&reqs, 16, &[]);
        assert_eq!(p.lower_bound, 2000);
        assert!(p.arena_bytes <= 2 * 1008, "{p:?}");
        assert_eq!(p.naive, 4 * 1008);
        for (i, a) in reqs.iter().enumerate() {
            for (j, b) in reqs.iter().enumerate() {
                let overlap_time = a.first <= b.last && b.first <= a.last;
                let overlap_space =
                    p.offsets[i] < p.offsets[j] + 1008 && p.offsets[j] < p.offsets[i] + 1008;
                assert!(i == j || !(overlap_time && overlap_space));
            }
        }
    }
}
