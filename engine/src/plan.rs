//! The memory planner: intermediates share one arena, placed greedily by
//! size (Pisarchyk & Lee 2020, "greedy by size for offset calculation"):
//! largest first, each at the lowest offset that overlaps no placed buffer
//! whose lifetime intersects its own.

/// A buffer to place: its size and the steps (kernel indices) during which
/// it must hold its contents, inclusive.
#[derive(Clone, Debug)]
pub struct Request {
    pub bytes: usize,
    pub first: usize,
    pub last: usize,
}

#[derive(Clone, Debug, Default)]
pub struct MemoryPlan {
    /// Byte offset of each request in the arena.
    pub offsets: Vec<usize>,
    /// Arena size: the planned peak of intermediates.
    pub arena_bytes: usize,
    /// The most bytes of requests alive at one step: no plan can do better.
    pub lower_bound: usize,
    /// One buffer per request, none reused.
    pub naive: usize,
}

pub fn plan(requests: &[Request], align: usize) -> MemoryPlan {
    let align = align.max(1);
    let round = |b: usize| b.div_ceil(align) * align;
    let mut order: Vec<usize> = (0..requests.len()).collect();
    order.sort_by(|&a, &b| requests[b].bytes.cmp(&requests[a].bytes).then(a.cmp(&b)));
    let mut offsets = vec![0; requests.len()];
    let mut placed: Vec<usize> = vec![];
    let mut arena = 0;
    for i in order {
        let r = &requests[i];
        let size = round(r.bytes);
        // Intervals taken by placed buffers that are alive at the same time.
        let mut taken: Vec<(usize, usize)> = placed
            .iter()
            .filter(|&&j| requests[j].first <= r.last && r.first <= requests[j].last)
            .map(|&j| (offsets[j], offsets[j] + round(requests[j].bytes)))
            .collect();
        taken.sort();
        let mut at = 0;
        for (s, e) in taken {
            if at + size <= s {
                break;
            }
            at = at.max(e);
        }
        offsets[i] = at;
        // Offsets are aligned; the arena ends at the last word in use.
        arena = arena.max(at + r.bytes.div_ceil(4) * 4);
        placed.push(i);
    }
    let steps = requests.iter().map(|r| r.last + 1).max().unwrap_or(0);
    let mut live = vec![0usize; steps];
    for r in requests {
        for l in &mut live[r.first..=r.last] {
            *l += r.bytes;
        }
    }
    MemoryPlan {
        offsets,
        arena_bytes: arena,
        lower_bound: live.into_iter().max().unwrap_or(0),
        naive: requests.iter().map(|r| round(r.bytes)).sum(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chains_reuse_memory() {
        // a -> b -> c -> d: each buffer lives from its kernel to the next.
        let reqs: Vec<Request> = (0..4)
            .map(|i| Request {
                bytes: 1000,
                first: i,
                last: i + 1,
            })
            .collect();
        let p = plan(&reqs, 16);
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
