#!/usr/bin/env python3
"""Write PyTorch's core ATen opset (every overload tagged `torch.Tag.core`)
as tests/fixtures/core_aten_ops.json, for the coverage table of
docs/import.md (`kiln ops --core tests/fixtures/core_aten_ops.json`), which
CI checks without PyTorch.

    python3 tests/torch_ref/core_aten_ops.py
"""

import json
from pathlib import Path

import torch

OUT = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "core_aten_ops.json"


def main():
    rows = []
    for name in sorted(dir(torch.ops.aten)):
        try:
            packet = getattr(torch.ops.aten, name)
        except Exception:
            continue
        if not hasattr(packet, "overloads"):
            continue
        for ov in packet.overloads():
            op = getattr(packet, ov)
            if torch.Tag.core in op.tags:
                rows.append({"name": name, "overload": ov, "schema": str(op._schema)})
    rows.sort(key=lambda r: (r["name"], r["overload"]))
    doc = {"torch": torch.__version__.split("+")[0], "ops": rows}
    OUT.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"{len(rows)} core overloads (torch {doc['torch']}) in {OUT}")


if __name__ == "__main__":
    main()
