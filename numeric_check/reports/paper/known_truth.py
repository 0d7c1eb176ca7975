"""The detectors the findings rest on, checked where the truth is known: recall and precision.

Two findings, each judged part by part against a control on which its rule must fail:

- ``skip-trigram-detector``: the triples the one-layer model's QK and OV circuits rank highest for each
  planted source are the skip-trigrams its training data planted (:func:`~numeric_check.circuits.known_heads.skip_trigram_recall`);
- ``head-detectors``: the previous-token and induction detectors, by behaviour and by weights, find the
  heads built by hand into two-layer models, among decoys, and only those
  (:func:`~numeric_check.circuits.known_heads.detector_recall`).
"""

from __future__ import annotations

import torch

from numeric_check.circuits.known_heads import Recall, TrigramRecall, detector_recall, skip_trigram_recall
from numeric_check.reports.paper.claims import Part, PaperFinding, finding
from numeric_check.reports.paper.measure import Measurements

#: Recall and precision a detector must reach on the known truth.
FINDS = 0.9
#: Each planted source's top triples searched for its planted ones (recall), of d_vocab² − d_vocab.
TOP = 10
#: Noise levels (the noise's Frobenius norm over the planted weight's) at which the head detectors are judged,
#: and the one beyond, reported: there the planted heads themselves stop working.
NOISE, BEYOND = (0.0, 1.0), 2.0
#: How many hand-built models a detector is judged on.
N_MODELS = 8
#: The decoy each role is rebuilt as for the head detectors' control, and how the page names it.
DECOYS = {"previous-token": "current", "induction": "duplicate"}
DECOY_NAMES = {"current": "heads that attend to themselves", "duplicate": "duplicate-token heads"}


def _share(found: int, of: int) -> float:
    return found / of if of else 0.0


def skip_trigram_detector(m: Measurements) -> PaperFinding:
    one = m.analysis(1)
    planted = m.planted if m.planted is not None else torch.zeros(0, 3, dtype=torch.long)
    if not len(planted) or not one.model.arch.n_heads:
        part = Part("the planted skip-trigrams are found", "no planted skip-trigram to look for", False, "–", False)
        return finding("skip-trigram-detector", "The skip-trigram detector finds what was planted.", (part,))
    model, d = one.model, one.model.cfg.d_vocab
    per_source = planted.shape[1] if planted.dim() == 3 else 1
    top, at_k = skip_trigram_recall(model, planted, k=TOP), skip_trigram_recall(model, planted, k=per_source)
    random = type(model).random(model.arch, d_model=model.cfg.d_model, d_head=model.cfg.d_head, d_vocab=d,
                                n_ctx=model.cfg.n_ctx, seed=1, dtype=torch.float64, device=model.device)
    shuffled = planted.reshape(-1, 3).clone()  # each source replaced by a token that is no planted source
    sources = sorted(set(shuffled[:, 0].tolist()))
    others = [t for t in range(d) if t not in sources]
    shuffled[:, 0] = torch.tensor([others[sources.index(a) % len(others)] for a in shuffled[:, 0].tolist()],
                                  device=shuffled.device)
    r_top, r_at_k = skip_trigram_recall(random, planted, k=TOP), skip_trigram_recall(model, shuffled, k=per_source)

    def recall(r: TrigramRecall) -> str:
        return f"{r.found} of {r.planted} planted triples in their source's top {r.k} (median rank {r.median_rank:g})"

    def precision(r: TrigramRecall) -> str:
        return (f"of the top {r.k} triples of {r.sources} sources, {r.found} planted and {r.swapped} their swapped "
                f"pairs: {_share(r.found + r.swapped, r.k * r.sources):.0%}")

    parts = (
        Part(f"recall: at least {FINDS:.0%} of the planted triples among their source's top {TOP} of "
             f"{d * d - d:,} (destination, out) pairs, ranked by attention to the source times the out's logit rise",
             recall(top), _share(top.found, top.planted) >= FINDS,
             "a random-weight model of the same shapes: " + recall(r_top), _share(r_top.found, r_top.planted) >= FINDS),
        Part(f"precision: at least {FINDS:.0%} of each source's top {per_source} (as many as were planted) are "
             "planted triples or their swapped pairs (the paper's bugs, which one head carrying both pairs must also "
             "rank high)", precision(at_k), _share(at_k.found + at_k.swapped, at_k.k * at_k.sources) >= FINDS,
             "each source replaced by another token, the same for every triple of a source: " + precision(r_at_k),
             _share(r_at_k.found + r_at_k.swapped, r_at_k.k * r_at_k.sources) >= FINDS),
    )
    return finding("skip-trigram-detector", "The skip-trigram detector finds what was planted: the triples the "
                   "one-layer model's QK and OV circuits rank highest for a source are the skip-trigrams its "
                   "training data planted.", parts)


def head_detectors(m: Measurements) -> PaperFinding:  # the truth is built here, not measured on m
    found = detector_recall(n_models=N_MODELS, noise=NOISE + (BEYOND,))
    control = detector_recall(n_models=N_MODELS, noise=NOISE, replace=DECOYS)

    def of(rows: list[Recall], kind: str, level: float | None = None) -> list[Recall]:
        return [r for r in rows if r.kind == kind and (level is None or r.noise == level)]

    def judged(rows: list[Recall]) -> bool:
        return all(_share(r.found, r.planted) >= FINDS and _share(r.found, r.claimed) >= FINDS for r in rows)

    def shown(rows: list[Recall]) -> str:
        return "; ".join(f"{r.view.replace('_', ' ')} at noise {r.noise:g}: {r.found} of {r.planted} found, "
                         f"{r.claimed} claimed" for r in rows)

    parts = tuple(
        Part(f"{kind.replace('_', '-')} heads: recall and precision at least {FINDS:.0%}, by behaviour and by weights, "
             f"at noise {' and '.join(f'{n:g}' for n in NOISE)}",
             shown(of([r for r in found if r.noise in NOISE], kind)), judged([r for r in found if r.noise in NOISE and r.kind == kind]),
             f"the same models with those heads rebuilt as {DECOY_NAMES[DECOYS[kind.replace('_', '-')]]}: "
             + shown(of(control, kind)), judged(of(control, kind)))
        for kind in ("previous_token", "induction"))
    beyond = {(r.kind, r.view): r for r in found if r.noise == BEYOND}
    note = (f"{N_MODELS} two-layer models of 4 heads a layer, each role placed at random: a previous-token head (sometimes "
            "two) and a head that attends to itself in the first layer; one or two induction heads, a duplicate-token "
            "head (it attends to earlier copies of the current token, not the token after) and sometimes a "
            "previous-token head in the second; random heads elsewhere. Noise is Gaussian, its Frobenius norm the "
            "given multiple of each planted weight's. At noise "
            f"{BEYOND:g} the planted induction heads stop working: their induction score is "
            f"{beyond['induction', 'by_behaviour'].score:.2f} by behaviour and "
            f"{beyond['induction', 'by_weights'].score:.2f} by weights, and {beyond['induction', 'by_behaviour'].found} "
            f"and {beyond['induction', 'by_weights'].found} of {beyond['induction', 'by_behaviour'].planted} are "
            f"claimed; the weights still find {beyond['previous_token', 'by_weights'].found} of "
            f"{beyond['previous_token', 'by_weights'].planted} previous-token heads, behaviour "
            f"{beyond['previous_token', 'by_behaviour'].found}.")
    return finding("head-detectors", "The previous-token and induction detectors find the heads built into a model, "
                   "and only those, among decoys built to fool them.", parts, note=note)


def known_truth_findings(m: Measurements) -> dict[str, PaperFinding]:
    """Both detector checks, by key."""
    return {f.key: f for f in (skip_trigram_detector(m), head_detectors(m))}
