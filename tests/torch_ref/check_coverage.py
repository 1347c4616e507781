#!/usr/bin/env python3
"""List the spec's op names that no program uses.

    python3 tests/torch_ref/check_coverage.py                       # examples/programs
    python3 tests/torch_ref/check_coverage.py tests/programs/ops    # another folder
    python3 tests/torch_ref/check_coverage.py --counts              # also print uses per op

The op list comes from the "Op names" section of shared/spec/program-format.md
(found beside the repository, or given with --spec; a built-in copy is used if
the spec cannot be found). `<elementwise>_` is expanded; a name that has no
aten op (maximum_, minimum_, where_) is listed separately and not required. Exit status 1 if a required op is unused.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

BUILTIN = {
    "views": "view reshape slice select transpose t permute expand diagonal as_strided unsqueeze squeeze alias narrow unfold split chunk unbind",
    "view copies": "view_copy slice_copy select_copy transpose_copy t_copy permute_copy expand_copy diagonal_copy as_strided_copy unsqueeze_copy squeeze_copy alias_copy narrow_copy unfold_copy split_copy split_with_sizes_copy unbind_copy",
    "scatters": "slice_scatter select_scatter diagonal_scatter as_strided_scatter",
    "elementwise": "add sub mul div neg exp log sqrt rsqrt abs relu sigmoid tanh gelu pow maximum minimum where clamp eq ne lt le gt ge logical_not sin cos reciprocal erf",
    "mutations": "copy_ fill_ zero_ masked_fill_ index_put_ copy fill zero masked_fill index_put",
    "factories": "zeros ones full arange zeros_like ones_like full_like clone contiguous",
    "reductions": "sum mean amax amin softmax log_softmax _softmax _log_softmax",
    "linalg": "mm bmm matmul addmm linear layer_norm embedding index_select",
}


def _names(s: str) -> list[str]:
    out = []
    for chunk in re.findall(r"`([^`]*)`", s):
        for w in chunk.split():
            if re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", w):
                out.append(w)
    return out


def spec_groups(spec: Path | None) -> dict[str, list[str]]:
    if spec is None or not spec.exists():
        return {k: v.split() for k, v in BUILTIN.items()}
    text = spec.read_text(encoding="utf-8")
    sec = text.split("## Op names", 1)[1].split("\n## ", 1)[0]
    groups: dict[str, list[str]] = {}
    for bullet in re.split(r"\n- ", sec):
        if ":" not in bullet:
            continue
        key = bullet.split(":", 1)[0].strip()
        names = _names(bullet)
        if key.startswith("view copies"):
            # The list itself (the longest quoted run); the prose around
            # it quotes other spellings.
            run = max(re.findall(r"`([^`]*)`", bullet), key=len)
            groups["view copies"] = _names(f"`{run}`")
        elif key.startswith("in place"):
            groups["mutations"] = [n for n in names if n not in ("name", "_")]
        else:
            groups[key] = names
    return groups


def all_ops(groups: dict[str, list[str]]):
    elem = groups.get("elementwise", [])
    required = []
    for k, v in groups.items():
        required += v
    required += [e + "_" for e in elem]
    seen = set()
    required = [x for x in required if not (x in seen or seen.add(x))]
    try:
        import torch

        def in_aten(n):
            p = getattr(torch.ops.aten, n, None)
            try:
                return p is not None and bool(p.overloads())
            except Exception:
                return False
    except ImportError:  # without torch: the known gaps of torch 2.x
        gaps = {"maximum_", "minimum_", "where_"}

        def in_aten(n):
            return n not in gaps
    no_aten = [n for n in required if not in_aten(n)]
    # Names ATen lacks (PyTorch cannot run them) are not required.
    optional = no_aten
    required = [n for n in required if n not in optional]
    return required, optional, no_aten


_OP_USE = re.compile(r"(?:=|^)\s*([A-Za-z_][A-Za-z0-9_]*)\s*\(", re.M)


def used_ops(dirs: list[Path]) -> Counter:
    c: Counter = Counter()
    for d in dirs:
        for f in sorted(d.rglob("*.txt")):
            text = re.sub(r"#[^\n]*", "", f.read_text(encoding="utf-8"))
            for m in _OP_USE.finditer(text):
                if m.group(1) not in ("graph", "return"):
                    c[m.group(1)] += 1
    return c


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dirs", nargs="*", default=["examples/programs"])
    ap.add_argument("--spec", type=Path)
    ap.add_argument("--counts", action="store_true")
    a = ap.parse_args(argv)
    spec = a.spec
    if spec is None:
        for cand in (REPO.parent / "shared/spec/program-format.md", REPO / "shared/spec/program-format.md",
                     Path("/work/shared/spec/program-format.md")):
            if cand.exists():
                spec = cand
                break
    groups = spec_groups(spec)
    required, optional, no_aten = all_ops(groups)
    dirs = [(REPO / d) if not Path(d).is_absolute() else Path(d) for d in a.dirs]
    used = used_ops(dirs)
    missing = [n for n in required if used[n] == 0]
    print(f"spec: {spec if spec and spec.exists() else 'built-in op list'}")
    print(f"{len(required)} spec ops required; programs in: {', '.join(str(d.relative_to(REPO)) if d.is_relative_to(REPO) else str(d) for d in dirs)}")
    if no_aten:
        print("spec names with no aten op: " + " ".join(no_aten)
              + "  (not required)")
    extra = sorted(n for n in used if n not in required and n not in optional)
    if extra:
        print("ops used that the spec does not name: " + " ".join(extra))
    if a.counts:
        for n in required:
            print(f"  {used[n]:4d}  {n}")
    if missing:
        print(f"UNUSED ({len(missing)}): " + " ".join(missing))
        return 1
    print("unused: none")
    return 0


if __name__ == "__main__":
    sys.exit(main())
