#!/usr/bin/env bash
# Kiln in the browser.
#
#   scripts/web.sh build         wasm + page + exported MiniLM into web/dist/
#   scripts/web.sh serve [PORT]  builds if needed, serves web/dist/ (8000)
#   scripts/web.sh test          builds, then runs the page in headless
#                                Chromium with WebGPU (tests/web/*.test.mjs)
#   scripts/web.sh bench         browser timings per model variant as JSON
#                                (tests/web/bench.mjs; adds f32 weights)
#
# Installs what it needs when missing: Debian's rustc-web (a rustc that can
# build std for wasm32), wasm-bindgen-cli at the wasm-bindgen crate's exact
# version, and for `test` Chromium and playwright-core (npm, with the system
# Chromium: never a browser download).
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
DIST=web/dist
# The native run of the exported model, for the page test (not served).
CHECK=target/web-check
WASM_TARGET_DIR=${KILN_WASM_TARGET_DIR:-$ROOT/target/wasm}
# The native binaries (export, inspect, run), wherever cargo puts them.
BIN="${CARGO_TARGET_DIR:-target}/release"
BINDGEN_VERSION=$(sed -n 's/^wasm-bindgen = "=\(.*\)"/\1/p' web/Cargo.toml)
# Sequence buckets of the page's model, by tokens then batch: each run
# takes the one of fewest tokens per run that holds its sentences (256 for
# batches, 32 for the search box's single query: an eighth of the work).
BUCKETS=${KILN_WEB_BUCKETS:-1x32 8x32 4x64 2x128 1x256}
export XDG_RUNTIME_DIR="${XDG_RUNTIME_DIR:-/tmp}"
export WGPU_BACKEND="${WGPU_BACKEND:-vulkan}"

apt_install() {
    local missing=()
    for p in "$@"; do
        dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
    done
    if [ ${#missing[@]} -gt 0 ]; then
        echo "installing ${missing[*]} (apt)"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
    fi
}

ensure_toolchain() {
    # rustup cannot fetch the wasm32 std here; Debian's rustc-web builds it
    # from source (-Zbuild-std), driven by rustup's cargo.
    apt_install rustc-web rust-web-llvm rust-web-src lld-22
    if [ "$(wasm-bindgen --version 2>/dev/null | awk '{print $2}')" != "$BINDGEN_VERSION" ]; then
        echo "installing wasm-bindgen-cli $BINDGEN_VERSION (cargo, a few minutes, once)"
        cargo install -q wasm-bindgen-cli --version "$BINDGEN_VERSION"
    fi
}

# Newest modification time under the given paths (0 when none).
newest() {
    find "$@" -type f -printf '%T@\n' 2>/dev/null | sort -n | tail -1 | cut -d. -f1
}

build_wasm() {
    local wasm="$WASM_TARGET_DIR/wasm32-unknown-unknown/release/kiln_web.wasm"
    local src
    src=$(newest web/src web/Cargo.toml engine/src engine/Cargo.toml functionalize/src)
    if [ -f "$DIST/pkg/kiln_web_bg.wasm" ] && [ "$(newest "$DIST/pkg")" -ge "$src" ]; then
        return
    fi
    ensure_toolchain
    echo "building the wasm module (release)"
    (cd web && RUSTC=/usr/bin/rustc RUSTC_BOOTSTRAP=1 CARGO_TARGET_DIR="$WASM_TARGET_DIR" \
        cargo build --release -Zbuild-std=std,panic_abort --target wasm32-unknown-unknown)
    rm -rf "$DIST/pkg"
    wasm-bindgen --target web --no-typescript --out-dir "$DIST/pkg" "$wasm"
}

build_model() {
    # The model for browsers: WebGPU's default limits, one export per
    # sequence bucket, all reading one weights file (the page downloads it
    # once), in two weight formats: int8 matrices (a scale per output
    # channel and 64 inputs; the smaller download, the page's default) and
    # f16 (widened to f32 at load; `?weights=f16`). Neither needs
    # shader-f16. The native run of each bucket's export on sentences that
    # fit it is kept for the page test.
    local model_src
    model_src=$(newest engine/src functionalize/src src scripts/web.sh)
    if [ -f "$DIST/models.json" ] && [ "$(newest "$DIST/models.json")" -ge "$model_src" ]; then
        return
    fi
    echo "exporting MiniLM for the web (buckets $BUCKETS; int8 and f16 weights, each in one file)"
    cargo build -q --release --bin minilm --bin kiln
    rm -f "$DIST"/minilm*.kiln "$DIST"/minilm*.weights
    mkdir -p "$CHECK"
    rm -f "$CHECK"/*.safetensors
    local short=("A man is playing a guitar." "Someone plays a guitar." \
        "The weather is lovely today." "It's so sunny outside!" \
        "A woman is slicing an onion in the kitchen." \
        "The stock market fell sharply after the announcement." \
        "Kiln turns programs with views and mutations into pure functions." "Hi")
    # Longer text from the MiniLM fixture: 49 and 34 tokens, 100 words
    # (115 tokens), 300 words (cut to 256 as sentence-transformers cuts).
    local -a mid long para
    mapfile -t mid < <(python3 -c 'import json; s = json.load(open("tests/minilm/sentences.json")); print(s[6]); print(s[10])')
    mapfile -t long < <(python3 -c 'import json; s = json.load(open("tests/minilm/sentences.json")); print(s[11])')
    mapfile -t para < <(python3 -c 'import json; s = json.load(open("tests/minilm/sentences.json")); print(s[12])')
    # Two variants of kernels over the one weights file: GPU-class (what a
    # page's user most often has) and this adapter's own (a CPU's: for
    # software fallback adapters, where GPU-class kernels are 2.5x slower).
    local gfiles=() files=() checks=() qgfiles=() qfiles=() hgfiles=()
    for b in $BUCKETS; do
        "$BIN"/minilm --export "$DIST/minilm-gpu-$b.kiln" --bucket "$b" --weights-dtype f16 --web \
            --weights-file minilm.weights "${short[0]}"
        "$BIN"/minilm --export "$DIST/minilm-gpu-i8-$b.kiln" --bucket "$b" --weights-dtype i8 --web \
            --weights-file minilm-i8.weights "${short[0]}"
        # f16 arithmetic (for adapters with shader-f16) over the same f16
        # weights: its weights file must be the same bytes.
        cp "$DIST/minilm.weights" "$CHECK/minilm.weights.f16"
        "$BIN"/minilm --export "$DIST/minilm-gpu-f16a-$b.kiln" --bucket "$b" --arithmetic f16 --web \
            --weights-file minilm.weights "${short[0]}"
        cmp "$DIST/minilm.weights" "$CHECK/minilm.weights.f16"
        rm "$CHECK/minilm.weights.f16"
        rm "$DIST/minilm-gpu-$b.inputs.safetensors" "$DIST/minilm-gpu-i8-$b.inputs.safetensors" \
            "$DIST/minilm-gpu-f16a-$b.inputs.safetensors"
        gfiles+=("minilm-gpu-$b.kiln")
        qgfiles+=("minilm-gpu-i8-$b.kiln")
        hgfiles+=("minilm-gpu-f16a-$b.kiln")
    done
    for b in $BUCKETS; do
        local -a these
        case "$b" in
            1x32) these=("${short[0]}") ;;
            *x32) these=("${short[@]}") ;;
            *x64) these=("${mid[@]}") ;;
            *x128) these=("${long[@]}") ;;
            *) these=("${para[@]}") ;;
        esac
        "$BIN"/minilm --export "$DIST/minilm-cpu-$b.kiln" --bucket "$b" --weights-dtype f16 --web \
            --web-cpu --weights-file minilm.weights "${these[@]}"
        "$BIN"/minilm --export "$DIST/minilm-cpu-i8-$b.kiln" --bucket "$b" --weights-dtype i8 --web \
            --web-cpu --weights-file minilm-i8.weights "${these[@]}"
        mv "$DIST/minilm-cpu-$b.inputs.safetensors" "$CHECK/"
        rm "$DIST/minilm-cpu-i8-$b.inputs.safetensors"
        "$BIN"/kiln run "$DIST/minilm-cpu-$b.kiln" \
            --inputs "$CHECK/minilm-cpu-$b.inputs.safetensors" --output "$CHECK/native-$b.safetensors"
        "$BIN"/kiln run "$DIST/minilm-cpu-i8-$b.kiln" \
            --inputs "$CHECK/minilm-cpu-$b.inputs.safetensors" --output "$CHECK/native-i8-$b.safetensors"
        files+=("minilm-cpu-$b.kiln")
        qfiles+=("minilm-cpu-i8-$b.kiln")
        checks+=("$b" "$(python3 -c 'import json, sys; print(json.dumps(sys.argv[1:]))' "${these[@]}")")
    done
    python3 -c 'import json, sys; a = sys.argv[1:]; print(json.dumps([{"bucket": a[i], "sentences": json.loads(a[i + 1])} for i in range(0, len(a), 2)], indent=1))' \
        "${checks[@]}" >"$CHECK/checks.json"
    # The variants the page chooses from by its adapter (one: it needs only
    # WebGPU's defaults), with what each needs (all its buckets together).
    local reqs=()
    for f in "${gfiles[@]}" "${files[@]}" "${qgfiles[@]}" "${qfiles[@]}" "${hgfiles[@]}"; do
        reqs+=("$("$BIN"/kiln inspect "$DIST/$f" --requires)")
    done
    python3 -c 'import json, os, sys
dist, n = sys.argv[1], int(sys.argv[2])
files, reqs = sys.argv[3:3 + 5 * n], [json.loads(r) for r in sys.argv[3 + 5 * n:]]
# What every bucket of a variant needs: features of any, the largest
# limits, the smallest offset alignment.
def need(rs):
    out = {k: (min if k == "min_storage_buffer_offset_alignment" else max)(r[k] for r in rs)
           for k in rs[0] if k != "features"}
    out["features"] = sorted({f for r in rs for f in r["features"]})
    return out
size = lambda f: os.path.getsize(os.path.join(dist, f))
# The f16-arithmetic variant runs anywhere (its kernels carry portable
# WGSL) but is chosen only where the adapter has shader-f16.
def variant(k, c, w, wf, math):
    r = need(reqs[k * n:(k + 1) * n])
    if math == "f16":
        r["features"] = sorted(set(r["features"]) | {"shader-f16"})
    return {"name": f"minilm-{c}-{w}" + ("-f16-arithmetic" if math == "f16" else ""),
            "class": c, "weights": w, "arithmetic": math,
            "weights_file": wf, "buckets": files[k * n:(k + 1) * n],
            "bytes": size(wf) + sum(map(size, files[k * n:(k + 1) * n])), "requires": r}
print(json.dumps([variant(k, *v) for k, v in enumerate([
    ("gpu", "f16", "minilm.weights", "f32"), ("cpu", "f16", "minilm.weights", "f32"),
    ("gpu", "i8", "minilm-i8.weights", "f32"), ("cpu", "i8", "minilm-i8.weights", "f32"),
    ("gpu", "f16", "minilm.weights", "f16")])], indent=1))' \
        "$DIST" "${#files[@]}" "${gfiles[@]}" "${files[@]}" "${qgfiles[@]}" "${qfiles[@]}" "${hgfiles[@]}" \
        "${reqs[@]}" >"$DIST/models.json"
    cp "$("$BIN"/minilm --print-model-dir)/tokenizer.json" "$DIST/tokenizer.json"
}

build() {
    mkdir -p "$DIST"
    build_wasm
    cp web/index.html web/app.js web/kiln.js web/sentences.js web/style.css "$DIST/"
    build_model
    echo "built $DIST/ ($(du -sh "$DIST" | cut -f1)): serve it with scripts/web.sh serve"
}

build_bench_models() {
    # The benchmark's variant list: the page's, plus f32 weights (90 MB, too
    # large a download for the page) in both kernel classes, in bench/.
    local out="$DIST/bench"
    if [ -f "$out/models.json" ] && [ "$(newest "$out/models.json")" -ge "$(newest "$DIST/models.json")" ]; then
        return
    fi
    echo "exporting MiniLM with f32 weights for the benchmark (buckets $BUCKETS)" >&2
    cargo build -q --release --bin minilm --bin kiln >&2
    rm -rf "$out"
    mkdir -p "$out"
    local args=()
    for c in gpu cpu; do
        local flags=(--web)
        [ "$c" = cpu ] && flags+=(--web-cpu)
        args+=("$c")
        for b in $BUCKETS; do
            "$BIN"/minilm --export "$out/minilm-$c-f32-$b.kiln" --bucket "$b" --weights-dtype f32 \
                "${flags[@]}" --weights-file minilm-f32.weights "Hi" >&2
            rm "$out/minilm-$c-f32-$b.inputs.safetensors"
            args+=("bench/minilm-$c-f32-$b.kiln" "$("$BIN"/kiln inspect "$out/minilm-$c-f32-$b.kiln" --requires)")
        done
    done
    python3 -c 'import json, os, sys
dist, n, a = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
variants = json.load(open(os.path.join(dist, "models.json")))
size = lambda f: os.path.getsize(os.path.join(dist, f))
while a:
    c, pairs, a = a[0], a[1:1 + 2 * n], a[1 + 2 * n:]
    files, reqs = pairs[0::2], [json.loads(r) for r in pairs[1::2]]
    # What every bucket needs: as build_model computes it.
    r = {k: (min if k == "min_storage_buffer_offset_alignment" else max)(x[k] for x in reqs)
         for k in reqs[0] if k != "features"}
    r["features"] = sorted({f for x in reqs for f in x["features"]})
    variants.append({"name": f"minilm-{c}-f32", "class": c, "weights": "f32", "arithmetic": "f32",
                     "weights_file": "bench/minilm-f32.weights", "buckets": files,
                     "bytes": size("bench/minilm-f32.weights") + sum(map(size, files)), "requires": r})
print(json.dumps(variants, indent=1))' "$DIST" "$(echo $BUCKETS | wc -w)" "${args[@]}" >"$out/models.json"
}

ensure_browser() {
    apt_install chromium
    command -v node >/dev/null || apt_install nodejs npm
    if [ ! -d web/node_modules/playwright-core ]; then
        echo "installing playwright-core (npm; the system Chromium drives it)"
        (cd web && npm install --no-audit --no-fund --silent)
    fi
}

case "${1:-build}" in
build) build ;;
serve)
    build
    port=${2:-8000}
    echo "serving $DIST/ on http://localhost:$port/ (Chrome/Edge 113+; on Linux Chromium needs --enable-unsafe-webgpu)"
    exec python3 -m http.server "$port" --bind 127.0.0.1 --directory "$DIST"
    ;;
test)
    build
    ensure_browser
    node --test tests/web/*.test.mjs
    ;;
bench)
    # One JSON object on stdout (progress on stderr).
    build >&2
    build_bench_models
    ensure_browser >&2
    node tests/web/bench.mjs
    ;;
*)
    echo "usage: scripts/web.sh build | serve [PORT] | test | bench" >&2
    exit 2
    ;;
esac
