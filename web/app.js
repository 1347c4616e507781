// The semantic-search page: downloads the exported MiniLM once (kept in
// Cache Storage), embeds the built-in sentences, then ranks them by cosine
// against each query. For automation: window.kiln = { ready, embed, ... }.

import { adapterName, chooseVariant, loadEmbedder, namedVariant, webgpuProblem } from "./kiln.js";
import { SENTENCES } from "./sentences.js";

const $ = (id) => document.getElementById(id);
// The model's variants and what each needs of an adapter.
const VARIANTS = "models.json";
const TOKENIZER = "tokenizer.json";

function showProblem(msg) {
  $("problem").textContent = msg;
  $("problem").hidden = false;
  $("loading").hidden = true;
  $("status").textContent = "";
}

function mb(n) {
  return (n / 1e6).toFixed(1) + " MB";
}

function dot(a, b) {
  let s = 0;
  for (let i = 0; i < a.length; i++) s += a[i] * b[i];
  return s;
}

async function start() {
  const problem = await webgpuProblem();
  if (problem) throw new Error(problem);
  const t0 = performance.now();
  // `?models=URL` reads the variants from another list (the benchmark's,
  // which adds f32 weights), `?variant=NAME` takes that one variant.
  const params = new URLSearchParams(location.search);
  const list = params.get("models") ?? VARIANTS;
  const resp = await fetch(list);
  if (!resp.ok) throw new Error(`cannot download ${list}: HTTP ${resp.status}`);
  const variants = await resp.json();
  // `?weights=f16` or `?weights=i8` asks for one weight format (int8:
  // half the download of f16, within cosine 0.999 of it; the default on
  // a GPU, f16 on a software fallback adapter: `chooseVariant`).
  const named = params.get("variant");
  const variant = named
    ? await namedVariant(variants, named)
    : await chooseVariant(variants, params.get("weights"));
  // The phases as the page showed them, for automation (window.kiln.info).
  const phases = [];
  const { embedder, fromCache, downloadMs, prepareMs } = await loadEmbedder(
    variant,
    TOKENIZER,
    (loaded, total) => {
      if (phases.at(-1) !== "download") phases.push("download");
      $("progress").max = total;
      $("progress").value = loaded;
      $("progress-label").textContent = `Downloading the model… ${mb(loaded)} of ${mb(total)}`;
    },
    (ready, total) => {
      phases.push(`prepare ${ready}/${total}`);
      $("progress").max = total;
      $("progress").value = ready;
      $("progress-label").textContent =
        `Preparing the GPU: ${ready} of ${total} sequence lengths ready ` +
        "(checked, weights uploaded, shaders compiled)…";
    },
  );
  $("progress-label").textContent = fromCache
    ? "Model loaded from the browser's cache."
    : "Model downloaded (kept for the next visit).";
  const adapter = await adapterName();
  $("adapter").textContent =
    `WebGPU adapter: ${adapter}; model ${variant.name} (${variant.weights} weights, ` +
    `${variant.arithmetic ?? "f32"} arithmetic, ` +
    `${mb(variant.bytes)}, buckets ${embedder.buckets.join(", ")})`;
  const other = variant.weights === "i8" ? "f16" : "i8";
  const link = document.createElement("a");
  link.href = `?weights=${other}`;
  link.textContent = `use the ${other} model`;
  $("adapter").append(" ", link);
  // `?bench` (tests/web/bench.mjs) times the model alone: no corpus.
  const corpusTexts = params.has("bench") ? [] : SENTENCES;
  $("status").textContent = `Embedding ${corpusTexts.length} sentences…`;
  const t1 = performance.now();
  const corpus = await embedder.embed(corpusTexts);
  const t2 = performance.now();
  $("loading").hidden = true;
  $("status").textContent =
    `${corpusTexts.length} sentences embedded in ${(t2 - t1).toFixed(0)} ms ` +
    `(model ready in ${(t1 - t0).toFixed(0)} ms). Type a query.`;
  $("query").disabled = false;
  $("go").disabled = false;
  $("query").focus();
  phases.push("embed");
  return {
    embedder,
    adapter,
    variant,
    corpus,
    fromCache,
    loadMs: t1 - t0,
    corpusMs: t2 - t1,
    downloadMs,
    prepareMs,
    phases,
  };
}

async function search(state, query) {
  // Text past the model's tokens is cut as sentence-transformers cuts it:
  // say so rather than rank on part of the query silently.
  const n = state.embedder.tokenCount(query);
  const max = state.embedder.tokens;
  $("note").textContent =
    n > max
      ? `Your query is ${n} tokens; the model reads the first ${max} ([CLS], ${max - 2} word pieces, [SEP]), as sentence-transformers does.`
      : "";
  $("note").hidden = n <= max;
  const t = performance.now();
  const [q] = await state.embedder.embed([query]);
  const ms = performance.now() - t;
  const ranked = SENTENCES.slice(0, state.corpus.length).map((s, i) => ({ sentence: s, score: dot(q, state.corpus[i]) }))
    .sort((a, b) => b.score - a.score);
  const ol = $("results");
  ol.replaceChildren(
    ...ranked.slice(0, 10).map((r) => {
      const li = document.createElement("li");
      const score = document.createElement("span");
      score.className = "score";
      score.textContent = r.score.toFixed(3);
      const text = document.createElement("span");
      text.className = "sentence";
      text.textContent = r.sentence;
      li.append(score, text);
      return li;
    }),
  );
  $("timing").textContent = `${ms.toFixed(1)} ms per query`;
  return { ranked, ms };
}

const ready = start();
window.kiln = {
  ready: ready.then(() => true),
  /** One Float32Array of 384 floats per sentence. */
  embed: async (sentences) => (await ready).embedder.embed(sentences),
  /** Tokens of `text` before any cut ([CLS] and [SEP] included). */
  tokenCount: async (text) => (await ready).embedder.tokenCount(text),
  /** Ranks the built-in sentences for `query` (as the search box does). */
  search: async (query) => search(await ready, query),
  /** Whether the model came from Cache Storage, and load timings. */
  info: async () => {
    const s = await ready;
    return {
      fromCache: s.fromCache,
      loadMs: s.loadMs,
      corpusMs: s.corpusMs,
      downloadMs: s.downloadMs,
      prepareMs: s.prepareMs,
      phases: s.phases,
      adapter: s.adapter,
      batch: s.embedder.batch,
      tokens: s.embedder.tokens,
      buckets: s.embedder.buckets,
      variant: s.variant.name,
      weights: s.variant.weights,
      arithmetic: s.variant.arithmetic ?? "f32",
    };
  },
  sentences: SENTENCES,
};

ready.catch((e) => showProblem(String(e.message ?? e)));

$("search").addEventListener("submit", async (ev) => {
  ev.preventDefault();
  const q = $("query").value.trim();
  if (!q) return;
  try {
    await search(await ready, q);
  } catch (e) {
    $("status").textContent = `Error: ${e.message ?? e}`;
  }
});
