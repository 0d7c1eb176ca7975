"""Coverage: which Hugging Face model types ``from_hf`` converts, and why it refuses the others.

Every causal-LM model type of the installed ``transformers`` is looked up:

- a type with a tiny model in ``tests/hf_zoo.py`` (2 layers, d_model 16, 4 heads, every parameter
  perturbed) is converted in float64 (float32 where Hugging Face's model cannot run in float64:
  ``tests.hf_zoo.source_dtype``) for each of ``--seeds`` seeds; converted, its logits are compared with the source's
  twice — against Hugging Face as shipped (its RMSNorm, rotary tables and some softmaxes round
  through float32 even in a float64 model) and against the same model with those round trips
  made in float64 (``exact_float64``) — and ``verify_logits`` at order 2 and ``verify_qk`` on the
  last head of layer 1 are run; refused, the feature it is refused for is given. A type counts as
  converted only if every seed of every setting does (within the tolerance of both sources, both
  verifications passed); one converted that is not is counted silently wrong, one converted in some
  runs and refused in others is counted apart;
- any other type: ``from_hf`` refuses its class as "not a family tcircuits reads".

- a type the installed transformers lacks (its config or model class came later) is skipped, with why.

It prints the measured tables of the guide's page on model families (``--write
docs/reference/model-families.md`` replaces them between their markers, and sets this version's row of
the table of versions, keeping the other versions' rows: run it once with each end of the declared range
installed). One thread; about 4 minutes with 3 seeds on this project's CPU.

    PYTHONPATH=. python benchmarks/coverage.py [--seeds 3] [--write docs/reference/model-families.md]
    PYTHONPATH=build/versions/transformers-4.57.1:. python benchmarks/coverage.py --write docs/reference/model-families.md
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
import unittest

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import transformers  # noqa: E402
from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES  # noqa: E402

from numeric_check import UnsupportedModel, from_hf, verify_logits, verify_qk  # noqa: E402
from numeric_check.conversion.readers import BY_CLASS  # noqa: E402
from tensoralg.display import md_table  # noqa: E402
from tests.hf_zoo import CONVERTS, ZOO, build, logits, missing, source_dtype  # noqa: E402

TOKENS = torch.tensor([[1, 5, 2, 7, 3, 1, 4, 0]])
START, END = "<!-- coverage:start -->", "<!-- coverage:end -->"
VERSIONS_START, VERSIONS_END = "<!-- coverage-versions:start -->", "<!-- coverage-versions:end -->"


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max())


def measure(model_type: str, seeds: int) -> dict:
    """Convert ``model_type``'s tiny model for each seed, in its default settings and in each of
    ``CONVERTS``' for it: the worst differences, and each run's outcome — ``exact`` (converted, its logits on
    :data:`TOKENS` within the source check's tolerance of both sources, both verifications passed), ``wrong``
    (converted, and one of those fails: silently wrong) or ``refused`` (``from_hf`` raised ``UnsupportedModel``)."""
    settings = [{}] + [options for t, options in CONVERTS if t == model_type and options]
    out = {"exact": 0.0, "shipped": 0.0, "tolerance": [], "settings": len(settings), "runs": [], "wrong": []}
    for seed, options in ((seed, options) for seed in range(seeds) for options in settings):
        try:
            built = [(exact, build(model_type, seed, exact=exact, dtype=source_dtype(model_type), **options))
                     for exact in (True, False)]
        except unittest.SkipTest:  # a setting this transformers cannot build (its own code fails): not counted
            out["settings"] -= seed == 0
            continue
        out["runs"].append(run(model_type, seed, options, built, out))
    return out


def run(model_type: str, seed: int, options: dict, built: list, out: dict) -> str:
    """One seed and setting: ``exact``, ``wrong`` or ``refused`` (:func:`measure`), its differences added to ``out``."""
    for exact, hf in built:
        try:
            model = from_hf(hf)
        except UnsupportedModel:
            return "refused"
        with torch.no_grad():
            on_tokens = relative(model(TOKENS), logits(hf, TOKENS))
        rel, tolerance = max(on_tokens, model.source_check.rel_diff), model.source_check.tolerance
        out["exact" if exact else "shipped"] = max(out["exact" if exact else "shipped"], rel)
        out["tolerance"].append(tolerance)
        if not on_tokens <= tolerance:
            out["wrong"].append(f"seed {seed} {options}: {on_tokens:.1e} from the source, tolerance {tolerance:.0e}")
    out["family"], out["arch"] = BY_CLASS[type(hf).__name__].name, model.arch.describe()
    checks = {"verify_logits": verify_logits(model, TOKENS, max_order=2).passed,
              "verify_qk": verify_qk(model, TOKENS, 1, model.arch.heads_per_layer[1] - 1).passed}
    out["wrong"] += [f"seed {seed} {options}: {name} fails" for name, passed in checks.items() if not passed]
    return "wrong" if out["wrong"] else "exact"


def verdict(m: dict) -> str:
    """A type's verdict over every seed and setting: ``wrong`` if any run is, ``exact`` only if every run is,
    ``refused`` if every run is refused, else ``partly`` (some runs converted, others refused)."""
    runs = set(m["runs"])
    return "wrong" if "wrong" in runs else "exact" if runs == {"exact"} else "refused" if runs == {"refused"} else "partly"


def refusal(model_type: str) -> tuple[str, str]:
    """``(family, the feature named)`` when ``from_hf`` refuses ``model_type``'s tiny model."""
    hf = build(model_type, dtype=source_dtype(model_type))
    try:
        from_hf(hf)
    except UnsupportedModel as err:
        found = re.search(r" uses (.*), which CircuitModel cannot express", str(err))
        return BY_CLASS[type(hf).__name__].name, found.group(1) if found else str(err)
    raise AssertionError(f"{model_type} was expected to be refused")


def section(seeds: int) -> tuple[str, str]:
    """The page's measured section and this version's row of the table of versions."""
    found: dict[str, list] = {"exact": [], "refused": [], "wrong": [], "partly": []}
    skipped = []
    for model_type in ZOO:
        if missing(model_type):
            skipped.append(model_type)
            continue
        m = measure(model_type, seeds)
        found[verdict(m)].append((model_type, m))
    converted, wrong, partly = found["exact"], found["wrong"], found["partly"]
    refused = [(t, *refusal(t)) for t, _ in found["refused"]]
    others = sorted(t for t, cls in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.items() if t not in ZOO and cls not in BY_CLASS)
    tolerances = [tol for _, m in converted for tol in m["tolerance"]]
    rows = [[f"`{t}`", m["family"], str(m["settings"]), str(len(m["runs"])),
             f"{m['exact']:.1e}" + ("" if source_dtype(t) == torch.float64 else " (float32)"), f"{m['shipped']:.1e}"]
            for t, m in converted]
    lines = [
        START,
        f"Measured by `benchmarks/coverage.py` on transformers {transformers.__version__}: each model type's tiny model "
        f"(2 layers, d_model 16, 4 heads, every parameter perturbed, {seeds} seeds; in its default settings and in "
        "those `tests/hf_zoo.py`'s `CONVERTS` lists for it, the settings column counts them, and each seed of each "
        "setting is a run) converted in float64 (float32 "
        "where Hugging Face's model cannot run in float64) and run beside "
        "its source on from_hf's 2 × 8 probe tokens and on 1 × 8 more. Difference: the largest "
        "`max |ours − source| / max |source|` seen, "
        "against the source with its float32 round trips (RMSNorm, rotary tables, some norms) made in float64, and "
        "against Hugging Face as shipped (the source check's tolerance, ten times the float32 rounding of the same "
        f"model, {min(tolerances):.0e} to {max(tolerances):.0e} here). A type counts as converted only if every run "
        "converts, is within the tolerance of both sources on the 8 more tokens, and passes `verify_logits` at order 2 "
        "and `verify_qk` on the last head of layer 1 (every term of the expansion checked against the converted model).",
        "",
        f"**Converted: {len(converted)} model types**, every run",
        "",
        md_table(["model type", "family", "settings", "runs", "difference (float64 source)", "difference (as shipped)"],
                 rows, right=[2, 3, 4, 5]),
        "",
        "Where the float64 column is above 1e-12 (" + ", ".join(f"`{t}`" for t, m in converted
                                                   if m["exact"] > 1e-12 and source_dtype(t) == torch.float64)
        + ") the source computes part of its forward pass in float32 that `exact_float64` leaves as it is (GPT-Neo's "
        "attention scores, the rotation of queries and keys in Cohere and Ernie 4.5, the eager softmax of Gemma 2/3, "
        "VaultGemma, BLOOM and MPT, the rotary tables kept per layer type in Gemma 3 and OLMo 3, the routers of the "
        "mixtures of experts).",
        "",
        f"**Silently wrong: {len(wrong)} model types** (converted, yet off their source or failing a verification)"
        + "".join(f"; `{t}`: " + "; ".join(m["wrong"]) for t, m in wrong) + ".",
        "",
        f"**Converted in some runs only: {len(partly)} model types**"
        + "".join(f"; `{t}`: {m['runs'].count('refused')} of {len(m['runs'])} runs refused" for t, m in partly) + ".",
        "",
        f"**Refused, naming what they use: {len(refused)} model types** (in their default configuration; GPT-1's "
        "post-layer-norm blocks are outside the residual-stream algebra, and so are OPT's when "
        "`do_layer_norm_before=False`; the rope scalings whose frequencies change within the context are named in "
        "`numeric_check/conversion/readers/pending.py`)",
        "",
        md_table(["model type", "family", "refused for"], [[f"`{t}`", f, reason] for t, f, reason in refused]),
        "",
        f"**Not a family tcircuits reads: {len(others)} more causal-LM model types** — `from_hf` refuses their class "
        "as \"not a family tcircuits reads\": " + ", ".join(f"`{t}`" for t in others) + ".",
        "",
        f"**Skipped: {len(skipped)} model types of `tests/hf_zoo.py`** that transformers {transformers.__version__} does "
        "not have (they came later)" + (": " + ", ".join(f"`{t}`" for t in skipped) if skipped else "") + ".",
        END,
    ]
    counts = [len(converted), len(refused), len(others), len(wrong), len(partly), len(skipped)]
    row = f"| {transformers.__version__} | {seeds} | " + " | ".join(map(str, counts)) + " | " + (
        ", ".join(f"`{t}`" for t in skipped) or "—") + " |"
    return "\n".join(lines), row


#: the table of versions' columns; a row of fewer (measured before a column was added) gets "—" in the new ones
COLUMNS = ["transformers", "seeds", "converted", "refused by name", "refused by class", "silently wrong",
           "converted in some runs only", "skipped", "skipped: not in that version"]
OLD_COLUMNS = ["transformers", "converted", "refused by name", "skipped", "skipped: not in that version"]


def versions_table(old: str, row: str) -> str:
    """The table of versions between its markers: ``row`` replaces the row of its transformers version, the
    others are kept (newest first)."""
    rows = {}
    for line in old.splitlines():
        if line.startswith("| ") and line[2].isdigit():
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if len(cells) == len(OLD_COLUMNS):
                cells = [dict(zip(OLD_COLUMNS, cells)).get(c, "—") for c in COLUMNS]
            rows[cells[0]] = "| " + " | ".join(cells) + " |"
    rows[row.split("|")[1].strip()] = row
    order = sorted(rows, key=lambda v: [int(p) if p.isdigit() else 0 for p in v.split(".")], reverse=True)
    return "\n".join([VERSIONS_START, "| " + " | ".join(COLUMNS) + " |", "|---|" + "---:|" * (len(COLUMNS) - 2) + "---|",
                      *(rows[v] for v in order), VERSIONS_END])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--write", "--write-readme", dest="write", metavar="PAGE", default=None,
                        help="the Markdown page whose marked tables to replace (docs/reference/model-families.md)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    transformers.logging.set_verbosity_error()
    start = time.perf_counter()
    text, row = section(args.seeds)
    print(text)
    print(row)
    print(f"({time.perf_counter() - start:.0f} s)", file=sys.stderr)
    if args.write:
        with open(args.write, encoding="utf-8") as f:
            page = f.read()
        for start_mark, end_mark in ((START, END), (VERSIONS_START, VERSIONS_END)):
            if start_mark not in page or end_mark not in page:
                sys.exit(f"{args.write} has no {start_mark} … {end_mark} markers to replace")
        head, rest = page.split(VERSIONS_START, 1)
        old, tail = rest.split(VERSIONS_END, 1)
        page = head + versions_table(old, row) + tail
        if transformers.__version__ == _newest(page):  # the long section: the newest version's
            head, rest = page.split(START, 1)
            page = head + text + rest.split(END, 1)[1]
        with open(args.write, "w", encoding="utf-8") as f:
            f.write(page)


def _newest(page: str) -> str:
    """The newest transformers version in the page's table of versions."""
    table = page.split(VERSIONS_START, 1)[1].split(VERSIONS_END, 1)[0]
    return next(line.split("|")[1].strip() for line in table.splitlines() if line.startswith("| ") and line[2].isdigit())


if __name__ == "__main__":
    main()
