// Kiln in the browser: the wasm module (pkg/, made by scripts/web.sh) plus
// downloads with progress that are kept in the browser's Cache Storage.
//
//   import { loadProgram, loadEmbedder } from "./kiln.js";
//   const p = await loadProgram("model.kiln");          // URL or bytes
//   const q = await loadProgram("m-8x32.kiln", "m.weights"); // weights apart
//   const outs = await p.run([new Float32Array(...)]);
//
// Everything is async; nothing blocks the page.

import init, { Program, Embedder } from "./pkg/kiln_web.js";

export { Program, Embedder };

const CACHE = "kiln-models-v1";

let ready = null;
/** Instantiates the wasm module once. */
export function initKiln() {
  ready ??= init();
  return ready;
}

/** The page's WebGPU adapter in words ("vendor architecture, fallback"). */
export async function adapterName() {
  const a = await navigator.gpu?.requestAdapter();
  if (!a) return "none";
  const i = a.info ?? {};
  const parts = [i.vendor, i.architecture, i.device, i.description].filter((x) => x);
  const name = parts.length ? parts.join(" ") : "unnamed adapter";
  return (a.isFallbackAdapter ?? i.isFallbackAdapter) ? `${name} (software fallback)` : name;
}

/** Why WebGPU is not usable here, or null when it is. */
export async function webgpuProblem() {
  if (!("gpu" in navigator)) {
    return (
      "This browser has no WebGPU. Use Chrome or Edge 113 or later, Safari 26 or later, " +
      "or Firefox 141 or later on Windows; on Linux start Chromium with " +
      "--enable-unsafe-webgpu (and --enable-features=Vulkan on a GPU). " +
      (window.isSecureContext ? "" : "WebGPU also needs a secure page (https or localhost).")
    );
  }
  const adapter = await navigator.gpu.requestAdapter();
  if (!adapter) {
    return (
      "WebGPU is present but offers no adapter (blocked GPU, or disabled in the " +
      "browser's settings: see chrome://gpu)."
    );
  }
  return null;
}

/**
 * What `adapter` (a GPUAdapter) lacks of an export's needs (`requires`, as
 * `kiln inspect FILE --requires` prints them), in words; empty when nothing.
 */
export function missingFor(requires, adapter) {
  const l = adapter.limits;
  const miss = [];
  for (const f of requires.features) {
    const name = { subgroup: "subgroups" }[f] ?? f;
    if (!adapter.features.has(name)) miss.push(`feature ${f}`);
  }
  const need = (what, want, have, atMost) => {
    if (atMost ? have > want : have < want) miss.push(`${what} ${want} (this adapter: ${have})`);
  };
  need("storage buffer offsets aligned to", requires.min_storage_buffer_offset_alignment, l.minStorageBufferOffsetAlignment, true);
  need("storage bindings of", requires.max_storage_buffer_binding_size, l.maxStorageBufferBindingSize);
  need("storage buffers per stage:", requires.max_storage_buffers_per_shader_stage, l.maxStorageBuffersPerShaderStage);
  need("buffers of", requires.max_buffer_size, l.maxBufferSize);
  need("invocations per workgroup:", requires.max_compute_invocations_per_workgroup, l.maxComputeInvocationsPerWorkgroup);
  need("workgroup memory of", requires.max_compute_workgroup_storage_size, l.maxComputeWorkgroupStorageSize);
  need("workgroups per dimension:", requires.max_compute_workgroups_per_dimension, l.maxComputeWorkgroupsPerDimension);
  return miss;
}

/**
 * The first of a model's variants (`[{file, requires, weights, bytes,
 * ...}]`, the models.json that scripts/web.sh writes) this page's adapter
 * can run, chosen before anything large is downloaded: the kernels made
 * for its class of adapter, on a GPU with the smallest download (int8
 * weights), on a software fallback adapter with f16 weights (its
 * per-element int8 dequantization runs the corpus 8.5x slower on
 * SwiftShader: 531 s against 62 s); only those of `weights` ("f16",
 * "i8") when given. Of variants with the same weights, one computing in
 * f16 (`arithmetic: "f16"`, which lists `shader-f16` among its needs)
 * comes first; where the adapter lacks the feature the f32 one is taken.
 */
export async function chooseVariant(variants, weights = null) {
  const adapter = await navigator.gpu.requestAdapter();
  const offered = weights ? variants.filter((v) => v.weights === weights) : variants;
  if (offered.length === 0) {
    const have = [...new Set(variants.map((v) => v.weights))].join(", ");
    throw new Error(`No model with ${weights} weights here (there are: ${have}).`);
  }
  // A software fallback adapter (a CPU) runs the variant made with a CPU
  // adapter's kernel choices first; a GPU the GPU-class one.
  const cpu = Boolean(adapter.isFallbackAdapter ?? adapter.info?.isFallbackAdapter);
  const rank = (v) => (v.class === (cpu ? "cpu" : "gpu") ? 0 : 1);
  // By the download of the weights format (its smallest variant), so an
  // f16-arithmetic variant stays beside the f32 one of its weights.
  const least = (w) => Math.min(...offered.filter((v) => v.weights === w).map((v) => v.bytes ?? 0));
  const size = (v) => (cpu ? -1 : 1) * least(v.weights);
  const math = (v) => (v.arithmetic === "f16" ? 0 : 1);
  const ordered = [...offered].sort(
    (a, b) => rank(a) - rank(b) || size(a) - size(b) || math(a) - math(b),
  );
  const reasons = [];
  for (const v of ordered) {
    const m = missingFor(v.requires, adapter);
    if (m.length === 0) return v;
    reasons.push(`${v.name ?? v.file} needs ${m.join(", ")}`);
  }
  throw new Error(`This GPU cannot run the model: ${reasons.join("; ")}.`);
}

/** The variant called `name`, or an error naming the variants there are
 * or what this page's adapter lacks of it. */
export async function namedVariant(variants, name) {
  const v = variants.find((x) => x.name === name);
  if (!v) {
    throw new Error(`No model variant ${name} (there are: ${variants.map((x) => x.name).join(", ")}).`);
  }
  const miss = missingFor(v.requires, await navigator.gpu.requestAdapter());
  if (miss.length) throw new Error(`This GPU cannot run ${name}: it needs ${miss.join(", ")}.`);
  return v;
}

/**
 * The bytes at `url`, from Cache Storage when a previous visit kept them,
 * else downloaded (`onProgress(loadedBytes, totalBytes)` as they arrive)
 * and kept. Returns { bytes: Uint8Array, fromCache: boolean }.
 */
export async function fetchCached(url, onProgress = () => {}) {
  const cache = "caches" in self ? await caches.open(CACHE) : null;
  const hit = cache && (await cache.match(url));
  if (hit) {
    const bytes = new Uint8Array(await hit.arrayBuffer());
    onProgress(bytes.length, bytes.length);
    return { bytes, fromCache: true };
  }
  const resp = await fetch(url);
  if (!resp.ok) {
    throw new Error(`cannot download ${url}: HTTP ${resp.status} ${resp.statusText}`);
  }
  const total = Number(resp.headers.get("content-length")) || 0;
  const reader = resp.body.getReader();
  const parts = [];
  let loaded = 0;
  for (;;) {
    const { done, value } = await reader.read();
    if (done) break;
    parts.push(value);
    loaded += value.length;
    onProgress(loaded, total || loaded);
  }
  const bytes = new Uint8Array(loaded);
  let at = 0;
  for (const p of parts) {
    bytes.set(p, at);
    at += p.length;
  }
  if (cache) {
    await cache.put(
      url,
      new Response(bytes, { headers: { "content-type": "application/octet-stream" } }),
    );
  }
  return { bytes, fromCache: false };
}

async function bytesOf(src, onProgress) {
  if (src instanceof Uint8Array) return { bytes: src, fromCache: false };
  if (src instanceof ArrayBuffer) return { bytes: new Uint8Array(src), fromCache: false };
  return fetchCached(String(src), onProgress);
}

/** An exported program (URL or bytes) loaded onto this page's WebGPU;
 * `weights` (URL or bytes) for an export that keeps its weights in a file
 * of their own (`--weights-file`). */
export async function loadProgram(src, weights, onProgress) {
  await initKiln();
  const { bytes } = await bytesOf(src, onProgress);
  const w = weights === undefined ? undefined : (await bytesOf(weights)).bytes;
  return Program.load(bytes, w);
}

/**
 * A sentence embedder from a model variant of models.json (`{buckets:
 * [URL...], weights_file: URL, ...}`: one export per sequence bucket,
 * sharing one weights file) and its tokenizer.json (URL or bytes).
 * `onProgress(loadedBytes, totalBytes)` over every file, then
 * `onReady(buckets, total)` as each bucket is ready on the GPU (checked,
 * weights uploaded, pipelines made). Returns { embedder, fromCache,
 * downloadMs, prepareMs } (fromCache: nothing was downloaded; downloadMs:
 * the files, from the network or Cache Storage, and the wasm module;
 * prepareMs: the buckets loaded on the GPU and the tokenizer parsed).
 */
export async function loadEmbedder(variant, tokenizer, onProgress = () => {}, onReady = () => {}) {
  const t0 = performance.now();
  await initKiln();
  const files = [variant.weights_file, ...variant.buckets].filter((f) => f);
  const loaded = new Map();
  const total = () => {
    let l = 0, t = 0;
    for (const [a, b] of loaded.values()) {
      l += a;
      t += b;
    }
    return [l, Math.max(t, variant.bytes ?? 0)];
  };
  const parts = await Promise.all(
    files.map((f) =>
      bytesOf(f, (a, b) => {
        loaded.set(f, [a, b]);
        onProgress(...total());
      }),
    ),
  );
  const weights = variant.weights_file ? parts[0].bytes : undefined;
  const models = parts.slice(variant.weights_file ? 1 : 0).map((p) => p.bytes);
  const t = await bytesOf(tokenizer);
  const json = new TextDecoder().decode(t.bytes);
  const t1 = performance.now();
  const embedder = await Embedder.load(models, weights, json, onReady);
  return {
    embedder,
    fromCache: parts.every((p) => p.fromCache),
    downloadMs: t1 - t0,
    prepareMs: performance.now() - t1,
  };
}
