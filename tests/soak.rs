//! Short soak runs (the long ones: `kiln soak`, `minilm --soak`): one
//! session, several threads, programs alternating. Nothing the device
//! holds may grow after the warm-up, resident memory stays within a few
//! MiB, and every run returns exactly what the first returned.

use kiln::engine::Session;
use kiln::minilm::{fetch, MiniLm};
use kiln::soak::{soak, Job, SoakReport};

/// One soak at a time: resident memory is the process's, and the other
/// test's model loading would show in it.
static ONE: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn session() -> Session {
    Session::open().unwrap_or_else(|e| panic!("the soak tests need a wgpu adapter: {e}"))
}

fn check(r: &SoakReport, runs: u64) {
    eprintln!("{}", r.to_text());
    assert_eq!(r.runs, runs);
    assert_eq!(r.mismatches, 0, "outputs changed between runs");
    assert!(
        r.warm.held.buffers > 0,
        "no device counters: {:?}",
        r.warm.held
    );
    assert_eq!(
        r.end.held, r.warm.held,
        "the device holds more after the warm-up"
    );
    // A leak of a kilobyte a run would show as tens of MiB here.
    assert!(
        r.rss_growth() < 8 << 20,
        "resident memory grew {} bytes",
        r.rss_growth()
    );
}

#[test]
fn small_programs_run_twenty_thousand_times_flat() {
    let _one = ONE.lock().unwrap_or_else(|e| e.into_inner());
    let session = session();
    let srcs = [
        "graph a(%x: f32[4, 6], %y: f32[6]) {\n  %s = add(%x, %y)\n  %t = tanh(%s)\n  %m = sum(%t, [1])\n  return (%t, %m)\n}",
        "graph b(%x: f32[8, 8], %w: f32[8, 8]) {\n  %p = matmul(%x, %w)\n  %r = relu(%p)\n  %q = add_(%x, %r)\n  return %q\n}",
    ];
    let jobs: Vec<Job> = srcs
        .iter()
        .map(|src| {
            let g = kiln::parse(src).unwrap();
            let exe = session.compile(&g).unwrap();
            let inputs = kiln::profile::random_inputs(&g, &exe.input_params(), 7);
            Job {
                name: g.name.clone(),
                exe,
                inputs,
            }
        })
        .collect();
    let r = soak(&session, &jobs, 20_000, 3, &|_| {}).unwrap();
    check(&r, 20_000);
}

#[test]
fn minilm_runs_flat_across_alternating_buckets() {
    let _one = ONE.lock().unwrap_or_else(|e| e.into_inner());
    let session = session();
    let dir = fetch(None).unwrap_or_else(|e| panic!("fetching the model: {e}"));
    let mut model = MiniLm::load(&dir).unwrap();
    let jobs = kiln::soak::minilm_jobs(
        &mut model,
        &session,
        &[
            "A man is playing a guitar.",
            "The stock market fell sharply today.",
        ],
        &[(1, 8), (2, 16)],
    )
    .unwrap();
    let r = soak(&session, &jobs, 40, 2, &|_| {}).unwrap();
    check(&r, 40);
}
