// Helper functions every generated kernel may call (prefixed `k_`).
// A float from its bits at run time: browsers (Tint) refuse NaN and
// infinity as constant expressions, a function argument is not one.
fn k_f32_bits(b: u32) -> f32 { return bitcast<f32>(b); }
// An i32 wrapped to i8 (its low byte, sign-extended), as a store of an
// int8 tensor truncates; a function, so never a constant expression
// whose shift could overflow.
fn k_wrap_i8(x: i32) -> i32 { return bitcast<i32>(bitcast<u32>(x) << 24u) >> 24u; }
fn k_isnan(x: f32) -> bool { return (bitcast<u32>(x) & 0x7fffffffu) > 0x7f800000u; }
fn k_erf(x: f32) -> f32 {
    // erfc by a Chebyshev fit (Numerical Recipes erfcc), |error| < 1.2e-7.
    let z = abs(x);
    let t = 1.0 / (1.0 + 0.5 * z);
    let r = t * exp(-z * z - 1.26551223 + t * (1.00002368 + t * (0.37409196 + t * (0.09678418 +
        t * (-0.18628806 + t * (0.27886807 + t * (-1.13520398 + t * (1.48851587 +
        t * (-0.82215223 + t * 0.17087277)))))))));
    return select(r - 1.0, 1.0 - r, x >= 0.0);
}
fn k_powf(x: f32, y: f32) -> f32 {
    if (y == 0.0) { return 1.0; }
    let m = pow(abs(x), y);
    if (x >= 0.0) { return m; }
    if (floor(y) != y) { return k_f32_bits(0x7fc00000u); }
    let odd = (abs(y) % 2.0) == 1.0;
    return select(m, -m, odd);
}
fn k_powi(x: i32, y: i32) -> i32 {
    var r = 1i;
    for (var i = 0i; i < min(y, 64i); i = i + 1i) { r = r * x; }
    if (y < 0i) { return select(select(0i, 1i, x == 1i), select(-1i, 1i, (y % 2i) == 0i), x == -1i); }
    return r;
}
// i64 values are held in i32 (engine/src/wgsl.rs `ty`): these say when an
// i64 result (r) left the 32-bit range, so the run reports it.
fn k_add_ovf(x: i32, y: i32, r: i32) -> bool { return ((x ^ r) & (y ^ r)) < 0i; }
fn k_sub_ovf(x: i32, y: i32, r: i32) -> bool { return ((x ^ y) & (x ^ r)) < 0i; }
fn k_mul_ovf(x: i32, y: i32) -> bool {
    if (x == 0i || y == 0i) { return false; }
    let lo = -2147483647i - 1i;
    if ((x == -1i && y == lo) || (y == -1i && x == lo)) { return true; }
    return (x * y) / y != x;
}
fn k_powu(x: u32, y: u32) -> u32 {
    var r = 1u;
    for (var i = 0u; i < min(y, 64u); i = i + 1u) { r = r * x; }
    return r;
}
