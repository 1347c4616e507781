// How fast the browser makes an export's compute pipelines: one after
// another (`createComputePipeline`, what wgpu 30 calls; timed to the error
// scope's answer), all at once (`createComputePipelineAsync`, which wgpu 30
// does not offer: gfx-rs/wgpu#3794), and one after another again after the
// asynchronous ones (whether the browser reuses what it compiled). Each
// in a fresh browser profile with the shader disk cache off, `ROUNDS`
// times (3). Prints one JSON line per measurement.
//
//   node tests/web/pipelines.mjs web/dist/minilm-cpu-8x32.kiln

import { createServer } from "node:http";
import { readFileSync, mkdtempSync, rmSync } from "node:fs";
import { join, dirname } from "node:path";
import { tmpdir } from "node:os";
import { fileURLToPath } from "node:url";
import { createRequire } from "node:module";

const ROOT = join(dirname(fileURLToPath(import.meta.url)), "..", "..");
const require = createRequire(join(ROOT, "web", "package.json"));
const { chromium } = require("playwright-core");

// The kernels' WGSL from an export's manifest (docs/export-format.md:
// manifest offset and length at bytes 16 and 24 of the header).
const file = process.argv[2] ?? join(ROOT, "web", "dist", "minilm-cpu-8x32.kiln");
const bytes = readFileSync(file);
const at = Number(bytes.readBigUInt64LE(16));
const len = Number(bytes.readBigUInt64LE(24));
const kernels = JSON.parse(bytes.subarray(at, at + len).toString("utf8")).kernels.map((k) => k.wgsl);

const PAGE = `<!doctype html><script type="module">
const mode = new URLSearchParams(location.search).get("mode");
const code = await (await fetch("kernels.json")).json();
const device = await (await navigator.gpu.requestAdapter()).requestDevice();
const desc = (c) => ({ layout: "auto", compute: { module: device.createShaderModule({ code: c }), entryPoint: "main" } });
const out = {};
let t = performance.now();
if (mode !== "sync") {
  window.kept = await Promise.all(code.map((c) => device.createComputePipelineAsync(desc(c))));
  out.async_ms = performance.now() - t;
}
if (mode !== "async") {
  t = performance.now();
  device.pushErrorScope("validation");
  window.made = code.map((c) => device.createComputePipeline(desc(c)));
  const e = await device.popErrorScope();
  out[mode === "sync" ? "sync_ms" : "sync_after_async_ms"] = performance.now() - t;
  if (e) out.error = e.message;
}
window.result = out;
</script>`;

const server = createServer((req, res) => {
  const path = new URL(req.url, "http://x").pathname;
  if (path === "/kernels.json") return res.writeHead(200, { "content-type": "application/json" }).end(JSON.stringify(kernels));
  if (path === "/") return res.writeHead(200, { "content-type": "text/html" }).end(PAGE);
  res.writeHead(404).end();
});
await new Promise((ok) => server.listen(0, "127.0.0.1", ok));
try {
  for (let round = 0; round < Number(process.env.ROUNDS ?? 3); round++) {
    for (const mode of ["sync", "async", "both"]) {
      const dir = mkdtempSync(join(tmpdir(), "kiln-pipelines-"));
      const ctx = await chromium.launchPersistentContext(dir, {
        executablePath: process.env.CHROMIUM ?? "/usr/bin/chromium",
        headless: true,
        args: ["--no-sandbox", "--enable-unsafe-webgpu", "--disable-gpu-shader-disk-cache"],
      });
      try {
        const page = ctx.pages()[0] ?? (await ctx.newPage());
        await page.goto(`http://127.0.0.1:${server.address().port}/?mode=${mode}`);
        await page.waitForFunction(() => window.result, null, { timeout: 600_000 });
        const r = await page.evaluate(() => window.result);
        console.log(JSON.stringify({ file, kernels: kernels.length, mode, ...r }));
      } finally {
        await ctx.close();
        rmSync(dir, { recursive: true, force: true });
      }
    }
  }
} finally {
  server.close();
}
