//! Functionalization time on random programs of 1k, 10k and 100k
//! statements, both modes: time per program and statements per second.
//! It must grow linearly.
//!
//!     cargo bench --bench functionalize

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use kiln::functionalize::random::{random_program, Seeded};
use kiln::functionalize::{functionalize, Remove};

fn bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("functionalize");
    group.sample_size(10);
    for n in [1_000usize, 10_000, 100_000] {
        let g = random_program(&mut Seeded(42), n);
        group.throughput(Throughput::Elements(g.order.len() as u64));
        for (name, mode) in [
            ("mutations", Remove::Mutations),
            ("mutations_and_views", Remove::MutationsAndViews),
        ] {
            group.bench_with_input(BenchmarkId::new(name, n), &g, |b, g| {
                b.iter(|| functionalize(g, mode).expect("random programs functionalize"))
            });
        }
    }
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
