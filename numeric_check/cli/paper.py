"""``tcircuits paper``: the paper's companion, every equation derived and verified, every finding measured.

Writes into DIR a self-contained site — index.html and one page per section of
"A Mathematical Framework for Transformer Circuits" (Elhage et al., 2021), in the paper's
order: the residual stream and the notation; zero layers (the bigram table); one layer
(path expansion, OV and QK circuits, copying by eigenvalues, skip-trigrams and their
"bugs"); two layers (virtual heads, the QK expansion with Q-, K- and QK-composition,
composition scores against the random baseline, the induction mechanism, induction heads
found by weights and by behaviour, term importance by order); the tensor-product readings
and the algebra's rules as an appendix. Mathematics as MathML, figures as SVG, no script
and no network: open DIR/index.html in any browser.

Each equation is a catalogue derivation (tcircuits derive NAME) with its numeric check
beside it (every line against the first on random matrices: worst error, tolerance) and,
where a shipped model has the architecture, the expansion verified term by term against
that model. Each finding is stated as the paper states it, with the value measured on the
shipped models (numeric_check/data/induction_0l, _1l, _2l) when the page is built, the
control's value, a verdict (holds, holds in part, does not hold) and where it holds when
only in part. With --pdf, DIR/paper.pdf holds the same content (needs pdflatex).

DIR is written whole: the site is built in a new folder beside it and swapped in at the end,
so a run that fails or is interrupted leaves DIR as it was. A file in DIR that tcircuits did
not write (or that changed since) is refused by name; --force replaces those at the names the
companion writes and keeps the others.
"""

from __future__ import annotations

import argparse
import time

from numeric_check.cli.progress import StepBar
from numeric_check.reports.flags import add_runtime_arguments, seed, with_runtime

EPILOG = """\
examples:
  tcircuits paper --out companion/            # then open companion/index.html
  tcircuits paper --out companion/ --pdf      # and companion/paper.pdf
"""


def register(subparsers) -> None:
    """Add ``paper`` to the ``tcircuits`` parser."""
    parser = subparsers.add_parser(
        "paper", help="the paper's companion: every equation derived and verified, every finding measured (HTML, PDF)",
        description=__doc__, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, metavar="DIR", help="folder to write the site into (made if missing)")
    parser.add_argument("--pdf", action="store_true", help="also compile DIR/paper.pdf with pdflatex")
    parser.add_argument("--force", action="store_true",
                        help="replace files in DIR that tcircuits did not write (or that changed since) at the names it writes")
    parser.add_argument("--seed", type=seed, default=0, help="seed of every sampled batch and random control (default 0)")
    parser.add_argument("--quiet", action="store_true", help="no progress bar")
    add_runtime_arguments(parser)
    parser.set_defaults(func=with_runtime(run))


def run(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    # Heavy imports here: the CLI imports this module to build its parser.
    from tensoralg.escape import terminal_safe
    from numeric_check.reports.paper.build import check_outputs, step_count, write_paper

    check_outputs(args.out, args.pdf, args.force)  # a bad folder is refused before any work
    with StepBar(step_count(args.pdf), args.quiet) as bar:
        paper, written = write_paper(args.out, pdf=args.pdf, progress=bar.tick, seed=args.seed, force=args.force,
                                     device=args.device)
    counts: dict[str, int] = {}
    for f in paper.findings:
        counts[f.verdict] = counts.get(f.verdict, 0) + 1
    failed = [e.name for e in paper.equations if isinstance(e.verification, str) or not e.verification.ok
              or (e.model_check is not None and not e.model_check.passed)]
    print(terminal_safe(
        f"wrote {len(written)} files into {args.out} ({time.perf_counter() - started:.1f} s): "
        f"{len(paper.equations)} derivations, " + ("all checked" if not failed else f"FAILED: {', '.join(failed)}")
        + "; findings: " + ", ".join(f"{n} {v}" for v, n in counts.items())))
    return 1 if failed else 0
