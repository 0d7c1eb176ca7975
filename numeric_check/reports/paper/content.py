"""The companion's content in the paper's order: sections, their prose, equations and findings.

Each section names catalogue derivations (:mod:`derivations.catalogue`), each built and
checked numerically by the catalogue's own :meth:`~derivations.derivation.Derivation.verify`
(every line on random bindings: worst error and tolerance) and, where a shipped model has the
architecture, by :func:`~numeric_check.verification.verify.verify_logits` /
:func:`~numeric_check.verification.verify.verify_qk` on it; and the paper's findings it
reproduces (:mod:`numeric_check.reports.paper.claims`). Prose is :func:`derivations.document.prose`:
plain text escaped by the writers, formulae typeset by the one printer.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Callable

from derivations import catalogue
from derivations.architecture import Architecture
from derivations.catalogue import INDEXING
from derivations.derivation import Derivation
from derivations.document import Numbered, math, prose
from derivations.errors import DerivationError
from derivations.numeric import Verification

from numeric_check.reports.paper.claims import index_from, PaperFinding, paper_findings  # noqa: F401 (index_from: for the writers)
from numeric_check.reports.paper.known_truth import known_truth_findings
from numeric_check.reports.paper.language_claims import language_findings
from numeric_check.reports.paper.measure import Measurements
from numeric_check.verification.results import VerifyReport


@dataclass(frozen=True)
class SectionSpec:
    """A section: its file name (``slug``), title, paragraphs, catalogue entries, findings
    (keys of :func:`paper_findings`), and which model check goes with which entry."""

    slug: str
    title: str
    paragraphs: tuple[tuple, ...]
    equations: tuple[str, ...]
    findings: tuple[str, ...] = ()
    model_checks: dict[str, str] = field(default_factory=dict)


SECTIONS = (
    SectionSpec("notation", "The residual stream and the notation", (
        prose("Every layer reads from and writes to the residual stream: the embedding ", math("x_0 = (Id ⊗ W_E)·t"),
              " starts it (t the one-hot tokens, one row per position, as x has throughout), each attention head "
              "adds ", math("h(x) = (A^h ⊗ W_OV^h)·x"), ", and the unembedding ",
              math("W_U"), " reads the logits off its end. Here ", math("A^h ⊗ W"), " mixes positions with the attention "
              "pattern and transforms each position's vector with W; numerically ", math("(A ⊗ W)·x = A x Wᵀ"),
              " for x with one row per position."),
        prose(Numbered(
            ("Layers are numbered from 0, here and on every page of this companion, as in every tcircuits command and "
             "in TransformerLens: ", math("H_0", fixed=True), " is the set of heads of the first layer (the paper's ",
             math("H_1", fixed=True), "), ", math("H_1", fixed=True), " of the second, and L0H0 is head 0 of the first "
             "layer (the paper numbers layers from 1; tcircuits paper with the option index-from set to 1 writes this "
             "companion in the paper's numbering). "),
            ("Layers are numbered from 1, as in the paper, here and on every page of this companion: ",
             math("H_1", fixed=True), " is the set of heads of the first layer, ", math("H_2", fixed=True),
             " of the second, and L1H0 is head 0 of the first layer (TransformerLens and tcircuits' commands number "
             "from 0: their L0H0; tcircuits derive prints as here with the option index-from set to 1). ")),
              "Every equation below is a derivation of "
              "the catalogue (tcircuits derive NAME), each line checked numerically against its first on random "
              "matrices; where a shipped model has the architecture, the derivation is drawn for that model (its "
              "heads, its positions) and its final sum is also checked term by term against the model itself."),
    ), ("attention-head", "multi-head")),
    SectionSpec("language", "On language: the paper's tables beside ours", (
        prose("The paper's findings are claims about what attention-only transformers trained on text learn. This page "
              "measures them on three such models trained here, with zero, one and two layers of 12 heads each (as the "
              "paper's, so that the two-layer model has the paper's 1, 24 and 144 terms of order 0, 1 and 2): the King "
              "James Bible (public domain) tokenized by a byte-level BPE of 2,048 tokens, 20.5 M tokens each, the same "
              "sequences for all three, copy-augmented (each repeats a span of itself; the reason for every difference "
              "below says how), so that induction heads can form within an hour of one CPU thread. Every number is "
              "measured on the held-out text "
              "(every 20th block of 100 lines, never trained on), beside the paper's own where the paper gives one."),
        prose("What is measured: the zero-layer model's table ", math("W_U W_E"), " against the text's bigram counts; the "
              "one-layer model's skip-trigrams read off each head's QK circuit ", math("W_Eᵀ W_QK^h W_E"), " (which "
              "destination attends to which source) and OV circuit ", math("W_U W_OV^h W_E"), " (which outs the source "
              "raises), and the eigenvalues of the OV circuit (copying); the two-layer model's term importance, the loss "
              "as the direct path, the 24 heads ", math("A^h ⊗ W_U W_OV^h W_E"), " and the 144 virtual heads are added "
              "with the attention patterns frozen; and its induction heads on a repeated passage."),
        prose("Each finding is judged part by part against a control that has what the phenomenon needs but not the "
              "phenomenon: the model's own frequencies without the current token, the same heads with their outputs "
              "permuted, another word in a skip-trigram's source place, the same text shuffled, the one-layer model "
              "trained on the same text at the same width for the same tokens. The later sections measure the same "
              "findings on models trained on planted data, where the truth is known: they check that each detector "
              "finds what was planted."),
    ), (), ("language-bigrams", "language-copying", "language-skip-trigrams", "language-term-importance",
            "language-induction")),
    SectionSpec("formation", "How induction heads form: the phase change, measured", (
        prose("The follow-up paper (Olsson et al., 2022) finds that induction heads form in a phase change early in "
              "training: within a short window of steps the induction heads appear, the in-context learning score (the "
              "loss of a late token minus that of an early one) improves and hardly improves after, and the loss falls "
              "below its earlier trend (a bump); ablating the induction heads removes most of the in-context learning. "
              "This chapter judges those claims on the run that made the shipped two-layer language model, beside its "
              "one-layer control trained alike (which cannot form induction heads): the King James Bible, copy share 1 "
              "(every training sequence repeats a span of itself), 5,000 steps, 32 snapshots at log-spaced steps each."),
        prose("What is not measured when this page is built: the snapshots are not shipped (about 70 MB), so their "
              "measurements — the held-out loss at every token index, the in-context learning score, every head's "
              "prefix-matching and copying scores on repeated random tokens, the induction circuit's K-composition "
              "term, each snapshot's expansion verified against the snapshot model — are read from the file tcircuits "
              "dynamics wrote on the runs (numeric_check/data/kjv_2l.dynamics.json; scripts/ship_dynamics.py remakes "
              "it). What is measured when it is built: each run's last snapshot's content hash against the shipped "
              "model's; the shipped model's heads' scores against the last snapshot's stored ones; the ablation, on the "
              "shipped model and its held-out text; and the four claims, each rule judged on the stored measurements "
              "with that ablation, on the model and on its control."),
    ), ()),
    SectionSpec("zero-layer", "Zero layers: the bigram table", (
        prose("With no layers, the logits are ", math("T = W_U W_E"), " applied to the current token: the model can only "
              "learn which token tends to follow which."),
        prose("The shipped models' training data give it something to learn: outside the repeated segments that teach "
              "induction, each token is mostly followed by one of a few likely successors (a bigram table drawn from "
              "the training seed, each token as common as any other), and a few source tokens each have two planted "
              "skip-trigrams, A … B → C, as the paper's \u201ckeep … in mind\u201d and \u201ckeep … at bay\u201d "
              "(their training records hold the numbers; the options of tcircuits train-toy change them)."),
    ), ("zero-layer",), ("bigrams",), {"zero-layer": "logits-0l"}),
    SectionSpec("one-layer", "One layer: skip-trigrams", (
        prose("One attention layer adds a term per head to the direct path. Each head factors into a QK circuit ",
              math("W_Eᵀ W_QK^h W_E"), ", which decides where a destination token attends, and an OV circuit ",
              math("W_U W_OV^h W_E"), ", which decides how the attended source token changes the logits. Read together "
              "they are a table of skip-trigrams [source] … [destination] → [out]."),
    ), ("path-expansion", "one-layer", "eigenvalue-copying"), ("copying", "skip-trigrams", "bugs", "skip-trigram-detector"),
        {"one-layer": "logits-1l"}),
    SectionSpec("two-layers", "Two layers: composition and induction heads", (
        prose("With two layers the path expansion gains virtual heads ", math("(A^{h1} A^{h0}) ⊗ (W_U W_OV^{h1} W_OV^{h0} W_E)"),
              ", and a second-layer head's attention scores expand into direct, Q-, K- and QK-composition terms. "
              "K-composition with a previous-token head is how induction heads find the token after an earlier "
              "occurrence of the current one."),
        prose("The shipped models add positions right before ", math("W_Q"), " and ", math("W_K"), " (as the paper's "
              "models do), so the QK expansion below has a sum for each pair of inputs: tokens and positions on the "
              "query and on the key side. The position–position term ", math("W_posᵀ W_QK^h W_pos"),
              " is how a previous-token head finds the position before its own. Each sum over a layer's heads counts "
              "once per head of the model in the check beside it."),
    ), ("two-layer-logits", "two-layer-qk", "composition-scores", "induction-mechanism", "marginal-loss"),
        ("previous-token", "k-composition", "induction-heads", "induction-circuits", "induction-loss",
         "marginal-loss", "head-detectors"), {"two-layer-logits": "logits-2l", "two-layer-qk": "qk-2l"}),
    SectionSpec("appendix", "Appendix: tensor-product readings and the algebra's rules", (
        prose("The three readings of ", math("A ⊗ W"), " and the rules every derivation above uses, each with the "
              "identity it states; then the derivations the paper mentions in passing: virtual weights, heads that "
              "delete a subspace, layer norm and biases folded into the weights, any head's QK expansion, and rotary "
              "positions."),
    ), ("tensor-product-readings", "virtual-weights", "subspace-deletion", "layer-norm-folding", "bias-folding",
        "qk-expansion", "rotary")),
)


#: Catalogue parameters read from a shipped model's architecture, where an entry takes them.
MODEL_PARAMS = ("heads", "positional")


@dataclass(frozen=True)
class Equation:
    """A catalogue derivation with its numerical check on random matrices and, where one ran, on a shipped model."""

    name: str
    derivation: Derivation
    verification: Verification | str
    model_check: VerifyReport | None = None


@dataclass(frozen=True)
class Section:
    spec: SectionSpec
    equations: tuple[Equation, ...]
    findings: tuple[PaperFinding, ...]

    @property
    def slug(self) -> str:
        return self.spec.slug

    @property
    def title(self) -> str:
        return self.spec.title


@dataclass(frozen=True)
class Paper:
    sections: tuple[Section, ...]
    measurements: Measurements

    @property
    def findings(self) -> list[PaperFinding]:
        return [f for s in self.sections for f in s.findings]

    @property
    def equations(self) -> list[Equation]:
        return [e for s in self.sections for e in s.equations]


def model_params(name: str, arch: Architecture | None) -> dict:
    """The parameters of catalogue entry ``name`` that ``arch`` fixes (its heads per layer, its positions)."""
    if arch is None:
        return {}
    taken = catalogue.lookup(name).params
    values = {"heads": arch.n_heads, "positional": arch.positional}
    return {k: values[k] for k in MODEL_PARAMS if k in taken}


def without_indexing_note(derivation: Derivation) -> Derivation:
    """The derivation without its note on layer numbering: the companion says it once, in its notation section."""
    return replace(derivation, notes=tuple(n for n in derivation.notes if n != INDEXING))


def equation(name: str, model_check: VerifyReport | None = None, params: dict | None = None) -> Equation:
    """The catalogue entry ``name`` with ``params`` (else its defaults), verified line by line."""
    derivation = without_indexing_note(catalogue.get(name, **(params or {})))
    try:
        verification: Verification | str = derivation.verify()
    except DerivationError as error:  # shown on the page, never hidden
        verification = f"the numerical check could not run: {error}"
    return Equation(name, derivation, verification, model_check)


def _checked_arch(m: Measurements, check: str | None) -> Architecture | None:
    """The architecture of the shipped model a model check (``logits-2l``, ``qk-2l`` …) runs on."""
    if not check:
        return None
    return m.analysis(int(check.split("-")[1].rstrip("l"))).model.arch


def build_paper(m: Measurements, progress: Callable[[str], None] = lambda step: None) -> Paper:
    """Every section with its equations (built and verified) and findings; ``progress`` after each section."""
    found = paper_findings(m) | known_truth_findings(m)
    if m.language is not None:
        found.update(language_findings(m.language))
    sections = []
    for spec in SECTIONS:
        equations = tuple(equation(n, m.verification.get(spec.model_checks.get(n, "")),
                                   model_params(n, _checked_arch(m, spec.model_checks.get(n))))
                          for n in spec.equations)
        sections.append(Section(spec, equations, tuple(found[k] for k in spec.findings if k in found)))
        progress(f"derived and checked: {spec.title}")
    return Paper(tuple(sections), m)
