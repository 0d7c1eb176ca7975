"""Ship the measured training dynamics of the shipped language models: ``numeric_check/data/kjv_2l.dynamics.json``.

The shipped ``kjv_2l.safetensors`` and ``kjv_1l.safetensors`` are the last snapshots of two runs of
``scripts/sweep.sh`` (``2 1.0`` and ``1 1.0``: 32 snapshots each, about 70 MB, not shipped).
``tcircuits dynamics`` measured them into a ``dynamics.json``; this script keeps its run and control only,
the floats rounded to 6 significant digits, the checkpoints named as shipped, compact, with a note saying how
it was made. The companion's chapter "How induction heads form" reads it
(:func:`numeric_check.training.dynamics.read_dynamics`) and checks its last snapshot against the shipped model.

    bash scripts/sweep.sh 2 1.0 & bash scripts/sweep.sh 1 1.0 & wait
    .venv/bin/tcircuits dynamics --checkpoint build/sweep/kjv_2l_share1.0.safetensors \\
        --control build/sweep/kjv_1l_share1.0.safetensors -o build/sweep/dyn_share1
    .venv/bin/python scripts/ship_dynamics.py build/sweep/dyn_share1/dynamics.json

Refuses a file whose last snapshots are not the shipped models (their content hashes differ).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from numeric_check.model.checkpoint import stored_content_hash  # noqa: E402
from numeric_check.training.dynamics import read_dynamics  # noqa: E402

DATA = ROOT / "numeric_check" / "data"
OUT = DATA / "kjv_2l.dynamics.json"
#: The shipped checkpoints the run and the control end with.
SHIPPED = {"run": "kjv_2l.safetensors", "control": "kjv_1l.safetensors"}
SOURCE = ("tcircuits dynamics --checkpoint kjv_2l.safetensors --control kjv_1l.safetensors, on the runs of "
          "scripts/sweep.sh 2 1.0 and scripts/sweep.sh 1 1.0 (32 snapshots each, not shipped; the shipped models are "
          "their last snapshots, as the content hashes show); made into this file by scripts/ship_dynamics.py "
          "(floats rounded to 6 significant digits)")


def rounded(value):
    """``value`` with every float rounded to 6 significant digits and NaN as null.

    >>> rounded({"a": [3.14159265, float("nan"), 2, True]})
    {'a': [3.14159, None, 2, True]}
    """
    if isinstance(value, float):
        return None if not math.isfinite(value) else float(f"{value:.6g}")
    if isinstance(value, dict):
        return {k: rounded(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [rounded(v) for v in value]
    return value


def shipped(dynamics_json: Path) -> dict:
    """The shipped file's content, from ``tcircuits dynamics``' ``dynamics_json``."""
    run, control = read_dynamics(dynamics_json)
    out = {"source": SOURCE}
    for key, d in (("run", run), ("control", control)):
        if d is None:
            raise SystemExit(f"{dynamics_json} has no control: measure with --control")
        name = SHIPPED[key]
        if d.snapshots[-1].sha256 != stored_content_hash(DATA / name):
            raise SystemExit(f"the {key}'s last snapshot ({d.snapshots[-1].sha256[:12]}…) is not {name} "
                             f"({(stored_content_hash(DATA / name) or '?')[:12]}…)")
        record = d.to_dict()
        record["checkpoint"] = name
        out[key] = rounded(record)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("dynamics_json", type=Path, help="the dynamics.json tcircuits dynamics wrote")
    p.add_argument("-o", "--out", type=Path, default=OUT, help=f"the file to write (default {OUT.relative_to(ROOT)})")
    args = p.parse_args(argv)
    text = json.dumps(shipped(args.dynamics_json), separators=(",", ":"), ensure_ascii=False, allow_nan=False) + "\n"
    read_back = args.out.with_suffix(".tmp")
    read_back.write_text(text, encoding="utf-8")
    read_dynamics(read_back)  # reads back as the companion will, or fails before the file is replaced
    read_back.replace(args.out)
    print(f"wrote {args.out} ({len(text):,} bytes)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
