"""``tcircuits demo``: the whole story on the 2-layer model this project trained and ships.

1. the model and how it was trained;
2. its logits as a path sum, derived step by step (direct path, heads, virtual heads);
3. every term of that expansion checked against the model's own forward pass;
4. one induction head's attention scores as Q-, K- and QK-composition terms, checked too;
5. its induction circuit: a previous-token head in layer 0 that K-composes with
   induction heads in layer 1, found from the weights and from behaviour, and
   measured at every query position and on repeats of every length and offset.

The command exits 0 when every check passes and the induction circuit is found and
works across the whole context (at every query position, one of its heads puts at
least 0.4 of its attention where it should).
"""

from __future__ import annotations

import argparse
import math
import sys
import time

from numeric_check.reports.flags import add_runtime_arguments, check_batch, fit_threads, int_in, seed, with_runtime
from derivations.vocabulary import add_batch_size, add_index_from, add_max_terms, renumber
from tensoralg.display import counted
from tensoralg.escape import terminal_safe


MAX_BATCH = 1024  # sequences verified term by term: each term holds a batch of logits

EPILOG = """\
examples:
  tcircuits demo                          # the shipped 2-layer model
  tcircuits demo --checkpoint model.safetensors --batch-size 8
  tcircuits demo --index-from 1           # layers numbered as the paper does (H_1, L1H0 the first layer's)
"""


def register(subparsers) -> None:
    """Add ``demo`` to the ``tcircuits`` parser."""
    parser = subparsers.add_parser(
        "demo",
        help="the whole story on the shipped 2-layer model: derivation, verification, induction circuit",
        description=__doc__,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--checkpoint", metavar="PATH", help="a CircuitModel checkpoint (default: the shipped 2-layer model)")
    add_batch_size(parser, type=int_in(1, MAX_BATCH), default=4, help="sequences of repeated random tokens to verify on (default 4)")
    parser.add_argument("--seed", type=seed, default=0, help="seed of those sequences (default 0)")
    add_max_terms(parser, dest="rows", default=12, old="--rows",
                  help="terms to list, largest first (default 12; 0: the summary only; all: every term)")
    add_index_from(parser)
    add_runtime_arguments(parser)
    parser.set_defaults(func=with_runtime(run))


def _section(title: str) -> str:
    return f"\n{title}\n{'=' * len(title)}"


def run(args: argparse.Namespace) -> int:
    started = time.perf_counter()
    # Heavy imports here, not at module level: the CLI imports this module to build its
    # parser, and `tcircuits --help` should not wait for torch.
    from derivations import catalogue, expand_logits, expand_qk, text
    from derivations.layout import Layout
    from numeric_check.model.checkpoint import load_checkpoint
    from numeric_check.circuits.behaviour import ACROSS_CONTEXT, best_head_floor, profile_rows, repeat_loss_grid
    from numeric_check.circuits.composition import composition_scores
    from numeric_check.circuits.detect import detect_heads, repeated_tokens
    from numeric_check.training.toy import shipped_checkpoint, training_record_for
    from numeric_check.verification.verify import verify_logits, verify_qk

    path = args.checkpoint or shipped_checkpoint(2)
    model = load_checkpoint(path, device=args.device)
    fit_threads(args, model.cfg.d_model)
    arch, cfg = model.arch, model.cfg
    out = lambda text: print(terminal_safe(renumber(text, args.index_from)))  # a path may hold control characters

    out(_section("1. The model"))
    out(f"{path}\n{model!r}")
    record = training_record_for(path, model)
    if record:
        final, train = record.get("final", {}), record["train_config"]
        out(f"trained by `tcircuits train-toy` for {train.get('steps', '?')} steps on random sequences in which segments "
            f"of {train.get('seg_min', '?')}-{train.get('seg_max', '?')} tokens recur anywhere; held-out loss on the "
            f"repeats {final.get('repeat_loss', float('nan')):.2f} nats, elsewhere {final.get('other_loss', float('nan')):.2f} "
            f"(uniform: ln {cfg.d_vocab} = {math.log(cfg.d_vocab):.2f})")

    out(_section("2. Its logits as a sum over paths"))
    derivation = catalogue.get("two-layer-logits")
    print(terminal_safe(text(derivation, Layout(index_from=args.index_from))))  # numbered by its layout
    expansion = expand_logits(arch)
    by_order = expansion.count_by_order()
    out(f"For this model ({arch.describe()}): {counted(len(expansion), 'term')} — "
        + ", ".join(f"{n} of order {k}" for k, n in sorted(by_order.items())))

    out(_section("3. Every term against the model"))
    seg = max(2, min(cfg.n_ctx // 2, 16))
    check_batch("--batch-size", args.batch_size, 2 * seg, cfg.d_vocab)
    tokens = repeated_tokens(model, seg_len=seg, batch=args.batch_size, seed=args.seed)
    report = verify_logits(model, tokens, expansion=expansion)
    out(f"tokens: {args.batch_size} sequences of {seg} random tokens, each repeated once")
    out(_largest_first(report, args.rows))

    heads = detect_heads(model)
    induction = heads.by_behaviour.labels()["induction"]
    out(_section("4. An induction head's attention scores"))
    if induction:
        layer, head = _parse_label(induction[0])
        qk = expand_qk(arch, layer, head)
        counts = {kind: len(terms) for kind, terms in qk.by_composition().items()}
        out(f"{induction[0]}: {counted(len(qk), 'term')} — " + ", ".join(f"{n} {kind}" for kind, n in counts.items())
            + " (K-composition, Id ⊗ A^{h-1} ⊗ …, is the induction term)")
        qk_report = verify_qk(model, tokens, layer, head, expansion=qk)
        out(_largest_first(qk_report, args.rows))
    else:
        qk_report = None
        out("no induction head found by behaviour; nothing to expand")

    out(_section("5. The induction circuit"))
    out(heads.to_markdown())
    k_scores = composition_scores(model, "K", baseline=True)
    for label in induction:
        layer, head = _parse_label(label)
        prev = [_parse_label(p) for p in heads.by_behaviour.labels()["previous_token"]]
        for pl, ph in prev:
            if pl < layer:
                out(f"K-composition of {label} with previous-token head L{pl}H{ph}: "
                    f"{float(k_scores[pl, ph, layer, head]):+.3f} above the random baseline")

    found = bool(induction) and bool(heads.by_behaviour.labels()["previous_token"]) and heads.agree
    out(_section("6. Across the context"))
    classes, profile = heads.by_behaviour, heads.behaviour.profile
    out("\n".join(profile_rows(profile, sorted(set(classes.previous_token) | set(classes.induction)))))
    floors = {kind: best_head_floor(profile, kind, [h for h in getattr(classes, kind) if (h[0] == 0) == (kind == "previous_token")])
              for kind in ("previous_token", "induction")}
    for kind, (floor, where) in floors.items():
        out(f"{kind.replace('_', '-')}: the best head's lowest attention over positions is {floor:.2f} (at {where}; bar {ACROSS_CONTEXT})")
    grid = repeat_loss_grid(model, seed=args.seed)
    out(f"loss on the second copy of a repeat, by length (rows) and offset of the first copy (columns):\n{grid.to_markdown()}")
    across = all(floor >= ACROSS_CONTEXT for floor, _ in floors.values())
    found = found and across
    passed = report.passed and (qk_report is None or qk_report.passed)
    out(_section("Verdict"))
    out(f"every term verified: {'yes' if passed else 'NO'}; induction circuit found by weights and behaviour: "
        f"{'yes' if found else 'no'}; working at every position: {'yes' if across else 'no'}  "
        f"({time.perf_counter() - started:.1f} s)")
    sys.stdout.flush()
    return 0 if passed and found else 1


def _largest_first(report, rows: int | None) -> str:
    """The report's summary and its ``rows`` largest terms by norm (every term with None)."""
    rows = len(report.terms) if rows is None else rows
    ranked = sorted(report.terms, key=lambda t: -t.norm)
    lines = report.summary_lines() + ["", f"{'term':<34} {'order':>5} {'norm':>10} {'vs isolated path':>17}"]
    for t in ranked[:rows]:
        if t.max_abs_error is not None:
            err = f"{t.max_abs_error:.1e}"
        else:  # certified by a rigorous bound (large vocabularies), or not checked
            err = "—" if t.error_bound is None else f"≤ {t.error_bound:.1e}"
        lines.append(f"{t.label:<34} {t.order:>5} {t.norm:>10.4g} {err:>17}")
    if len(ranked) > rows:
        lines.append(f"… {len(ranked) - rows} smaller terms")
    return "\n".join(lines)


def _parse_label(label: str) -> tuple[int, int]:
    layer, head = label[1:].split("H")
    return int(layer), int(head)
