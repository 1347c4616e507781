//! Soak runs: one session runs compiled programs many times from several
//! threads, and says whether anything grows or stalls. Resident memory
//! (the process's) and what the device holds (`Gpu::held`: buffers, their
//! bytes, bind groups, pipelines) are read after a warm-up and at the
//! end; every run's outputs must equal the first run's bit for bit; the
//! longest run is reported beside the median. `kiln soak` and `minilm
//! --soak` drive it; a test runs a short one in CI.

use kiln_engine::{EngineError, Executable, Fetch, Held, HostTensor, Input, Session};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// A compiled program and the inputs each of its runs uploads.
pub struct Job {
    pub name: String,
    pub exe: Arc<Executable>,
    pub inputs: Vec<HostTensor<'static>>,
}

/// Memory at one moment of a soak.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Sample {
    /// Runs finished when it was taken.
    pub runs: u64,
    /// The process's resident set (`/proc/self/statm`; 0 where there is
    /// none).
    pub rss_bytes: u64,
    pub held: Held,
}

#[derive(Clone, Debug)]
pub struct SoakReport {
    pub runs: u64,
    pub threads: usize,
    pub jobs: Vec<String>,
    /// After the warm-up (a tenth of the runs) and at the end.
    pub warm: Sample,
    pub end: Sample,
    pub seconds: f64,
    pub median_ms: f64,
    pub max_ms: f64,
    /// Runs taking more than 10 times the median (and 50 ms more).
    pub stalls: u64,
    /// Runs whose outputs differed from the first run of their job.
    pub mismatches: u64,
}

impl SoakReport {
    /// Resident growth from the warm-up to the end, in bytes (negative:
    /// shrank).
    pub fn rss_growth(&self) -> i64 {
        self.end.rss_bytes as i64 - self.warm.rss_bytes as i64
    }

    pub fn to_text(&self) -> String {
        let mib = |b: u64| b as f64 / (1 << 20) as f64;
        let held = |h: &Held| {
            format!(
                "{} buffers ({:.1} MiB), {} bind groups, {} pipelines",
                h.buffers,
                h.buffer_bytes as f64 / (1 << 20) as f64,
                h.bind_groups,
                h.pipelines
            )
        };
        format!(
            "soak: {} runs of {} on {} threads in {:.1} s ({:.0} runs/s)\n\
             after warm-up ({} runs): resident {:.1} MiB; device: {}\n\
             at the end ({} runs):    resident {:.1} MiB; device: {}\n\
             resident growth {:+.2} MiB; run time median {:.3} ms, max {:.3} ms; {} stalls (> 10x median); {} mismatched outputs",
            self.runs,
            self.jobs.join(", "),
            self.threads,
            self.seconds,
            self.runs as f64 / self.seconds.max(1e-9),
            self.warm.runs,
            mib(self.warm.rss_bytes),
            held(&self.warm.held),
            self.end.runs,
            mib(self.end.rss_bytes),
            held(&self.end.held),
            self.rss_growth() as f64 / (1 << 20) as f64,
            self.median_ms,
            self.max_ms,
            self.stalls,
            self.mismatches,
        )
    }
}

/// The process's resident set in bytes (Linux), else 0.
pub fn resident_bytes() -> u64 {
    std::fs::read_to_string("/proc/self/statm")
        .ok()
        .and_then(|s| s.split_whitespace().nth(1)?.parse::<u64>().ok())
        .map_or(0, |pages| pages * 4096)
}

/// Run times in buckets 5% apart, from 1 us: the median and the stall
/// count without keeping a time per run.
struct Times {
    counts: Vec<u64>,
    max_ms: f64,
}

const BUCKET: f64 = 1.05;

impl Times {
    fn new() -> Times {
        Times {
            counts: vec![0; 600],
            max_ms: 0.0,
        }
    }

    fn add(&mut self, ms: f64) {
        let b = ((ms * 1e3).max(1.0).ln() / BUCKET.ln()) as usize;
        let last = self.counts.len() - 1;
        self.counts[b.min(last)] += 1;
        self.max_ms = self.max_ms.max(ms);
    }

    fn merge(&mut self, o: &Times) {
        for (a, b) in self.counts.iter_mut().zip(&o.counts) {
            *a += b;
        }
        self.max_ms = self.max_ms.max(o.max_ms);
    }

    /// The upper edge of bucket `b`, in ms.
    fn edge(b: usize) -> f64 {
        BUCKET.powi(b as i32 + 1) / 1e3
    }

    fn median_ms(&self) -> f64 {
        let total: u64 = self.counts.iter().sum();
        let mut seen = 0;
        for (b, &c) in self.counts.iter().enumerate() {
            seen += c;
            if seen * 2 >= total && c > 0 {
                // The bucket's upper edge, at most the longest run seen.
                return Times::edge(b).min(self.max_ms);
            }
        }
        0.0
    }

    fn above_ms(&self, ms: f64) -> u64 {
        self.counts
            .iter()
            .enumerate()
            .filter(|(b, _)| b.checked_sub(1).map_or(0.0, Times::edge) > ms)
            .map(|(_, &c)| c)
            .sum()
    }
}

/// Each job's outputs as bytes, from one run.
fn outputs(session: &Session, job: &Job) -> Result<Vec<Vec<u8>>, EngineError> {
    let inputs: Vec<Input> = job.inputs.iter().map(Input::Host).collect();
    let r = session.run(
        &job.exe,
        &inputs,
        &job.exe.options(Fetch::Host, Fetch::Host),
    )?;
    Ok(r.outputs
        .into_iter()
        .chain(r.mutated.into_iter().map(|(_, o)| o))
        .map(|o| o.host().map(|h| h.bytes().to_vec()).unwrap_or_default())
        .collect())
}

/// Runs the jobs `runs` times in all on `threads` threads, each thread
/// taking them in turn (so the programs alternate), and reports memory
/// after the first tenth and at the end. `progress` hears the count of
/// finished runs now and then.
pub fn soak(
    session: &Session,
    jobs: &[Job],
    runs: u64,
    threads: usize,
    progress: &(dyn Fn(u64) + Sync),
) -> Result<SoakReport, EngineError> {
    let threads = threads.max(1);
    // Run buffers for every thread up front: the pool then never grows.
    for j in jobs {
        j.exe
            .reserve_runs(threads, &j.exe.options(Fetch::Host, Fetch::Host))?;
    }
    let first: Vec<Vec<Vec<u8>>> = jobs
        .iter()
        .map(|j| outputs(session, j))
        .collect::<Result<_, _>>()?;
    let done = AtomicU64::new(0);
    let mismatches = AtomicU64::new(0);
    let times = Mutex::new(Times::new());
    let error: Mutex<Option<EngineError>> = Mutex::new(None);
    let sample = |n: u64| Sample {
        runs: n,
        rss_bytes: resident_bytes(),
        held: session.gpu().held(),
    };
    // `count` runs on the threads, each taking the jobs in turn; returns
    // when all are done (memory is then read with nothing in flight).
    let phase = |count: u64| {
        std::thread::scope(|s| {
            for t in 0..threads {
                let (done, mismatches, times, error, first) =
                    (&done, &mismatches, &times, &error, &first);
                s.spawn(move || {
                    let mut mine = Times::new();
                    let share =
                        count / threads as u64 + u64::from((t as u64) < count % threads as u64);
                    for i in 0..share {
                        if error.lock().map(|e| e.is_some()).unwrap_or(true) {
                            break;
                        }
                        let k = (i as usize + t) % jobs.len();
                        let t0 = Instant::now();
                        match outputs(session, &jobs[k]) {
                            Ok(o) => {
                                mine.add(t0.elapsed().as_secs_f64() * 1e3);
                                if o != first[k] {
                                    mismatches.fetch_add(1, Ordering::Relaxed);
                                }
                            }
                            Err(e) => {
                                if let Ok(mut slot) = error.lock() {
                                    slot.get_or_insert(e);
                                }
                                break;
                            }
                        }
                        let n = done.fetch_add(1, Ordering::Relaxed) + 1;
                        if n.is_multiple_of((runs / 20).max(1)) {
                            progress(n);
                        }
                    }
                    if let Ok(mut all) = times.lock() {
                        all.merge(&mine);
                    }
                });
            }
        })
    };
    let start = Instant::now();
    let warm_runs = (runs / 10).max((threads * jobs.len()) as u64).min(runs);
    phase(warm_runs);
    let warm = sample(done.load(Ordering::Relaxed));
    phase(runs - warm_runs);
    if let Some(e) = error.into_inner().unwrap_or_else(|e| e.into_inner()) {
        return Err(e);
    }
    let seconds = start.elapsed().as_secs_f64();
    let end = sample(done.load(Ordering::Relaxed));
    let times = times.into_inner().unwrap_or_else(|e| e.into_inner());
    let median_ms = times.median_ms();
    Ok(SoakReport {
        runs: end.runs,
        threads,
        jobs: jobs.iter().map(|j| j.name.clone()).collect(),
        warm,
        end,
        seconds,
        median_ms,
        max_ms: times.max_ms,
        stalls: times.above_ms((median_ms * 10.0).max(median_ms + 50.0)),
        mismatches: mismatches.into_inner(),
    })
}

/// MiniLM's jobs: one per bucket `(batch, tokens)`, the sentences repeated
/// to fill the batch and cut to the tokens; the weights uploaded once
/// (session constants), each run uploading only ids and mask.
pub fn minilm_jobs(
    model: &mut crate::minilm::MiniLm,
    session: &Session,
    sentences: &[&str],
    buckets: &[(usize, usize)],
) -> Result<Vec<Job>, crate::minilm::ModelError> {
    use crate::minilm::{MiniLm, ModelError};
    model.upload_weights(session)?;
    let mut jobs = vec![];
    for &(batch, seq) in buckets {
        let ids = (0..batch)
            .map(|i| {
                let mut t = model.tokenize(sentences[i % sentences.len().max(1)])?;
                crate::minilm::fit(&mut t, seq);
                Ok(t)
            })
            .collect::<Result<Vec<_>, ModelError>>()?;
        let [id, mask] = MiniLm::token_inputs(&ids, batch, seq)?;
        jobs.push(Job {
            name: format!("MiniLM {batch}x{seq}"),
            exe: session.compile(model.graph(batch, seq)?)?,
            inputs: vec![id, mask],
        });
    }
    Ok(jobs)
}
