// Browser timings of the demo page (web/dist, scripts/web.sh build) in
// headless Chromium with WebGPU, printed as one JSON object: time to first
// result with a cold and a warm Cache Storage, ms per query of 1 and 32
// sentences, and the gzipped sizes of the wasm and the JavaScript.
// Run by `scripts/web.sh bench` (the benchmark report calls it).

import { createServer } from "node:http";
import { readFileSync, mkdtempSync, rmSync, existsSync } from "node:fs";
import { join, extname, dirname } from "node:path";
import { tmpdir } from "node:os";
import { gzipSync } from "node:zlib";
import { fileURLToPath } from "node:url";
import { createRequire } from "node:module";

const ROOT = join(dirname(fileURLToPath(import.meta.url)), "..", "..");
const DIST = join(ROOT, "web", "dist");
const require = createRequire(join(ROOT, "web", "package.json"));
const { chromium } = require("playwright-core");

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
const userDir = mkdtempSync(join(tmpdir(), "kiln-bench-"));

// One visit: navigation to the first query's result (model download or
// cache, wasm, load, pipelines, one embedding), the corpus excluded.
async function visit(measureQueries) {
  const ctx = await chromium.launchPersistentContext(userDir, {
    executablePath: process.env.CHROMIUM ?? "/usr/bin/chromium",
    headless: true,
    args: ["--no-sandbox", "--enable-unsafe-webgpu", "--disable-quic", "--no-first-run"],
  });
  const page = ctx.pages()[0] ?? (await ctx.newPage());
  const t0 = Date.now();
  await page.goto(url + "?bench");
  const r = await page.evaluate(async (measure) => {
    await window.kiln.ready;
    const info = await window.kiln.info();
    const t = performance.now();
    await window.kiln.embed(["How is the weather today?"]);
    const first = info.loadMs + (performance.now() - t);
    if (!measure) return { info, first };
    const best = async (s) => {
      let b = Infinity;
      for (let i = 0; i < 3; i++) {
        const t = performance.now();
        await window.kiln.embed(s);
        b = Math.min(b, performance.now() - t);
      }
      return b;
    };
    return {
      info,
      first,
      query1: await best([window.kiln.sentences[0]]),
      query32: await best(window.kiln.sentences.slice(0, 32)),
    };
  }, measureQueries);
  r.wallToReadyMs = Date.now() - t0;
  await ctx.close();
  return r;
}

try {
  const cold = await visit(false);
  const warm = await visit(true);
  const gz = (files) => files.reduce((n, f) => n + gzipSync(readFileSync(join(DIST, f))).length, 0);
  const raw = (files) => files.reduce((n, f) => n + readFileSync(join(DIST, f)).length, 0);
  const js = ["pkg/kiln_web.js", "kiln.js", "app.js", "sentences.js"];
  const [variant] = JSON.parse(readFileSync(join(DIST, "models.json"), "utf8"));
  const model = [variant.weights_file, ...variant.buckets];
  console.log(
    JSON.stringify({
      adapter: warm.info.adapter,
      bucket: [warm.info.batch, warm.info.tokens],
      buckets: warm.info.buckets,
      cold_first_result_ms: cold.first,
      cold_from_cache: cold.info.fromCache,
      warm_first_result_ms: warm.first,
      warm_from_cache: warm.info.fromCache,
      query_1_ms: warm.query1,
      query_32_ms: warm.query32,
      wasm_bytes: raw(["pkg/kiln_web_bg.wasm"]),
      wasm_gzip_bytes: gz(["pkg/kiln_web_bg.wasm"]),
      js_bytes: raw(js),
      js_gzip_bytes: gz(js),
      model_bytes: raw(model),
      model_gzip_bytes: gz(model),
    }),
  );
} finally {
  server.close();
  rmSync(userDir, { recursive: true, force: true });
}
