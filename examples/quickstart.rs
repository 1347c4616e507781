//! Trace a small program that uses views and in-place mutation from Rust,
//! print it in Kiln's text format, and run it on the eager reference
//! interpreter.
//!
//!     cargo run --example quickstart

use kiln::functionalize::{DType, RTensor, TensorSpec};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let graph = kiln::trace(
        "quickstart",
        &[
            TensorSpec::new("x", DType::F32, &[3, 4]),
            TensorSpec::new("bias", DType::F32, &[4]),
        ],
        |p| {
            let (x, bias) = (&p[0], &p[1]);
            let y = x.clone_tensor(); // a private copy we may mutate
            y.select(0, 1).add_(10.0); // write row 1 through a view
            let col = y.t().select(0, 2); // column 2, via a transposed view
            col.mul_(-1.0); // visible in y
            x.slice(1, Some(0), None, 2).zero_(); // mutate the input through a strided view
            let z = (&y + bias).relu().sum(&[1], false);
            vec![y, z]
        },
    )?;
    println!("{}", kiln::print(&graph));

    let x = RTensor::new(
        DType::F32,
        vec![3, 4],
        &(0..12).map(|i| i as f64).collect::<Vec<_>>(),
    );
    let bias = RTensor::new(DType::F32, vec![4], &[0.5, -100.0, 0.0, 1.0]);
    let r = kiln::run(&graph, vec![x, bias])?;
    println!("y      = {:?}", r.outputs[0].values());
    println!("z      = {:?}", r.outputs[1].values());
    println!(
        "x' (the input, mutated in place) = {:?}",
        r.inputs[0].values()
    );
    println!(
        "peak live storage in eager execution: {} bytes",
        r.peak_bytes
    );
    Ok(())
}
