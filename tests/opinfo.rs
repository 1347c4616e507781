//! PyTorch's own op database as one-op programs (`tests/fixtures/opinfo/`,
//! written by `tests/torch_ref/opinfo_sweep.py --write-fixtures`: the
//! first float32 sample of every exportable OpInfo, exported with
//! `torch.export` and run eagerly). Each archive either runs on the
//! reference backend and matches eager (outputs and the inputs it writes),
//! or is refused with an error that names the reason; never a panic. A
//! sample the sweep ran that Kiln refuses now is a regression.

mod common;

use common::root;
use std::path::PathBuf;

/// The sweep's tolerance: `ATOL + RTOL * |want|`, NaN equal to NaN.
const ATOL: f64 = 1e-4;
const RTOL: f64 = 1e-4;

fn dir() -> PathBuf {
    root().join("tests/fixtures/opinfo")
}

/// Runs fixture `name`: `Ok(true)` when it runs and matches eager,
/// `Ok(false)` when Kiln refuses it, `Err` when it runs but differs.
fn check(name: &str, values: bool) -> Result<bool, String> {
    let d = dir();
    let imp = match kiln::import::open(&d.join(format!("{name}.pt2"))) {
        Ok(i) => i,
        Err(e) => {
            let m = e.to_string();
            assert!(!m.is_empty(), "{name}: an empty refusal");
            return Ok(false);
        }
    };
    let out = std::env::temp_dir().join(format!(
        "kiln-opinfo-{}-{name}.safetensors",
        std::process::id()
    ));
    let inputs = d.join(format!("{name}.inputs.safetensors"));
    if let Err(e) = kiln::import::run(&imp, &imp.graph, &inputs, &out, false) {
        assert!(!e.is_empty(), "{name}: an empty refusal");
        return Ok(false);
    }
    let got = kiln::io::load_all(&out).map_err(|e| e.to_string())?;
    let _ = std::fs::remove_file(&out);
    let want = kiln::io::load_all(&d.join(format!("{name}.expected.safetensors")))
        .map_err(|e| e.to_string())?;
    for (n, w) in &want {
        let Some((_, g)) = got.iter().find(|(k, _)| k == n) else {
            return Err(format!("{name}: no `{n}` in Kiln's results"));
        };
        if g.sizes() != w.sizes() {
            return Err(format!(
                "{name}: `{n}` has sizes {:?}, eager {:?}",
                g.sizes(),
                w.sizes()
            ));
        }
        if !values {
            continue;
        }
        for (i, (x, y)) in g.values().iter().zip(w.values()).enumerate() {
            let same = x == &y || (x.is_nan() && y.is_nan());
            if !same && (x - y).abs() > ATOL + RTOL * y.abs() {
                return Err(format!("{name}: `{n}`[{i}] is {x}, eager {y}"));
            }
        }
    }
    Ok(true)
}

#[test]
fn opinfo_samples_run_as_eager_or_are_refused() {
    let text = std::fs::read_to_string(dir().join("summary.json")).unwrap();
    let summary: serde_json::Value = serde_json::from_str(&text).unwrap();
    let fixtures = summary["fixtures"].as_object().unwrap();
    let mut wrong = vec![];
    let (mut ok, mut refused) = (0, 0);
    let mut regressed = vec![];
    for (name, f) in fixtures {
        let values = f["values"].as_bool().unwrap_or(true);
        let has_expected = dir().join(format!("{name}.expected.safetensors")).exists();
        if !has_expected {
            continue;
        }
        match check(name, values) {
            Ok(true) => ok += 1,
            Ok(false) => {
                refused += 1;
                if f["status"] == "ok" {
                    regressed.push(name.clone());
                }
            }
            Err(e) => wrong.push(e),
        }
    }
    assert!(
        wrong.is_empty(),
        "{} samples differ from eager:\n{}",
        wrong.len(),
        wrong.join("\n")
    );
    assert!(
        regressed.is_empty(),
        "samples the sweep ran are refused now: {regressed:?}"
    );
    eprintln!("opinfo fixtures: {ok} run as eager does, {refused} refused");
    assert!(ok > 0, "no OpInfo sample runs");
}
