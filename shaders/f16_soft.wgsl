// f32 to f16 bits rounded to nearest, ties to even, as PyTorch converts.
// Not pack2x16float: WGSL leaves its rounding direction to the driver
// (NVIDIA's Vulkan driver rounds some values the other way, 2026-11-28).
fn k_f16_bits(x: f32) -> u32 {
    let b = bitcast<u32>(x);
    let a = b & 0x7fffffffu;
    // Normal: round the 13 dropped mantissa bits, rebias the exponent.
    let n = (a + 0x0fffu + ((a >> 13u) & 1u) - 0x38000000u) >> 13u;
    // Subnormal: the significand in units of 2^-24, rounded.
    let shift = clamp(126u - (a >> 23u), 14u, 24u);
    let m = (a & 0x7fffffu) | 0x800000u;
    let q = m >> shift;
    let rem = m & ((1u << shift) - 1u);
    let half = 1u << (shift - 1u);
    let s = q + select(0u, 1u, rem > half || (rem == half && (q & 1u) == 1u));
    var h = select(s, n, a >= 0x38800000u);
    h = select(h, 0u, a < 0x33000000u);
    h = select(h, 0x7c00u, a >= 0x477ff000u);
    h = select(h, 0x7e00u, a > 0x7f800000u);
    return ((b >> 16u) & 0x8000u) | h;
}
// x rounded to f16 precision (as f16 bits widened back, exactly).
fn k_round_f16(x: f32) -> f32 {
    let h = k_f16_bits(x);
    let e = (h >> 10u) & 0x1fu;
    let m = h & 0x3ffu;
    let sign = (h & 0x8000u) << 16u;
    let normal = bitcast<f32>(sign | ((e + 112u) << 23u) | (m << 13u));
    let sub = f32(m) * 0x1p-24f;
    let special = bitcast<f32>(sign | 0x7f800000u | (m << 13u));
    return select(select(select(sub, -sub, sign != 0u), normal, e != 0u), special, e == 31u);
}
