// Browser timings of the demo page (web/dist, `scripts/web.sh bench`) in
// headless Chromium with WebGPU, per model variant of web/dist/bench/
// models.json (the page's variants plus f32 weights), printed as one JSON
// object: the download (raw and gzipped), first result with a cold and a
// warm Cache Storage (by phase), and ms per query of 1 and 32 sentences of
// 16 and of 128 tokens; the wasm and JavaScript sizes. Progress on stderr.
//
// KILN_BENCH_VARIANTS=a,b measures those variants; by default every
// variant of the adapter's class (a software fallback adapter: the CPU
// class). A query of 32 sentences whose estimate (from the shorter one)
// passes KILN_BENCH_MAX_S seconds (300) is skipped and says so.

import { createServer } from "node:http";
import { readFileSync, mkdtempSync, rmSync, existsSync } from "node:fs";
import { join, extname, dirname } from "node:path";
import { tmpdir } from "node:os";
import { gzipSync } from "node:zlib";
import { fileURLToPath } from "node:url";
import { createRequire } from "node:module";

const ROOT = join(dirname(fileURLToPath(import.meta.url)), "..", "..");
const DIST = join(ROOT, "web", "dist");
const MODELS = "bench/models.json";
const MAX_S = Number(process.env.KILN_BENCH_MAX_S ?? 300);
const require = createRequire(join(ROOT, "web", "package.json"));
const { chromium } = require("playwright-core");
const log = (...a) => console.error("bench:", ...a);

const server = createServer((req, res) => {
  const path = decodeURIComponent(new URL(req.url, "http://x").pathname);
  const file = join(DIST, path === "/" ? "index.html" : path);
  if (!file.startsWith(DIST) || !existsSync(file)) return res.writeHead(404).end();
  const body = readFileSync(file);
  const type = { ".html": "text/html", ".js": "text/javascript", ".wasm": "application/wasm" }[extname(file)];
  res.writeHead(200, { "content-type": type ?? "application/octet-stream", "content-length": body.length });
  res.end(body);
});
await new Promise((ok) => server.listen(0, "127.0.0.1", ok));
const url = `http://127.0.0.1:${server.address().port}/`;

async function browser(userDir) {
  const ctx = await chromium.launchPersistentContext(userDir, {
    executablePath: process.env.CHROMIUM ?? "/usr/bin/chromium",
    headless: true,
    args: ["--no-sandbox", "--enable-unsafe-webgpu", "--disable-quic", "--no-first-run"],
  });
  return [ctx, ctx.pages()[0] ?? (await ctx.newPage())];
}

// One visit of the page with `variant`: navigation to the first query's
// result (model from the network or Cache Storage, wasm, exports checked
// and loaded, one embedding); then, when `measure`, the queries.
async function visit(userDir, variant, measure) {
  const [ctx, page] = await browser(userDir);
  try {
    await page.goto(`${url}?bench&models=${MODELS}&variant=${variant}`);
    return await page.evaluate(
      async ({ measure, maxS }) => {
        try {
          await window.kiln.ready;
        } catch (e) {
          return { error: String(e.message ?? e) };
        }
        const info = await window.kiln.info();
        let t = performance.now();
        await window.kiln.embed(["How is the weather today?"]);
        const first = info.loadMs + (performance.now() - t);
        if (!measure) return { info, first };
        // `n` texts of at most `tokens` tokens ([CLS], [SEP] included):
        // words of the page's sentences from the i-th on.
        const words = window.kiln.sentences.join(" ").split(/\s+/);
        const texts = async (n, tokens) => {
          const out = [];
          for (let i = 0; i < n; i++) {
            const w = words.slice(i * 7);
            let lo = 1, hi = Math.min(w.length, tokens);
            while (lo < hi) {
              const mid = (lo + hi + 1) >> 1;
              if ((await window.kiln.tokenCount(w.slice(0, mid).join(" "))) <= tokens) lo = mid;
              else hi = mid - 1;
            }
            out.push(w.slice(0, lo).join(" "));
          }
          return out;
        };
        // Best of 3 where a run takes under 20 s, else the one run.
        const best = async (s) => {
          let b = Infinity;
          for (let i = 0; i < 3 && (i === 0 || b < 20000); i++) {
            const t = performance.now();
            await window.kiln.embed(s);
            b = Math.min(b, performance.now() - t);
          }
          return b;
        };
        const queries = {}, skipped = {}, tokens = {}, all = {};
        for (const len of [16, 128]) {
          const s = await texts(32, len);
          all[len] = s;
          const counts = await Promise.all(s.map((x) => window.kiln.tokenCount(x)));
          tokens[len] = counts.reduce((a, b) => a + b, 0) / counts.length;
          const one = await best(s.slice(0, 1));
          queries[`1x${len}`] = one;
          // One run of the 32 sentences costs about 32 / batch runs of
          // the single sentence's bucket.
          const batch = len <= 32 ? 8 : len <= 64 ? 4 : len <= 128 ? 2 : 1;
          const estimate = (one * 32) / Math.min(batch, info.batch) / 1000;
          if (estimate > maxS) skipped[`32x${len}`] = `estimated ${estimate.toFixed(0)} s`;
          else queries[`32x${len}`] = await best(s);
        }
        return { info, first, queries, skipped, tokens, texts: all };
      },
      { measure, maxS: MAX_S },
    );
  } finally {
    await ctx.close();
  }
}

const gzipped = new Map();
const gz = (f) => {
  if (!gzipped.has(f)) gzipped.set(f, gzipSync(readFileSync(join(DIST, f))).length);
  return gzipped.get(f);
};
const raw = (f) => readFileSync(join(DIST, f)).length;
const sum = (files, size) => files.reduce((n, f) => n + size(f), 0);

try {
  const variants = JSON.parse(readFileSync(join(DIST, MODELS), "utf8"));
  // The adapter, and so the default class of variants.
  const probeDir = mkdtempSync(join(tmpdir(), "kiln-bench-"));
  const [ctx, page] = await browser(probeDir);
  await page.goto(url + "sentences.js");
  const fallback = await page.evaluate(async () => {
    const a = await navigator.gpu?.requestAdapter();
    return Boolean(a && (a.isFallbackAdapter ?? a.info?.isFallbackAdapter));
  });
  await ctx.close();
  rmSync(probeDir, { recursive: true, force: true });
  const wanted = process.env.KILN_BENCH_VARIANTS?.split(",") ??
    variants.filter((v) => v.class === (fallback ? "cpu" : "gpu")).map((v) => v.name);
  const rows = [];
  let adapter = null, texts = null;
  for (const name of wanted) {
    const v = variants.find((x) => x.name === name);
    if (!v) throw new Error(`no variant ${name} in ${MODELS}`);
    const files = [v.weights_file, ...v.buckets];
    const row = {
      name,
      class: v.class,
      weights: v.weights,
      arithmetic: v.arithmetic ?? "f32",
      bytes: sum(files, raw),
      gzip_bytes: sum(files, gz),
    };
    const userDir = mkdtempSync(join(tmpdir(), "kiln-bench-"));
    try {
      log(`${name}: cold visit`);
      const cold = await visit(userDir, name, false);
      if (cold.error) {
        row.error = cold.error;
      } else {
        log(`${name}: warm visit and queries`);
        const warm = await visit(userDir, name, true);
        adapter = warm.info?.adapter ?? adapter;
        texts ??= warm.texts;
        const phases = (r) => ({
          download_ms: r.info.downloadMs,
          prepare_ms: r.info.prepareMs,
          first_result_ms: r.first,
          from_cache: r.info.fromCache,
        });
        Object.assign(row, {
          buckets: warm.info.buckets,
          cold: phases(cold),
          warm: phases(warm),
          queries: warm.queries,
          skipped: warm.skipped,
          tokens: warm.tokens,
        });
      }
    } finally {
      rmSync(userDir, { recursive: true, force: true });
    }
    log(JSON.stringify(row));
    rows.push(row);
  }
  const js = ["pkg/kiln_web.js", "kiln.js", "app.js", "sentences.js"];
  console.log(
    JSON.stringify({
      adapter,
      fallback,
      variants: rows,
      // The queries' sentences (the native side runs the same).
      texts,
      wasm_bytes: raw("pkg/kiln_web_bg.wasm"),
      wasm_gzip_bytes: gz("pkg/kiln_web_bg.wasm"),
      js_bytes: sum(js, raw),
      js_gzip_bytes: sum(js, gz),
    }),
  );
} finally {
  server.close();
}
