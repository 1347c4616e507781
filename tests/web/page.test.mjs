// The semantic-search page (web/dist, built by scripts/web.sh build) in
// headless Chromium with WebGPU (SwiftShader without a GPU), driven by
// playwright-core with the system Chromium: embeddings equal the native
// run of the same export (f16 weights on SwiftShader; the int8 export
// through the generic runner, within cosine 0.999 of f16's, and the
// f16-arithmetic one within 0.9999), a query typed
// into the page finds its neighbour,
// a screenshot goes to docs/web.png, and a second visit loads the model
// from Cache Storage without downloading it.
//
// Run by `scripts/web.sh test` (which builds and installs what it needs).

import { test, after } from "node:test";
import assert from "node:assert/strict";
import { createServer } from "node:http";
import { readFileSync, mkdtempSync, rmSync, existsSync } from "node:fs";
import { join, extname, dirname } from "node:path";
import { tmpdir } from "node:os";
import { fileURLToPath } from "node:url";
import { createRequire } from "node:module";

const ROOT = join(dirname(fileURLToPath(import.meta.url)), "..", "..");
const DIST = join(ROOT, "web", "dist");
const require = createRequire(join(ROOT, "web", "package.json"));
const { chromium } = require("playwright-core");

const TYPES = {
  ".html": "text/html",
  ".js": "text/javascript",
  ".css": "text/css",
  ".json": "application/json",
  ".wasm": "application/wasm",
};

/** A static server of web/dist on a free loopback port, counting requests. */
function serve() {
  const hits = new Map();
  const server = createServer((req, res) => {
    const path = decodeURIComponent(new URL(req.url, "http://x").pathname);
    const file = join(DIST, path === "/" ? "index.html" : path);
    hits.set(path, (hits.get(path) ?? 0) + 1);
    if (!file.startsWith(DIST) || !existsSync(file)) {
      res.writeHead(404).end();
      return;
    }
    const body = readFileSync(file);
    res.writeHead(200, {
      "content-type": TYPES[extname(file)] ?? "application/octet-stream",
      "content-length": body.length,
    });
    res.end(body);
  });
  return new Promise((ok) =>
    server.listen(0, "127.0.0.1", () => ok({ server, hits, port: server.address().port })),
  );
}

/** Tensor `name` (F32 or I32) of a safetensors file: { shape, data }. */
function readSafetensors(path, name) {
  const buf = readFileSync(path);
  const n = Number(buf.readBigUInt64LE(0));
  const t = JSON.parse(buf.subarray(8, 8 + n).toString("utf8"))[name];
  assert.ok(t, `${path} has no tensor ${name}`);
  const Arr = { F32: Float32Array, I32: Int32Array }[t.dtype];
  assert.ok(Arr, `${name} is ${t.dtype}`);
  const [a, b] = t.data_offsets;
  const bytes = buf.subarray(8 + n + a, 8 + n + b);
  const copy = bytes.buffer.slice(bytes.byteOffset, bytes.byteOffset + bytes.length);
  return { shape: t.shape, data: new Arr(copy) };
}

function cosine(a, b) {
  let ab = 0, aa = 0, bb = 0;
  for (let i = 0; i < a.length; i++) {
    ab += a[i] * b[i];
    aa += a[i] * a[i];
    bb += b[i] * b[i];
  }
  return ab / Math.sqrt(aa * bb);
}

// Browsers a failed test left open: closed at the end, so a failure ends
// the run instead of leaving node waiting on them.
const opened = [];
const closeAll = () => Promise.all(opened.splice(0).map((c) => c.close().catch(() => {})));
after(closeAll);

async function openPage(userDir, port, log, query = "") {
  const ctx = await chromium.launchPersistentContext(userDir, {
    executablePath: process.env.CHROMIUM ?? "/usr/bin/chromium",
    headless: true,
    args: ["--no-sandbox", "--enable-unsafe-webgpu", "--disable-quic", "--no-first-run"],
    viewport: { width: 900, height: 900 },
  });
  opened.push(ctx);
  const page = ctx.pages()[0] ?? (await ctx.newPage());
  page.on("console", (m) => log.push(`[${m.type()}] ${m.text()}`));
  page.on("pageerror", (e) => log.push(`[pageerror] ${e.message}`));
  await page.goto(`http://127.0.0.1:${port}/${query}`);
  await page.waitForFunction(() => window.kiln !== undefined);
  const ready = await page.evaluate(() =>
    window.kiln.ready.then(
      () => "ok",
      (e) => `error: ${e.message ?? e}`,
    ),
  );
  assert.equal(ready, "ok", `the page did not get ready:\n${log.join("\n")}`);
  return { ctx, page };
}

test("the page embeds like the native run, searches, and caches the model", { timeout: 600_000 }, async () => {
  assert.ok(existsSync(join(DIST, "minilm.weights")), "web/dist is not built: scripts/web.sh build");
  // Per bucket, the sentences exported with it and their native
  // embeddings (`kiln run` of the same file), written by scripts/web.sh build.
  const check = join(ROOT, "target", "web-check");
  const checks = JSON.parse(readFileSync(join(check, "checks.json"), "utf8"));
  const sentences = checks.flatMap((c) => c.sentences);
  const native = (prefix) =>
    checks.flatMap((c) => {
      const n = readSafetensors(join(check, `${prefix}-${c.bucket}.safetensors`), "output.0");
      const d = n.shape[1];
      return c.sentences.map((_, i) => n.data.subarray(i * d, (i + 1) * d));
    });
  // The f16 and int8 exports' native runs.
  const natives = native("native");
  const nativesI8 = native("native-i8");
  const dim = natives[0].length;
  const { server, hits, port } = await serve();
  const userDir = mkdtempSync(join(tmpdir(), "kiln-chromium-"));
  const log = [];
  try {
    // First visit: downloads the model.
    let { ctx, page } = await openPage(userDir, port, log);
    const info = await page.evaluate(() => window.kiln.info());
    const phases = (i) =>
      `download ${i.downloadMs.toFixed(0)} ms, GPU ${i.prepareMs.toFixed(0)} ms, ready in ${i.loadMs.toFixed(0)} ms, corpus ${i.corpusMs.toFixed(0)} ms`;
    console.log(`adapter: ${info.adapter}; buckets ${info.buckets}; first visit (cold cache): ${phases(info)}`);
    assert.equal(info.fromCache, false);
    // The page showed each phase: the download, each bucket made ready on
    // the GPU, the corpus embedded.
    const n = info.buckets.length;
    assert.deepEqual(info.phases, [
      "download",
      ...Array.from({ length: n }, (_, i) => `prepare ${i + 1}/${n}`),
      "embed",
    ]);
    assert.deepEqual(info.buckets, checks.map((c) => c.bucket));
    // SwiftShader is a software fallback: the CPU-class variant, with f16
    // weights (int8 dequantized per element is 8.5x slower there); a GPU
    // would get int8, and either is there on request.
    assert.equal(info.variant, "minilm-cpu-f16");
    assert.equal(info.weights, "f16");
    const chosen = await page.evaluate(async () => {
      const { chooseVariant } = await import("./kiln.js");
      const variants = await (await fetch("models.json")).json();
      let missing = "";
      try {
        await chooseVariant(variants, "q4");
      } catch (e) {
        missing = String(e.message ?? e);
      }
      // The GPU-class f16 variants: f16 arithmetic first where the adapter
      // has shader-f16, else the f32 one (SwiftShader has no shader-f16).
      const gpu = variants.filter((v) => v.class === "gpu");
      const adapter = await navigator.gpu.requestAdapter();
      return {
        i8: (await chooseVariant(variants, "i8")).name,
        f16: (await chooseVariant(gpu, "f16")).name,
        shaderF16: adapter.features.has("shader-f16"),
        half: variants.find((v) => v.arithmetic === "f16"),
        missing,
        all: variants.map((v) => [v.name, v.bytes]),
      };
    });
    assert.equal(chosen.i8, "minilm-cpu-i8");
    assert.equal(chosen.shaderF16, false, "SwiftShader offers shader-f16: the fallback goes untested");
    assert.equal(chosen.f16, "minilm-gpu-f16");
    assert.equal(chosen.half?.name, "minilm-gpu-f16-f16-arithmetic");
    assert.ok(chosen.half.requires.features.includes("shader-f16"), JSON.stringify(chosen.half));
    assert.equal(chosen.half.weights_file, "minilm.weights");
    assert.match(chosen.missing, /No model with q4 weights here \(there are: f16, i8\)/);
    // int8 weights are 0.53x the f16 ones; the GPU-class kernels (about
    // 1 MB of WGSL a bucket, int8's a little more) are the rest.
    const bytes = Object.fromEntries(chosen.all);
    assert.ok(bytes["minilm-gpu-i8"] < 0.65 * bytes["minilm-gpu-f16"], JSON.stringify(bytes));
    assert.ok(bytes["minilm-cpu-i8"] < 0.6 * bytes["minilm-cpu-f16"], JSON.stringify(bytes));
    assert.equal(info.tokens, 256);
    // Every length from a word to 300 words in one call: the page groups
    // them into runs of the smallest bucket that holds them.
    const rows = await page.evaluate(
      async (s) => (await window.kiln.embed(s)).map((a) => Array.from(a)),
      sentences,
    );
    assert.equal(rows.length, sentences.length);
    for (let i = 0; i < sentences.length; i++) {
      assert.equal(rows[i].length, dim);
      const c = cosine(rows[i], natives[i]);
      assert.ok(c >= 0.9999, `"${sentences[i].slice(0, 60)}": cosine ${c} with the native run`);
    }
    // The 300 words are more tokens than the model reads: the page says so.
    const para = checks[checks.length - 1].sentences[0];
    assert.ok((await page.evaluate((t) => window.kiln.tokenCount(t), para)) > 256);
    await page.fill("#query", para);
    await page.click("#go");
    await page.waitForSelector("#note:not([hidden])");
    assert.match(await page.textContent("#note"), /reads the first 256/);
    await page.waitForSelector("#results li");
    // The generic runner on one bucket's file and the shared weights:
    // typed arrays in and out, the export's own token inputs, the native
    // run's output; a wrong array type is an error that says what the
    // input must be.
    // The first bucket of several sentences (8x32), and where its
    // sentences start among all checks' native rows.
    const k = checks.findIndex((c) => c.sentences.length > 1);
    const bucket = checks[k].bucket;
    const at = checks.slice(0, k).reduce((n, c) => n + c.sentences.length, 0);
    const inputs = join(check, `minilm-cpu-${bucket}.inputs.safetensors`);
    const ids = readSafetensors(inputs, "input_ids");
    const mask = readSafetensors(inputs, "attention_mask");
    const run = await page.evaluate(
      async ([file, ids, mask]) => {
        const { loadProgram } = await import("./kiln.js");
        const p = await loadProgram(file, "minilm.weights");
        const [out] = await p.run([Int32Array.from(ids), Int32Array.from(mask)]);
        let refused = "";
        try {
          await p.run([Float32Array.from(ids), Int32Array.from(mask)]);
        } catch (e) {
          refused = String(e.message ?? e);
        }
        let unweighted = "";
        try {
          await loadProgram(file);
        } catch (e) {
          unweighted = String(e.message ?? e);
        }
        return { inputs: p.inputs, out: Array.from(out), refused, unweighted };
      },
      [`minilm-cpu-${bucket}.kiln`, Array.from(ids.data), Array.from(mask.data)],
    );
    assert.deepEqual(
      run.inputs.map((i) => [i.name, i.dtype, i.shape]),
      [["input_ids", "i32", ids.shape], ["attention_mask", "i32", mask.shape]],
    );
    const n0 = checks[k].sentences.length;
    assert.equal(run.out.length, ids.shape[0] * dim);
    for (let i = 0; i < n0; i++) {
      const c = cosine(run.out.slice(i * dim, (i + 1) * dim), natives[at + i]);
      assert.ok(c >= 0.9999, `Program.run row ${i}: cosine ${c}`);
    }
    assert.ok(
      run.refused.includes(
        `input \`input_ids\` (i32 [${ids.shape.join(", ")}]) must be an Int32Array of ${ids.shape[0] * ids.shape[1]} elements`,
      ),
      run.refused,
    );
    assert.match(run.unweighted, /minilm\.weights/);
    // The int8 export of the same bucket through the same runner: its
    // native run's embeddings, and within cosine 0.999 (the stated
    // tolerance of int8 weights) of the f16 model's.
    // An export of that bucket run on its ids and mask by the page's
    // generic runner.
    const runExport = (file, weights) =>
      page.evaluate(
        async ([file, weights, ids, mask]) => {
          const { loadProgram } = await import("./kiln.js");
          const p = await loadProgram(file, weights);
          const [out] = await p.run([Int32Array.from(ids), Int32Array.from(mask)]);
          return Array.from(out);
        },
        [file, weights, Array.from(ids.data), Array.from(mask.data)],
      );
    const q8 = await runExport(`minilm-cpu-i8-${bucket}.kiln`, "minilm-i8.weights");
    let worst = 1;
    for (let i = 0; i < n0; i++) {
      const row = q8.slice(i * dim, (i + 1) * dim);
      const c = cosine(row, nativesI8[at + i]);
      assert.ok(c >= 0.9999, `int8 Program.run row ${i}: cosine ${c} with the native run`);
      const q = cosine(row, natives[at + i]);
      assert.ok(q >= 0.999, `int8 Program.run row ${i}: cosine ${q} to the f16 model`);
      worst = Math.min(worst, q);
    }
    console.log(`int8 weights in the page: lowest cosine to the f16 model ${worst.toFixed(6)}`);
    // The f16-arithmetic export (GPU class) of the same bucket, over the
    // same weights file: here without shader-f16, so its portable
    // kernels; within cosine 0.9999 (the stated tolerance of f16
    // arithmetic) of the f32-arithmetic model's native embeddings.
    const half = await runExport(`minilm-gpu-f16a-${bucket}.kiln`, "minilm.weights");
    let halfWorst = 1;
    for (let i = 0; i < n0; i++) {
      const c = cosine(half.slice(i * dim, (i + 1) * dim), natives[at + i]);
      assert.ok(c >= 0.9999, `f16 arithmetic Program.run row ${i}: cosine ${c} to the f32-arithmetic model`);
      halfWorst = Math.min(halfWorst, c);
    }
    console.log(`f16 arithmetic in the page: lowest cosine to the f32-arithmetic model ${halfWorst.toFixed(6)}`);

    // A query through the page's own search box.
    await page.fill("#query", "Who is playing the guitar?");
    await page.click("#go");
    await page.waitForSelector("#note", { state: "hidden" });
    // The previous search's results stay until this one's replace them.
    await page
      .waitForFunction(
        () => /guitar/.test(document.querySelector("#results li:first-child .sentence")?.textContent ?? ""),
        null,
        { timeout: 120_000 },
      )
      .catch(() => {});
    const top = await page.textContent("#results li:first-child .sentence");
    assert.match(top, /guitar/, `top result: ${top}`);
    await page.screenshot({ path: join(ROOT, "docs", "web.png") });
    await ctx.close();
    assert.equal(hits.get("/minilm.weights"), 1);
    assert.equal(hits.get("/minilm-i8.weights"), 1);

    // Second visit: the model comes from Cache Storage.
    ({ ctx, page } = await openPage(userDir, port, log));
    const again = await page.evaluate(() => window.kiln.info());
    console.log(`second visit (warm: Cache Storage): ${phases(again)}`);
    assert.equal(again.fromCache, true);
    assert.equal(hits.get("/minilm.weights"), 1, "the second visit downloaded the weights again");
    const [q] = await page.evaluate(async (s) => (await window.kiln.embed(s)).map((a) => Array.from(a)), [sentences[0]]);
    assert.ok(cosine(q, natives[0]) >= 0.9999);
    await ctx.close();
  } finally {
    server.close();
    await closeAll();
    rmSync(userDir, { recursive: true, force: true });
  }
});

test("?variant= takes that variant or says why not; ?bench skips the corpus", { timeout: 300_000 }, async () => {
  const { server, port } = await serve();
  const userDir = mkdtempSync(join(tmpdir(), "kiln-page-"));
  const log = [];
  try {
    const { ctx, page } = await openPage(userDir, port, log, "?bench&variant=minilm-cpu-i8");
    const info = await page.evaluate(() => window.kiln.info());
    assert.equal(info.variant, "minilm-cpu-i8");
    assert.equal(info.weights, "i8");
    assert.match(await page.textContent("#status"), /^0 sentences embedded/);
    await ctx.close();
    // The page's error for `query` (it never gets ready).
    const problem = async (query) => {
      const c = await chromium.launchPersistentContext(userDir, {
        executablePath: process.env.CHROMIUM ?? "/usr/bin/chromium",
        headless: true,
        args: ["--no-sandbox", "--enable-unsafe-webgpu", "--disable-quic", "--no-first-run"],
      });
      try {
        const p = c.pages()[0] ?? (await c.newPage());
        await p.goto(`http://127.0.0.1:${port}/${query}`);
        await p.waitForSelector("#problem:not([hidden])", { timeout: 60_000 });
        return await p.textContent("#problem");
      } finally {
        await c.close();
      }
    };
    assert.match(await problem("?variant=nope"), /No model variant nope \(there are: minilm-gpu-f16, .*minilm-cpu-i8/);
    // SwiftShader has no shader-f16 (the first test asserts it).
    assert.match(await problem("?variant=minilm-gpu-f16-f16-arithmetic"), /cannot run minilm-gpu-f16-f16-arithmetic: it needs feature shader-f16/);
  } finally {
    server.close();
    await closeAll();
    rmSync(userDir, { recursive: true, force: true });
  }
});

test("without WebGPU the page says so and how to enable it", { timeout: 120_000 }, async () => {
  const { server, port } = await serve();
  const browser = await chromium.launch({
    executablePath: process.env.CHROMIUM ?? "/usr/bin/chromium",
    headless: true,
    // No --enable-unsafe-webgpu: headless Chromium on Linux then offers no adapter.
    args: ["--no-sandbox", "--disable-quic", "--no-first-run"],
  });
  try {
    const page = await browser.newPage();
    await page.goto(`http://127.0.0.1:${port}/`);
    await page.waitForSelector("#problem:not([hidden])", { timeout: 60_000 });
    const msg = await page.textContent("#problem");
    assert.match(msg, /WebGPU/);
    assert.match(msg, /enable|Chrome|chrome:\/\/gpu/);
    assert.equal(await page.isDisabled("#query"), true);
  } finally {
    await browser.close();
    server.close();
  }
});
