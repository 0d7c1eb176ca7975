"""``tcircuits dynamics``: how induction heads form, measured from a training run's snapshots."""

from __future__ import annotations

import argparse
from pathlib import Path

from derivations.vocabulary import add_index_from, add_out, renumber
from numeric_check.reports.flags import add_runtime_arguments, with_runtime

DESCRIPTION = """\
Measure how a model trained with 'tcircuits train-toy --text-file' changed as it trained, from the
snapshots it kept (NAME.history/), as the follow-up paper does (Olsson et al., 2022): at each
snapshot the held-out loss and its value at every token index, the in-context learning score
(a late token's loss minus an early one's; the paper's 500th and 50th tokens, scaled to the
context), the induction headroom (how much the held-out loss would fall with the token after the
current token's last earlier occurrence mixed into the prediction: what an induction head could
still add), every head's prefix-matching and copying scores on repeated random tokens (drawn from
the token ids the held-out text holds: a small byte-level vocabulary keeps bytes the text never
uses, which the model never read), and the induction circuit's K-composition term from the
algebra, verified against the snapshot model.

Then the paper's claims, each a rule judged on the model and on --control (a one-layer run
trained alike, which cannot form induction heads): induction heads form in a window; the
in-context learning score improves in that window and little after; the loss falls below its
earlier trend there (a bump); ablating the induction heads removes most of the in-context
learning.

Writes into OUT: index.html (open it in a browser; it works offline), dynamics.md,
dynamics.json and figures/*.png and *.svg, the folder replaced whole at the end.
"""

EPILOG = """\
examples:
  tcircuits train-toy --text-file kjv.txt --layers 2 --snapshots 32 -o lang_2l.safetensors
  tcircuits train-toy --text-file kjv.txt --layers 1 --snapshots 32 -o lang_1l.safetensors
  tcircuits dynamics --checkpoint lang_2l.safetensors --control lang_1l.safetensors -o dynamics/
"""


def register(subparsers) -> None:
    """Add ``dynamics`` to the ``tcircuits`` parser."""
    p = subparsers.add_parser("dynamics", help="how induction heads form: the phase change, from a run's snapshots",
                              description=DESCRIPTION, epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", required=True, type=Path, metavar="PATH",
                   help="a checkpoint trained with train-toy --text-file, with its NAME.history/ beside it")
    p.add_argument("--control", type=Path, metavar="CHECKPOINT",
                   help="a run trained alike with fewer layers (a one-layer control), with its history")
    add_out(p, required=True, type=Path, metavar="DIR", help="folder to write the page into (created)")
    p.add_argument("--force", action="store_true", help="replace the files tcircuits wrote in DIR before")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    add_index_from(p)
    add_runtime_arguments(p)
    p.set_defaults(func=with_runtime(_run))


def _run(args) -> int:
    from numeric_check.cli.progress import StepBar
    from numeric_check.files import output_folder
    from numeric_check.model.checkpoint import load_checkpoint
    from numeric_check.reports import dynamics as report
    from numeric_check.training.dynamics import measure, read_history
    from numeric_check.training.history import read_windows
    from numeric_check.training.phase import ablated_icl, ablation_heads, judge, phase_window

    read_history(args.checkpoint)  # a checkpoint without a history is refused before anything is written
    if args.control is not None:
        read_history(args.control)
    folder = output_folder(args.out, report.output_names(), force=args.force,
                           inputs=[args.checkpoint] + ([args.control] if args.control else [])).check()
    runs = []
    for path in [args.checkpoint] + ([args.control] if args.control else []):
        _, history = read_history(path)
        with StepBar(len(history["snapshots"]), args.quiet) as bar:
            runs.append(measure(path, device=args.device, progress=lambda i, n: bar.tick(f"{path.name} {i}/{n}")))
    run, control = runs[0], (runs[1] if len(runs) > 1 else None)
    window = phase_window(run)
    ablation = None
    if run.induction_head is not None:
        model = load_checkpoint(args.checkpoint, device=args.device, dtype="float64")
        windows = read_windows(args.checkpoint)
        if windows is not None:
            ablation = ablated_icl(model, windows.to(model.device), *ablation_heads(run))
    claims = judge(run, control, ablation=ablation)
    with folder as out:
        report.write(out, run, claims, control, window, args.index_from)
    for c in claims:
        print(renumber(f"{c.name}: {'holds' if c.holds else 'does not hold'} ({c.detail})"
                       + ("" if c.control_holds is None else f"; control: {'holds' if c.control_holds else 'does not hold'}"),
                       args.index_from))
    print(f"wrote {folder.path / 'index.html'}")
    return 0

