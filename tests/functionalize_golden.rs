//! Golden printed graphs for the seed examples (`torch.func.functionalize`'s
//! documentation and the classic view/mutation cases). Update with
//! `UPDATE_EXPECT=1 cargo test --test functionalize_golden`, then review.

use expect_test::{expect, Expect};
use kiln::functionalize::{functionalize, Remove};

fn check(src: &str, mode: Remove, want: Expect) {
    let g = kiln::parse(src).unwrap();
    let f = functionalize(&g, mode).unwrap();
    want.assert_eq(&kiln::print(&f.graph));
}

#[test]
fn docs_intermediate_mutation_through_a_view() {
    // def f(a): b = a + 1; c = b.view(-1); c.add_(1); return b
    let src = "graph f(%a: f32[4, 2]) {
      %b = add(%a, 1)
      %c = view(%b, [-1])
      %d = add_(%c, 1)
      return %b
    }";
    check(
        src,
        Remove::Mutations,
        expect![[r#"
        graph f(%a: f32[4, 2]) {
          %add = add(%a, 1)
          %view = view(%add, [-1])
          %add_1 = add(%view, 1)
          %view_1 = view(%add_1, [4, 2])
          return %view_1
        }
    "#]],
    );
    check(
        src,
        Remove::MutationsAndViews,
        expect![[r#"
        graph f(%a: f32[4, 2]) {
          %add = add(%a, 1)
          %view_copy = view_copy(%add, [-1])
          %add_1 = add(%view_copy, 1)
          %view_copy_1 = view_copy(%add_1, [4, 2])
          return %view_copy_1
        }
    "#]],
    );
}

#[test]
fn docs_input_mutated_through_a_view() {
    // def f(a): b = a.view(-1); b.add_(1); return a
    let src = "graph f(%a: f32[4, 2]) {
      %b = view(%a, [-1])
      %c = add_(%b, 1)
      return %a
    }";
    check(
        src,
        Remove::Mutations,
        expect![[r#"
        graph f(%a: f32[4, 2]) {
          %view = view(%a, [-1])
          %add = add(%view, 1)
          %view_1 = view(%add, [4, 2])
          %copy = copy_(%a, %view_1)
          return %view_1
        }
    "#]],
    );
    check(
        src,
        Remove::MutationsAndViews,
        expect![[r#"
        graph f(%a: f32[4, 2]) {
          %view_copy = view_copy(%a, [-1])
          %add = add(%view_copy, 1)
          %view_copy_1 = view_copy(%add, [4, 2])
          %copy = copy_(%a, %view_copy_1)
          return %view_copy_1
        }
    "#]],
    );
}

#[test]
fn clone_then_add_() {
    let src = "graph f(%x: f32[3]) {
      %y = clone(%x)
      %z = add_(%y, 1)
      return %y
    }";
    check(
        src,
        Remove::Mutations,
        expect![[r#"
        graph f(%x: f32[3]) {
          %clone = clone(%x)
          %add = add(%clone, 1)
          return %add
        }
    "#]],
    );
}

#[test]
fn column_of_a_slice_add_() {
    // y[:, 1].add_(1): slice then select, written back by select_scatter and slice_scatter.
    let src = "graph f(%x: f32[3, 4]) {
      %y = clone(%x)
      %s = slice(%y, 0, 0, 9223372036854775807)
      %c = select(%s, 1, 1)
      %d = add_(%c, 1)
      return %y
    }";
    check(
        src,
        Remove::Mutations,
        expect![[r#"
        graph f(%x: f32[3, 4]) {
          %clone = clone(%x)
          %slice = slice(%clone, 0, 0, 9223372036854775807)
          %select = select(%slice, 1, 1)
          %add = add(%select, 1)
          %select_scatter = select_scatter(%slice, %add, 1, 1)
          %slice_scatter = slice_scatter(%clone, %select_scatter, 0, 0, 9223372036854775807)
          return %slice_scatter
        }
    "#]],
    );
}

#[test]
fn several_outstanding_aliases() {
    // Two live views of one base; a write through one is seen by the other.
    let src = "graph f(%x: f32[2, 3]) {
      %b = clone(%x)
      %t = transpose(%b, 0, 1)
      %v = view(%b, [6])
      %m = mul_(%t, 2)
      %r = add(%v, 1)
      return (%r, %t)
    }";
    check(
        src,
        Remove::Mutations,
        expect![[r#"
        graph f(%x: f32[2, 3]) {
          %clone = clone(%x)
          %transpose = transpose(%clone, 0, 1)
          %mul = mul(%transpose, 2)
          %transpose_1 = transpose(%mul, 0, 1)
          %view_1 = view(%transpose_1, [6])
          %add = add(%view_1, 1)
          return (%add, %mul)
        }
    "#]],
    );
}

#[test]
fn diagonal_add_without_views() {
    let src = "graph f(%x: f32[3, 3]) {
      %d = diagonal(%x)
      %e = add_(%d, 1)
      return %x
    }";
    check(
        src,
        Remove::MutationsAndViews,
        expect![[r#"
        graph f(%x: f32[3, 3]) {
          %diagonal_copy = diagonal_copy(%x)
          %add = add(%diagonal_copy, 1)
          %diagonal_scatter = diagonal_scatter(%x, %add)
          %copy = copy_(%x, %diagonal_scatter)
          return %diagonal_scatter
        }
    "#]],
    );
}
