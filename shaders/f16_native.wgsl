enable f16;
// The f16 conversions of shaders/f16_soft.wgsl in the adapter's own f16
// instructions, for adapters with `shader-f16` (the shader starts with
// `enable f16;`): one conversion instead of some 30 integer operations.
// WGSL lets the hardware round either way at a tie or flush subnormals;
// lavapipe rounds to nearest even as PyTorch does (tests/gpu.rs
// `f16_conversions_round_to_nearest_even` runs on both paths).
// `pack2x16float` of a value f16 holds exactly: no rounding left to it.
fn k_f16_bits(x: f32) -> u32 { return pack2x16float(vec2<f32>(f32(f16(x)), 0.0)); }
fn k_round_f16(x: f32) -> f32 { return f32(f16(x)); }
