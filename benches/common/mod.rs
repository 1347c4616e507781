//! Workloads shared by the benchmarks (each uses some of them).
#![allow(dead_code)]

/// An MLP block: layer norm, two linears with GELU, a residual `add_`.
pub const MLP: &str = "graph mlp(%x: f32[256, 512], %w1: f32[1024, 512], %b1: f32[1024], %w2: f32[512, 1024], %b2: f32[512], %g: f32[512], %b: f32[512]) {
  %n = layer_norm(%x, [512], %g, %b)
  %h = linear(%n, %w1, %b1)
  %a = gelu(%h)
  %o = linear(%a, %w2, %b2)
  %r = add_(%o, %x)
  return %r
}";

/// An attention block: four heads, views for the head split, a masked softmax.
pub const ATTENTION: &str = "graph attention(%x: f32[128, 256], %wq: f32[256, 256], %wk: f32[256, 256], %wv: f32[256, 256], %wo: f32[256, 256], %mask: bool[128, 128]) {
  %q = linear(%x, %wq)
  %k = linear(%x, %wk)
  %v = linear(%x, %wv)
  %qh = view(%q, [128, 4, 64])
  %kh = view(%k, [128, 4, 64])
  %vh = view(%v, [128, 4, 64])
  %qt = transpose(%qh, 0, 1)
  %kt = permute(%kh, [1, 2, 0])
  %vt = transpose(%vh, 0, 1)
  %s = matmul(%qt, %kt)
  %s2 = mul_(%s, 0.125)
  %m = masked_fill_(%s2, %mask, -10000.0)
  %p = softmax(%m, -1)
  %c = matmul(%p, %vt)
  %ct = transpose(%c, 0, 1)
  %cm = reshape(%ct, [128, 256])
  %o = linear(%cm, %wo)
  return %o
}";

/// Sentences for the MiniLM benchmarks, 1 to 14 words.
pub const SENTENCES: [&str; 8] = [
    "A man is playing a guitar.",
    "Someone plays a guitar.",
    "The weather is lovely today.",
    "It's so sunny outside!",
    "A woman is slicing an onion in the kitchen.",
    "The stock market fell sharply after the announcement.",
    "Kiln turns programs with views and mutations into pure functions.",
    "Hi",
];

/// Kernel-family workloads of MiniLM's shapes (batch 32 x 128 tokens):
/// the feed-forward product with its bias, the attention softmax over 384
/// heads' rows, a layer norm.
pub const LINEAR: &str = "graph linear(%x: f32[4096, 384], %w: f32[1536, 384], %b: f32[1536]) {
  %y = linear(%x, %w, %b)
  return %y
}";

pub const SOFTMAX: &str = "graph softmax(%s: f32[49152, 128]) {
  %p = softmax(%s, -1)
  return %p
}";

pub const LAYER_NORM: &str = "graph layer_norm(%x: f32[4096, 384], %g: f32[384], %b: f32[384]) {
  %y = layer_norm(%x, [384], %g, %b, 1e-12)
  return %y
}";
