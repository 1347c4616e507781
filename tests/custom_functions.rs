//! Custom functions (`kiln::functionalize::custom`): the three examples of
//! PyTorch's "Extending torch.func with autograd.Function"
//! (`examples/custom_function.rs`) against PyTorch's values
//! (`tests/fixtures/custom_function_values.json`, from
//! `tests/torch_ref/custom_function_values.py`); every rule against finite
//! differences or a loop over the batch; the text format; the refusals.

mod common;
#[path = "../examples/custom_function.rs"]
mod custom_function;

use common::fd::{check_jvp, check_vjp, check_vmap};
use kiln::functionalize::custom::{self, Ctx, Function};
use kiln::functionalize::meta::Meta;
use kiln::functionalize::schema::Arg;
use kiln::functionalize::transform::emit::R;
use kiln::functionalize::transform::{grad, jvp, vjp, vmap};
use kiln::functionalize::{functionalize, parse, print, DType, RTensor, Remove, ValueId};
use std::sync::Arc;

#[test]
fn the_example_gives_pytorchs_values() {
    check_values(custom_function::Backend::Reference);
}

/// On the GPU: the sort, take and cube forwards run as their own WGSL
/// kernels between Kiln's.
#[test]
fn the_example_gives_pytorchs_values_on_the_gpu() {
    check_values(custom_function::Backend::Gpu);
}

fn check_values(backend: custom_function::Backend) {
    let p = common::root().join("tests/fixtures/custom_function_values.json");
    let want: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap();
    let got = custom_function::values(backend).unwrap();
    assert_eq!(got.len(), want.as_object().unwrap().len());
    for (k, t) in got {
        let w: Vec<f64> = want[k]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|r| r.as_array().unwrap().iter().map(|x| x.as_f64().unwrap()))
            .collect();
        assert_eq!(t.sizes(), &[2, 4], "{k}");
        for (a, b) in t.values().iter().zip(&w) {
            assert!(
                (a - b).abs() <= 1e-6 * (1.0 + b.abs()),
                "{k}: {:?} vs PyTorch {w:?}",
                t.values()
            );
        }
    }
}

const SORT: &str = "graph s(%x: f32[3, 5]) { %v, %i, %j = mylib::numpy_sort(%x, -1) %y = mul(%v, %v) return (%y) }";
const SORT_COLUMNS: &str = "graph s(%x: f32[3, 5]) { %t = transpose(%x, 0, 1) %v, %i, %j = mylib::numpy_sort(%t, 1) %k, %l, %m = mylib::numpy_sort(%x, 0) %z = mylib::numpy_take(%x, %l, %m, 0) %w = mul(%z, %k) return (%v, %w) }";
const CUBE: &str =
    "graph c(%x: f32[2, 3]) { %y, %d = mylib::my_cube(%x) %z = mul(%y, %d) return (%z, %d) }";
const CUBE_GEN: &str = "graph c(%x: f32[2, 3], %w: f32[3]) { %y, %d = mylib::my_cube_generated(%x) %z = mul(%y, %w) return (%z, %d) }";

/// Each rule against finite differences (VJP element by element, JVP
/// along a direction) and the vmap rules against a loop, through views.
#[test]
fn every_rule_matches_finite_differences_and_a_loop() {
    custom_function::register().unwrap();
    for src in [SORT, SORT_COLUMNS] {
        check_vjp(src);
        check_jvp(src);
        check_vmap(src, &|_, _, _| Some(0));
        check_vmap(src, &|_, r, _| Some(r as i64));
    }
    // MyCube has a backward only (as on PyTorch's page); the generated
    // variant batches its forward written with Kiln ops.
    check_vjp(CUBE);
    check_vjp(CUBE_GEN);
    check_vmap(CUBE_GEN, &|_, _, _| Some(0));
    check_vmap(CUBE_GEN, &|i, r, _| {
        if i == 0 {
            Some(r as i64)
        } else {
            None
        }
    });
    let e = jvp(&parse(CUBE).unwrap(), None).unwrap_err().to_string();
    assert!(
        e.contains("mylib::my_cube") && e.contains("no jvp rule"),
        "{e}"
    );
    // grad(grad): MyCube's backward is differentiable.
    let g = parse(CUBE).unwrap();
    let g1 = grad(
        &parse("graph c(%x: f32[2, 3]) { %y, %d = mylib::my_cube(%x) %s = sum(%y) return (%s) }")
            .unwrap(),
        None,
        false,
    )
    .unwrap();
    let _ = g;
    let text = print(&g1);
    check_vjp(&text);
}

#[test]
fn custom_calls_print_parse_and_functionalize() {
    custom_function::register().unwrap();
    let g = parse("graph f(%x: f32[2, 4]) { %c = clone(%x) %r = select(%c, 0, 1) %a = add_(%r, 1) %v, %i, %j = mylib::numpy_sort(%c, 1) return (%v, %i) }").unwrap();
    let text = print(&g);
    assert!(
        text.contains("%v, %i, %j = mylib::numpy_sort(%c, 1)"),
        "{text}"
    );
    assert!(parse(&text).unwrap().same_as(&g));
    let f = functionalize(&g, Remove::MutationsAndViews).unwrap();
    let ft = print(&f.graph);
    assert!(ft.contains("mylib::numpy_sort("), "{ft}");
    let x = RTensor::new(
        DType::F32,
        vec![2, 4],
        &[3.0, 1.0, 2.0, 0.0, 5.0, -1.0, 4.0, 2.5],
    );
    let a = kiln::run(&g, vec![x.clone()]).unwrap();
    let b = kiln::run(&f.graph, vec![x]).unwrap();
    assert_eq!(
        a.outputs[0].values(),
        vec![0.0, 1.0, 2.0, 3.0, 0.0, 3.5, 5.0, 6.0]
    );
    assert_eq!(a.outputs[0].values(), b.outputs[0].values());
    assert_eq!(a.outputs[1].values(), b.outputs[1].values());
    assert_eq!(a.outputs[1].dtype(), DType::I64);
}

/// `x * 2` with no rules at all, and a float output marked
/// non-differentiable.
struct Bare {
    name: &'static str,
    mark: bool,
}

impl Function for Bare {
    fn schema(&self) -> String {
        format!("test::{}(Tensor x) -> (Tensor, Tensor)", self.name)
    }
    fn infer(&self, args: &[Arg<&Meta>]) -> R<Vec<Meta>> {
        let Some(Arg::Tensor(x)) = args.first() else {
            return Err("no x".into());
        };
        Ok(vec![Meta::contiguous(x.dtype, x.sizes.to_vec()); 2])
    }
    fn forward(&self, args: &[Arg<RTensor>]) -> R<Vec<RTensor>> {
        let Some(Arg::Tensor(x)) = args.first() else {
            return Err("no x".into());
        };
        let v: Vec<f64> = x.values().iter().map(|a| a * 2.0).collect();
        Ok(vec![RTensor::new(x.dtype(), x.sizes().to_vec(), &v); 2])
    }
    fn setup_context(&self, ctx: &mut Ctx, _: &[Arg<ValueId>], _: &[ValueId]) -> R<()> {
        if self.mark {
            ctx.mark_non_differentiable(&[1]);
        }
        Ok(())
    }
    fn backward(
        &self,
        e: &mut dyn kiln::functionalize::custom::Emit,
        _: &Ctx,
        g: &[Option<ValueId>],
    ) -> custom::Rule<Vec<Option<ValueId>>> {
        if !self.mark {
            return None;
        }
        Some(match g[0] {
            Some(g) => e.scale(g, 2.0).map(|v| vec![Some(v)]),
            None => Ok(vec![None]),
        })
    }
}

#[test]
fn refusals_name_the_function_and_the_rule() {
    let err = |r: Result<kiln::functionalize::ops::OpId, String>| r.expect_err("a refusal");
    custom::register(Arc::new(Bare {
        name: "bare",
        mark: false,
    }))
    .unwrap();
    custom::register(Arc::new(Bare {
        name: "marked",
        mark: true,
    }))
    .unwrap();
    let e = err(custom::register(Arc::new(Bare {
        name: "bare",
        mark: false,
    })));
    assert!(e.contains("`test::bare` is already registered"), "{e}");
    // A missing rule, named with the function and the transform.
    let g =
        parse("graph f(%x: f32[3]) { %y, %z = test::bare(%x) %s = sum(%y) return (%s) }").unwrap();
    let e = grad(&g, None, false).unwrap_err().to_string();
    assert!(
        e.contains("test::bare") && e.contains("no backward rule"),
        "{e}"
    );
    let e = jvp(&g, None).unwrap_err().to_string();
    assert!(e.contains("test::bare") && e.contains("no jvp rule"), "{e}");
    let e = vmap(&g, &[Some(0)], 2, None).unwrap_err().to_string();
    assert!(
        e.contains("test::bare") && e.contains("no vmap rule"),
        "{e}"
    );
    // A gradient into an output marked non-differentiable.
    let m = parse("graph f(%x: f32[3]) { %y, %z = test::marked(%x) %s = sum(%z) return (%s) }")
        .unwrap();
    let e = vjp(&m, None).unwrap_err().to_string();
    assert!(
        e.contains("test::marked") && e.contains("output 1 is marked non-differentiable"),
        "{e}"
    );
    assert!(vjp(
        &parse("graph f(%x: f32[3]) { %y, %z = test::marked(%x) %s = sum(%y) return (%s) }")
            .unwrap(),
        None
    )
    .is_ok());
    // Schemas: mutation, unqualified names, types.
    struct Schema(&'static str);
    impl Function for Schema {
        fn schema(&self) -> String {
            self.0.into()
        }
        fn infer(&self, _: &[Arg<&Meta>]) -> R<Vec<Meta>> {
            Err("unused".into())
        }
        fn forward(&self, _: &[Arg<RTensor>]) -> R<Vec<RTensor>> {
            Err("unused".into())
        }
    }
    let e = err(custom::register(Arc::new(Schema(
        "test::inc_(Tensor(a!) x) -> Tensor(a!)",
    ))));
    assert!(
        e.contains("writes an argument") && e.contains("functional"),
        "{e}"
    );
    let e = err(custom::register(Arc::new(Schema(
        "inc(Tensor x) -> Tensor",
    ))));
    assert!(
        e.contains("qualified name") && e.contains("mylib::inc"),
        "{e}"
    );
    let e = err(custom::register(Arc::new(Schema(
        "test::odd(Tensor x, complex c) -> Tensor",
    ))));
    assert!(e.contains("unsupported type `complex`"), "{e}");
    // generate_vmap_rule needs a forward made of Kiln ops.
    struct Opaque;
    impl Function for Opaque {
        fn schema(&self) -> String {
            "test::opaque(Tensor x) -> Tensor".into()
        }
        fn infer(&self, _: &[Arg<&Meta>]) -> R<Vec<Meta>> {
            Err("unused".into())
        }
        fn forward(&self, _: &[Arg<RTensor>]) -> R<Vec<RTensor>> {
            Err("unused".into())
        }
        fn generate_vmap_rule(&self) -> bool {
            true
        }
    }
    let e = err(custom::register(Arc::new(Opaque)));
    assert!(
        e.contains("test::opaque") && e.contains("generate_vmap_rule") && e.contains("opaque"),
        "{e}"
    );
    // An unknown custom function in a program.
    let e = parse("graph f(%x: f32[3]) { %y = mylib::nothing(%x) return (%y) }")
        .unwrap_err()
        .to_string();
    assert!(e.contains("mylib::nothing"), "{e}");
}

/// Custom functions on the GPU inside Kiln's kernels (a transposed view
/// fused into the sort's reads, products and sums around it), and their
/// gradient programs, as on the reference.
#[test]
fn custom_kernels_run_between_kiln_kernels() {
    custom_function::register().unwrap();
    let mut e = kiln::engine::Engine::new()
        .unwrap_or_else(|e| panic!("the GPU tests need a wgpu adapter: {e}"));
    for src in [SORT, SORT_COLUMNS, CUBE, CUBE_GEN] {
        let g = parse(src).unwrap();
        for p in [g.clone(), vjp(&g, None).unwrap()] {
            let ins = kiln::functionalize::random::random_inputs(&p, 3, 2.0);
            let want = kiln::run(&p, ins.clone()).unwrap();
            let got = e
                .run(&p, ins)
                .unwrap_or_else(|err| panic!("{err}\n{}", print(&p)));
            for (a, b) in got.outputs.iter().zip(&want.outputs) {
                common::close_accumulated("custom", a, b, 1e-5)
                    .unwrap_or_else(|m| panic!("{m}\n{}", print(&p)));
            }
        }
    }
}

/// A program calling a custom function exported with its kernel's WGSL
/// (checked by naga when the file is read) and run from the file.
#[test]
fn custom_kernels_are_exported() {
    use kiln::engine::{export, Fetch, HostTensor, Input, Session};
    custom_function::register().unwrap();
    let g = parse("graph s(%x: f32[3, 5], %w: f32[5]) { %v, %i, %j = mylib::numpy_sort(%x, 1) %y = mul(%v, %w) return (%y, %i) }").unwrap();
    let ins = kiln::functionalize::random::random_inputs(&g, 5, 2.0);
    let want = kiln::run(&g, ins.clone()).unwrap();
    let s = Session::open().unwrap();
    let w = HostTensor::from_rtensor(&ins[1]);
    let bytes = export::export(&s, &g, &[("w".to_string(), w)], &Default::default()).unwrap();
    let e = export::read(&bytes).unwrap();
    assert!(
        e.manifest
            .kernels
            .iter()
            .any(|k| k.wgsl.contains("fn kiln_kernel")),
        "the sort's kernel is in the file"
    );
    let exe = s.load_exported(&e).unwrap();
    let x = HostTensor::from_rtensor(&ins[0]);
    let r = s
        .run(
            &exe,
            &[Input::Host(&x)],
            &exe.options(Fetch::Host, Fetch::Skip),
        )
        .unwrap();
    let y = r.outputs[0].clone().host().unwrap().to_rtensor();
    let i = r.outputs[1].clone().host().unwrap().to_rtensor();
    common::close("y", &y, &want.outputs[0]).unwrap();
    assert_eq!(i.values(), want.outputs[1].values());
}

/// A traced Rust closure calls a custom function like any op; views and a
/// mutation around it are functionalized as usual.
#[test]
fn traced_programs_call_custom_functions() {
    use kiln::functionalize::{trace, TensorSpec};
    custom_function::register().unwrap();
    let g = trace(
        "traced",
        &[TensorSpec::new("x", DType::F32, &[2, 3])],
        |p| {
            let y = p[0].clone_tensor();
            y.select(0, 0).mul_(-1.0);
            let r = kiln::functionalize::trace::call(
                "mylib::numpy_sort",
                vec![Arg::from(&y), Arg::Int(1)],
            );
            vec![r[0].clone(), r[2].clone()]
        },
    )
    .unwrap();
    let text = print(&g);
    assert!(text.contains("mylib::numpy_sort(%"), "{text}");
    let x = RTensor::new(DType::F32, vec![2, 3], &[1.0, 3.0, 2.0, 0.5, -1.0, 4.0]);
    let r = kiln::run(&g, vec![x]).unwrap();
    assert_eq!(
        r.outputs[0].values(),
        vec![-3.0, -2.0, -1.0, -1.0, 0.5, 4.0]
    );
    assert_eq!(r.outputs[1].values(), vec![2.0, 0.0, 1.0, 1.0, 0.0, 2.0]);
    let gr = grad(
        &{
            let mut l = g.clone();
            let sum = kiln::functionalize::ops::lookup("sum").unwrap();
            let s = l.call(sum, &[Arg::Tensor(l.outputs[0])]).unwrap()[0];
            l.outputs = vec![s];
            l
        },
        None,
        false,
    )
    .unwrap();
    let x = RTensor::new(DType::F32, vec![2, 3], &[1.0, 3.0, 2.0, 0.5, -1.0, 4.0]);
    assert_eq!(
        kiln::run(&gr, vec![x]).unwrap().outputs[0].values(),
        vec![-1.0, -1.0, -1.0, 1.0, 1.0, 1.0]
    );
}

/// A forward that writes its argument is refused when it runs (the
/// program's tensors are untouched).
#[test]
fn a_forward_that_mutates_its_input_is_refused() {
    struct Sneaky;
    impl Function for Sneaky {
        fn schema(&self) -> String {
            "test::sneaky(Tensor x) -> Tensor".into()
        }
        fn infer(&self, args: &[Arg<&Meta>]) -> R<Vec<Meta>> {
            let Some(Arg::Tensor(x)) = args.first() else {
                return Err("no x".into());
            };
            Ok(vec![Meta::contiguous(x.dtype, x.sizes.to_vec())])
        }
        fn forward(&self, args: &[Arg<RTensor>]) -> R<Vec<RTensor>> {
            let Some(Arg::Tensor(x)) = args.first() else {
                return Err("no x".into());
            };
            x.write(&vec![0.0; x.meta.numel()]);
            Ok(vec![RTensor::new(
                x.dtype(),
                x.sizes().to_vec(),
                &x.values(),
            )])
        }
    }
    custom::register(Arc::new(Sneaky)).unwrap();
    let g = parse("graph f(%x: f32[3]) { %y = test::sneaky(%x) return (%y) }").unwrap();
    let x = RTensor::new(DType::F32, vec![3], &[1.0, 2.0, 3.0]);
    let e = kiln::run(&g, vec![x.clone()])
        .err()
        .expect("refused")
        .to_string();
    assert!(
        e.contains("test::sneaky") && e.contains("wrote its argument 0"),
        "{e}"
    );
    assert_eq!(x.values(), vec![1.0, 2.0, 3.0]);
}
