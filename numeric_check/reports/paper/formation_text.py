"""The chapter "How induction heads form" in words, tables and figures, for the page and the PDF, from
:func:`~numeric_check.reports.paper.formation.measure_formation`'s :class:`~numeric_check.reports.paper.formation.Formation`.

Plain text throughout (the writers escape it), heads labelled as the companion numbers layers
(:func:`~numeric_check.reports.paper.claims.label`).
"""

from __future__ import annotations

import math

from matplotlib.figure import Figure

from derivations.document import math as formula, prose

from numeric_check.reports import dynamics as report
from numeric_check.reports.paper.claims import index_from, label, verdict_of
from numeric_check.reports.paper.formation import DYNAMICS_FILE, Formation
from numeric_check.reports.paper.language_claims import Table
from numeric_check.training.dynamics import RANDOM_BATCH, RANDOM_SEED
from numeric_check.training.phase import INDUCTION, RISE

#: The largest difference of a score measured again from the stored one that counts as the same: the file keeps
#: 6 significant digits of scores of at most 1.
SAME_SCORE = 1e-5
#: The companion's figures of the run (keys of :data:`numeric_check.reports.paper.figures.CAPTIONS`), by the
#: name :func:`numeric_check.reports.dynamics.figures` gives them.
FIGURE_NAMES = {"loss": "formation-loss", "heatmap": "formation-heatmap", "heads": "formation-heads",
                "kcomp": "formation-kcomp"}
#: Their captions: :data:`numeric_check.reports.dynamics.FIGURES`', the K-composition term typeset.
CAPTIONS = {FIGURE_NAMES[k]: v for k, v in report.FIGURES.items() if k != "kcomp"} | {
    "formation-kcomp": prose("The induction circuit's K-composition over training: its composition score (left) and "
                             "the size of its term ", formula("Id ⊗ A^{h1} ⊗ W_Eᵀ W_QK^{h2} W_OV^{h1} W_E"),
                             " in the induction head's scores on a repeated random sequence (right); every snapshot's "
                             "expansion verified against the snapshot model when it was measured.")}


def _heads(heads) -> str:
    return ", ".join(label(*h) for h in heads)


def _model(f: Formation) -> str:
    """The model the chapter measured now: the shipped one, or the person's checkpoint by name."""
    return f.run.checkpoint if f.yours else f"the shipped {f.run.n_layers}-layer model"


def hash_text(f: Formation) -> str:
    """Whether each run's last snapshot is the shipped model (or the person's checkpoint), by content hash."""
    where, which = ("its history", "the checkpoint's") if f.yours else ("the file", "the shipped checkpoint's")
    said = [f"{h.checkpoint}: the last snapshot's content hash as {where} records it, {h.stored[:16]}…, and {which}, "
            f"{'unreadable' if h.shipped is None else h.shipped[:16] + '…'}, "
            + ("match" if h.matches else "do not match") for h in f.hashes]
    if f.yours:
        ending = ("The hashes match: the checkpoint is the run's last snapshot." if f.hashes_match else
                  "The hashes do not match: the history beside the checkpoint is of another run (or the checkpoint "
                  "was changed since), and says nothing of how this model formed.")
    else:
        ending = ("The hashes match: the shipped models are the runs' last snapshots, and the measurements read from "
                  "the file are of the runs that made them." if f.hashes_match else
                  "The hashes do not match: the measurements read from the file are of another run than the shipped "
                  "models', and say nothing of how those formed.")
    return "Measured now, " + "; ".join(said) + ". " + ending


def scores_text(f: Formation) -> str:
    """The last snapshot's stored scores against the same scores of the shipped model, measured now."""
    same = max(f.prefix_difference, f.copying_difference) <= SAME_SCORE
    return (f"Measured now on {_model(f)}, as tcircuits dynamics measures each snapshot "
            f"(repeated random tokens{_drawn_from(f.run)}, {RANDOM_BATCH} sequences of seed {RANDOM_SEED}, float64): every head's "
            f"prefix-matching score differs from the last snapshot's stored one by at most {f.prefix_difference:.1e}, "
            f"its copying score by at most {f.copying_difference:.1e}; "
            + (f"the same, to the file's 6 significant digits (at most {SAME_SCORE:.0e})." if same else
               f"more than the file's 6 significant digits allow ({SAME_SCORE:.0e}): the stored row is not this model's."))


def _drawn_from(run) -> str:
    """Where the random tokens came from, for a sentence: nothing where every id was drawn."""
    pool = run.random_tokens
    return "" if pool is None else f" drawn from the {len(pool):,} token ids the held-out text holds"


def ablation_text(f: Formation) -> str:
    """The ablation measured now, with which heads and on what."""
    if f.ablation is None:
        return ("The text measured on is shorter than one window: nothing was ablated." if f.heads else
                "The run has no induction head to ablate.")
    a = f.ablation
    intact, ablated, other = a
    layer, head = f.heads[0]
    chosen = (f"the last layer's heads whose prefix matching exceeds {INDUCTION} ({_heads(f.heads)})"
              if f.run.snapshots[-1].prefix_matching[layer][head] > INDUCTION else
              f"the run's induction head {_heads(f.heads)} (no head of the last layer exceeds {INDUCTION} prefix matching)")
    text = ("the text the language page measures (tokenized with the model's BPE)" if f.yours else
            "the shipped held-out text (tokenized with the model's BPE, as training's history makes its windows)")
    return (f"Measured now on {_model(f)}, on {f.windows} windows of {f.run.n_ctx + 1} tokens spread evenly over "
            f"{text}: the "
            f"in-context learning score is {intact:+.3f}{a.span(a.intact_interval, '+.3f')} nats intact, {ablated:+.3f} "
            f"({a.kept:.0%}{a.span(a.kept_interval, '.0%')} kept) with {chosen} replaced by "
            f"{'their' if len(f.heads) > 1 else 'its'} mean output, and {other:+.3f} "
            f"({a.other_kept:.0%}{a.span(a.other_interval, '.0%')} kept) with as many of the layer's lowest "
            f"({_heads(f.others)}) replaced instead"
            + (" (in brackets: 95 % intervals, a bootstrap over the windows; the windows overlap, so the intervals "
               "understate the uncertainty)" if a.intervals else "") + ". The last snapshot's score as the file records it, "
            f"{f.run.snapshots[-1].icl_score:+.3f}, was measured on the run's own held-out windows, cut from its own "
            "split of the text: a few tokens' shift of each window moves the score by a few hundredths.")


def formation_texts(f: Formation) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """The chapter's paragraphs under their headings: what was read from the file, and what was measured when the
    chapter was built (plain text: the writers escape it)."""
    induction = ("no induction head" if f.run.induction_head is None else
                 f"{label(*f.run.induction_head)} the head it ends with (the last layer's highest prefix matching), "
                 f"{label(*f.run.writer_head)} the first-layer head that K-composes with it most")
    prefix = f.run.best("prefix_matching", f.run.n_layers - 1) if f.run.n_layers else [math.nan]
    window = (f"none (the best last-layer prefix matching goes from {prefix[0]:.2f} to at most {max(prefix):.2f}, "
              f"short of the rule's rise of {RISE})" if f.window is None
              else f"steps {f.run.steps[f.window[0]]:,}–{f.run.steps[f.window[1]]:,}")
    read = (f"How it was measured: {f.source}." if f.yours else f"The file {DYNAMICS_FILE} says how it was made: {f.source}.",
            f"Read from {'its history' if f.yours else 'it'}: {len(f.run.snapshots)} snapshots of {f.run.checkpoint}, steps {f.run.steps[0]:,} to "
            f"{f.run.steps[-1]:,}; {induction}; the phase change's window: {window}."
            + ("" if f.control is None else f" The control: {len(f.control.snapshots)} snapshots of {f.control.checkpoint}."))
    return (("Your run, measured from its snapshots" if f.yours else "The runs, read from the file", read),
            ("Measured when this page was built", (hash_text(f), scores_text(f), ablation_text(f))))


#: The formation chapter's opening on a person's run, in place of the shipped run's paragraphs.
YOUR_FORMATION = ("This chapter is your run's: the snapshots train-toy kept beside your checkpoint were measured when "
                  "this page was built, as tcircuits dynamics measures them, and the follow-up paper's claims are judged "
                  "on them: the phase change (a short window of steps in which an induction head appears), the in-context "
                  "learning score improving in that window and hardly after, a bump in the loss, and the ablation of the "
                  "induction heads removing most of the in-context learning. Your run has no control trained alike, so no "
                  "rule is judged on one.")


def formation_opening(m) -> tuple[list[str], bool]:
    """The chapter's opening where a person's model was measured (``m``: the companion's measurements), plain text,
    and whether it replaces the shipped run's paragraphs: their run's opening, or the note on why the chapter shows
    the shipped run (no snapshots kept) before those paragraphs; nothing for the shipped models."""
    if m.formation is not None and m.formation.yours:
        return [YOUR_FORMATION], True
    return ([m.formation_note] if m.formation_note else []), False


def figure_names(f: Formation) -> list[str]:
    """The names of the figures :func:`formation_figures` draws for ``f``, in order."""
    drawn = ["loss", "heatmap"] + (["heads"] if f.run.n_layers else []) + (["kcomp"] if f.run.induction_head else [])
    return [FIGURE_NAMES[n] for n in drawn]


def claims_table(f: Formation) -> Table:
    """The four claims judged when the companion was built: rule, measured, verdict, control and its verdict."""
    rows = tuple((c.name, c.rule, c.detail, verdict_of(c.holds), c.control_detail,
                  "—" if c.control_holds is None else verdict_of(c.control_holds)) for c in f.claims)
    return Table("formation-claims", "The follow-up paper's claims, judged now on the stored measurements (and the "
                 "ablation measured now)", ("claim", "rule", f.run.checkpoint if f.yours else "the two-layer model",
                                            "verdict", "no control (your run has none)" if f.yours else
                                            "the one-layer control", "its verdict"), rows,
                 note="Each rule is judged on the control too: where it holds there, it cannot tell the model from it.")


def snapshots_table(f: Formation) -> Table:
    """The stored measurements by snapshot: loss, in-context learning score, best prefix matching, K-composition."""
    run = f.run
    best = run.best("prefix_matching", run.n_layers - 1) if run.n_layers else [math.nan] * len(run.steps)
    rows = tuple((f"{s.step:,}", f"{s.heldout_loss:.3f}", f"{s.icl_score:+.3f}", f"{b:.3f}", f"{s.k_composition:.3f}",
                  f"{s.k_term_norm:.3g}", "yes" if s.k_term_verified else "no") for s, b in zip(run.snapshots, best))
    return Table("formation-snapshots", f"{run.checkpoint} snapshot by snapshot "
                 + ("(measured from its history when this page was built)" if f.yours else "(read from the file)"),
                 ("step", "held-out loss", "ICL score", "best last-layer prefix matching", "K-composition", "‖K term‖",
                  "verified"), rows, numeric=(0, 1, 2, 3, 4, 5))


def formation_figures(f: Formation) -> dict[str, Figure]:
    """:mod:`numeric_check.reports.dynamics`' figures of the run (with its control), by companion figure name."""
    made = report.figures(f.run, f.control, f.window, index_from())
    return {FIGURE_NAMES[name]: fig for name, fig in made.items()}
