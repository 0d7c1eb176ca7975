"""The ``derive`` and ``expand`` subcommands of ``tcircuits`` (see :mod:`derivations.cli`).

``tcircuits derive NAME`` prints a derivation of the catalogue as LaTeX, Markdown, text,
JSON or a self-contained HTML page with MathML (``--pdf`` compiles the LaTeX); ``tcircuits expand "EXPR"`` prints each rewrite step
of an expression. Bad input raises a :class:`~derivations.errors.DerivationError` (or
another :class:`~tensoralg.errors.TCircuitsError`), which the CLI prints in one line.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Mapping

from tensoralg.definitions import STANDARD_DEFINITIONS
from tensoralg.escape import terminal_safe

from derivations import catalogue
from derivations.catalogue.rotary import STYLES as ROTARY_STYLES
from derivations.derivation import Derivation
from derivations.vocabulary import add_index_from, add_max_terms, add_out, note_once  # noqa: F401 - add_index_from: its old home
from derivations.errors import CommandLineError, DerivationError, LatexError, OutputError
from derivations.checking import identity_document
from derivations.files import output_file, writable_file, write_atomic
from derivations.expansion import CLI_HINT, expansion
from derivations.html import html_document

FORMATS = ("text", "latex", "markdown", "json", "html")
PDFLATEX_FLAGS = ("-interaction=nonstopmode", "-halt-on-error", "-no-shell-escape")


# -- compiling LaTeX --------------------------------------------------------------------


def pdflatex() -> str:
    """The path of ``pdflatex``; :class:`LatexError` when it is not installed."""
    path = shutil.which("pdflatex")
    if path is None:
        raise LatexError("pdflatex is not installed, so no PDF was made; install TeX Live "
                         "(Debian/Ubuntu: apt-get install texlive-latex-base) or drop --pdf")
    return path


def compile_latex(source: str, timeout: float = 120, files: Mapping[str, Path] | None = None) -> tuple[bytes, str]:
    """Compile a LaTeX document in a fresh temporary directory (shell escape off).

    ``files`` maps relative names (``figures/a.pdf``) to files copied beside the document
    first, for ``\\includegraphics``. Returns ``(pdf bytes, log text)``; raises
    :class:`LatexError` with the log's first error when pdflatex fails.
    """
    exe = pdflatex()
    with tempfile.TemporaryDirectory(prefix="tcircuits-") as tmp:
        for name, path in (files or {}).items():
            target = Path(tmp) / name
            if target.resolve().parent != Path(tmp).resolve() / Path(name).parent or Path(name).is_absolute():
                raise LatexError(f"a file for LaTeX must have a plain relative name, got {name!r}")
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, target)
        tex = Path(tmp) / "derivation.tex"
        tex.write_text(source, encoding="utf-8")
        try:
            run = subprocess.run([exe, *PDFLATEX_FLAGS, tex.name], cwd=tmp, capture_output=True,
                                 timeout=timeout, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            raise LatexError(f"pdflatex took longer than {timeout:.0f} s and was stopped") from None
        log_path = Path(tmp) / "derivation.log"
        log = log_path.read_text(errors="replace") if log_path.exists() else run.stdout.decode(errors="replace")
        pdf = Path(tmp) / "derivation.pdf"
        if run.returncode != 0 or not pdf.exists():
            raise LatexError(f"pdflatex failed (exit {run.returncode}): {first_error(log)}")
        return pdf.read_bytes(), log


def first_error(log: str) -> str:
    """The first ``! …`` error of a TeX log, with the line after it, on one line."""
    lines = log.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("!"):
            return " ".join(part.strip() for part in lines[i : i + 3])
    return "no error message in the log"


# -- writing results --------------------------------------------------------------------


def render(derivation: Derivation, fmt: str, max_terms: int | None, index_from: int = 0) -> str:
    """The document in ``fmt``; ``index_from=1`` numbers layers as the paper does."""
    if fmt not in FORMATS:
        raise DerivationError(f"unknown format {fmt!r}; expected one of {', '.join(FORMATS)}")
    if fmt == "json":
        return derivation.to_json(index_from=index_from)
    if fmt == "html":
        return html_document(derivation, max_terms=max_terms, index_from=index_from)
    try:  # every line checked numerically, and marked so, in every format (HTML marks its own)
        verification = derivation.verify()
    except DerivationError as error:
        verification = f"the check could not run: {error}"
    return getattr(derivation, {"text": "to_text", "latex": "to_latex", "markdown": "to_markdown"}[fmt])(
        max_terms=max_terms, index_from=index_from, verification=verification)


def emit(derivation: Derivation, args) -> int:
    """Print or write the derivation; with ``--pdf`` also compile it next to the output."""
    if args.pdf and args.format not in (None, "latex"):
        raise DerivationError(f"--pdf compiles LaTeX; it cannot be combined with --format {args.format}")
    fmt = "latex" if args.pdf else (args.format or "text")
    max_terms = args.max_terms
    if max_terms == 0:  # what derive's 0 meant before --max-terms had one meaning: every term
        note_once("tcircuits derive", "--max-terms 0", "--max-terms 0 is an old spelling here and goes in a later "
                  "release; use --max-terms all (0 means none elsewhere; a sum shows at least 3 terms)")
        max_terms = None
    if max_terms is not None and max_terms < 3:
        raise CommandLineError(f"--max-terms {max_terms}: a sum keeps its first and last terms around the '…', so at "
                               "least 3; all shows every term")
    force = getattr(args, "force", False)
    out = output_file(args.output, force=force)  # checked before the work; None: standard output (-o -)
    target = None
    if args.pdf:  # a PDF the person did not name is checked as -o is, and an existing one kept without --force
        target = writable_file(out.with_suffix(".pdf") if out is not None else Path(f"{derivation.name}.pdf"),
                               force=force, new=True)
    document = render(derivation, fmt, max_terms, getattr(args, "index_from", 0))
    if out is not None:
        write_atomic(out, document)
    elif not args.pdf or args.output is not None:  # with --pdf, the LaTeX is printed when -o - asks for it
        print(terminal_safe(document), end="" if document.endswith("\n") else "\n")
    if target is not None:
        pdf, _ = compile_latex(document)
        write_atomic(target, pdf)
    written = [path for path in (out, target) if path is not None]
    if written:
        print(terminal_safe("wrote " + " and ".join(str(path) for path in written)))
    return 0


# -- derive -----------------------------------------------------------------------------

# catalogue parameter -> (option, help)
OPTIONS = {
    "layers": ("--layers", "number of layers (virtual-weights: intermediate layers)"),
    "heads": ("--heads", "heads per layer: one int, or one per layer as 1,3 (virtual-weights: components per layer)"),
    "layer": ("--layer", "layer of the head whose scores are expanded, numbered as --index-from says (default: the last)"),
    "head": ("--head", "head whose scores are expanded (default 0)"),
    "positional": ("--positional", "positional embeddings: none, standard (added to the residual stream) or "
                                   "qk_only (added before W_Q and W_K)"),
    "layer_norm": ("--layer-norm", "layer norm with frozen scales before each layer and the unembedding"),
    "biases": ("--biases", "biases (b_V folded into b_O; b_O and b_U as constant sources)"),
    "mlp": ("--mlp", "MLP layers, as opaque sources"),
    "max_order": ("--max-order", "keep the paths through at most K heads"),
    "concrete": ("--concrete/--symbolic", "enumerate the heads (L0H0, L0H1, …) or write Σ over a layer's heads"),
    "frequencies": ("--frequencies", "rotary: number of rotated frequency pairs"),
    "partial": ("--partial", "rotary: some features of each head pass unrotated"),
    "style": ("--style", "rotary: which features pair up, neox (halves) or gptj (neighbours)"),
    "post_only": ("--post-only", "post-norm: norms only after each sublayer (OLMo 2), not before and after (Gemma 2)"),
}


def heads_arg(text: str):
    try:
        values = tuple(int(v) for v in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an int or ints separated by commas (2 or 1,3), got {text!r}")
    return values[0] if len(values) == 1 else values


MAX_CHECK_SEED = 2**32 - 1  # numpy's seeds of the random bindings


def seed_arg(text: str) -> int:
    """``--seed`` of ``check``: an integer from 0 to 2**32 - 1, refused otherwise by argparse (exit 2)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer from 0 to {MAX_CHECK_SEED}, got {text!r}") from None
    if not 0 <= value <= MAX_CHECK_SEED:
        raise argparse.ArgumentTypeError(f"expected an integer from 0 to {MAX_CHECK_SEED}, got {text}")
    return value


def derive(args) -> int:
    if args.list:
        width = max(map(len, catalogue.names()))
        for name, description in catalogue.descriptions().items():
            print(f"{name:<{width}}  {description}")
        return 0
    if not args.name:
        raise DerivationError("give a derivation NAME (tcircuits derive --list shows them)")
    entry = catalogue.lookup(args.name)
    given = {p: getattr(args, p) for p in OPTIONS if getattr(args, p) is not None}
    unknown = [OPTIONS[p][0] for p in given if p not in entry.params]
    if unknown:
        takes = ", ".join(OPTIONS[p][0] for p in entry.params) or "no options"
        raise DerivationError(f"{args.name} does not take {', '.join(unknown)}; it takes: {takes}")
    if "layer" in entry.params:
        given.update(numbered_head(given, entry.params, args.index_from))
    return emit(catalogue.get(args.name, **given), args)


#: options that name a layer: typed in the numbering --index-from says, as every label is printed
NUMBERED_OPTIONS = ("layer",)


def numbered_head(given: dict, defaults: dict, index_from: int) -> dict:
    """``--layer`` as typed (layers numbered from ``index_from``) as the catalogue's 0-based layer, the layer
    and ``--head`` checked first so that an error names the layer as it was typed.

    >>> numbered_head({"layer": 2}, {"layers": 2, "heads": 2, "head": 0}, 1)
    {'layer': 1}
    """
    layers, heads = given.get("layers", defaults.get("layers")), given.get("heads", defaults.get("heads"))
    if not isinstance(layers, int) or layers < 1 or not isinstance(heads, (int, tuple)):
        return {}  # the entry refuses these itself
    layer = given.get("layer", layers - 1 + index_from)
    if not index_from <= layer < layers + index_from:
        raise DerivationError(f"layer {layer} does not exist: the model has layers {index_from}..{layers - 1 + index_from}"
                              + (" (numbered from 1, as --index-from 1 asks)" if index_from else ""))
    count = heads if isinstance(heads, int) else heads[layer - index_from] if len(heads) == layers else None
    head = given.get("head", defaults.get("head", 0))
    if count is not None and isinstance(head, int) and not 0 <= head < count:
        raise DerivationError(f"head {head} does not exist in layer {layer}: it has heads 0..{count - 1}")
    return {"layer": layer - index_from} if "layer" in given else {}


# -- expand -----------------------------------------------------------------------------


def atom_arg(text: str) -> tuple[str, tuple[str, str]]:
    name, sep, shape = text.partition("=")
    dims = [d.strip() for d in shape.split(",")]
    if not sep or not name.strip() or len(dims) != 2 or not all(dims):
        raise argparse.ArgumentTypeError(f"expected NAME=ROWS,COLS (e.g. V=d_model,k), got {text!r}")
    return name.strip(), (dims[0], dims[1])


def expand(args) -> int:
    atoms = dict(args.atom or ())
    derivation = expansion(args.expression, args.max_order, atoms, index_from=args.index_from,
                           fold=args.fold or (), strict=args.strict, hint=CLI_HINT, opaque=args.opaque)
    return emit(derivation, args)


def check_identity(args) -> int:
    """``tcircuits check``: exit 0 when the identity holds, 1 when it does not (2: bad input)."""
    derivation, result = identity_document(args.identity, dict(args.atom or ()), index_from=args.index_from,
                                           opaque=args.opaque, seed=args.seed)
    emit(derivation, args)
    return 0 if result.holds else 1


# -- the parsers ------------------------------------------------------------------------

DERIVE_HELP = """\
Print a derivation of the catalogue: every line produced by a rule of the algebra
(definition, distributivity, mixed-product rule (A⊗B)(C⊗D) = (AC)⊗(BD), collecting
like terms, folding W_OV := W_O W_V and W_QK := W_Qᵀ W_K, …) and checked numerically.

Notation: A^h ⊗ W means "mix positions with head h's attention pattern A^h and map each
position's vector with W"; numerically (A ⊗ W)·x = A x Wᵀ for x with one row per
position. Σ_{h0∈H_0} sums over the heads of layer 0 (--symbolic, the default); with
--concrete the heads are enumerated as L0H0, L0H1, … (0-indexed, as in TransformerLens;
--index-from 1 numbers layers as the paper does: H_1, L1H0, … for the first layer).
"""

DERIVE_EPILOG = """\
examples:
  tcircuits derive --list
  tcircuits derive two-layer-logits --index-from 1
  tcircuits derive two-layer-logits --heads 2 --format markdown
  tcircuits derive path-expansion --layers 3 --heads 4 --concrete --max-order 1
  tcircuits derive two-layer-qk --format latex -o qk.tex --pdf
  tcircuits derive induction-mechanism --format html -o induction.html
"""

EXPAND_HELP = """\
Print each rewrite step of an expression typed as the slides write it: transposes of
products, distributivity, the mixed-product rule (A⊗B)(C⊗D) = (AC)⊗(BD), collecting like
terms, an operator applied to an activation, and folding (--fold).

The language (a product binds tighter than ⊗, which binds tighter than +):
  atoms        W_E W_U W_pos W_Q W_K W_V W_O W_OV W_QK A (n_ctx × n_ctx) N b_Q …;
               any other name (B, C, x, …) is a matrix whose shape the products fix,
               or declare it with --atom NAME=ROWS,COLS
  superscript  A^h, W_OV^h, W_O^{h1} (braces optional for one symbol); ^T or ᵀ transposes
  Id           the identity; Id + A ⊗ W means Id ⊗ Id + A ⊗ W
  operators    ⊗ or (x) tensor product; juxtaposition, · or * product; + and -
  scalars      2, 1/2, 1/sqrt(d_head), d_model
  sums         Σ_{h∈H_1} A^h ⊗ W_OV^h  (ASCII: sum_{h in H_1} A^h (x) W_OV^h): a sum over
               the heads of a layer, kept symbolic; each term is summed over its own index;
               Σ_{h∈H_1∪H_2} (ASCII: sum_{h in H_1 cup H_2}) sums over the heads of both layers
  activations  (A ⊗ W) x = A x Wᵀ: an operator applied to x, one token per row
  the paper's  \\otimes \\cdot ^\\top ^{T} \\mathrm{Id} \\left( \\right) W_{OV} \\sum_{h \\in H_1} read as
  LaTeX        above, \\frac{a}{b} and \\sqrt{a} as a/b and sqrt(a); W_Q^{hT}, ^{h^T} or ^{h\\top}
               is W_Q^{h}ᵀ; h_2 is h2; other commands are refused with what to type
  products     AC, where A and C are atoms of the expression and AC is not declared, is the
               product A C (a note says so), and AxW^T is A x Wᵀ; 1 after a matrix or beside ⊗
               (A^h 1, 1 ⊗ b_O) is the column of ones, any other number there is refused
  functions    softmax(…), exp(…), LN(…) are not linear: refused ("write the pattern as A^h"),
               or with --opaque read as unknown matrices, one per function and argument:
               softmax(A) and softmax(B) differ, softmax(A + B) is softmax(B + A)
  identities   LHS = RHS is for tcircuits check

Layer numbers: with --index-from 0 (the default, as TransformerLens) H_0 is the first
layer and H_1 the second; with --index-from 1 (the paper's numbering) H_1 is the first
layer, in the input and in the output alike (head labels too: L1H0 is the first layer's
head 0, and A^{h1} a head of the first layer), so what is printed can be typed back.
"""

EXPAND_EPILOG = """\
examples:
  tcircuits expand "(A ⊗ B)(C ⊗ D)"
  tcircuits expand "(Id ⊗ W_U)(Id + Σ_{h∈H_0} A^h ⊗ W_OV^h)(Id ⊗ W_E)"
  tcircuits expand "(Id ⊗ W_U)(Id + Σ_{h∈H_2} A^h ⊗ W_OV^h)(Id + Σ_{h∈H_1} A^h ⊗ W_OV^h)(Id ⊗ W_E)" --index-from 1
  tcircuits expand "(A^h ⊗ W_O^h W_V^h)·x" --fold W_OV
  tcircuits expand "(Id + A^{h1} ⊗ W_OV^{h1})(Id + A^{h0} ⊗ W_OV^{h0})" --max-order 1
  tcircuits expand "V Vᵀ ⊗ A" --atom V=d_model,k
"""


CHECK_HELP = """\
Check an identity LHS = RHS typed as the slides (or the paper's LaTeX) write it. Both sides are
expanded by the rules of the algebra (distributivity, the mixed-product rule, collecting like
terms; W_OV := W_O W_V and W_QK := W_Qᵀ W_K unfolded to compare) and compared term by term;
the verdict is confirmed numerically on random bindings. Exit status 0 when it holds, 1 when it
does not (the terms of LHS - RHS and a small integer counterexample are shown), 2 for bad input.
The language is expand's (tcircuits expand --help); a side may be 0. Decimals are the exact numbers
they write (0.1 A + 0.2 A = 0.3 A holds); each side's terms are counted before anything is expanded,
and a side of more than 5,000 terms (expand's limit) is refused. With --opaque, softmax(…), exp(…),
LN(…) are unknowns of the function and its argument: the same application on both sides is the
same matrix, any other application another.
"""

CHECK_EPILOG = """\
examples:
  tcircuits check "(A ⊗ B)(C ⊗ D) = (AC) ⊗ (BD)"
  tcircuits check "W_QK^h = W_Q^{hT} W_K^h"
  tcircuits check "(Id + A^{h1} ⊗ W_OV^{h1})(Id + A^{h0} ⊗ W_OV^{h0}) = Id + A^{h1} ⊗ W_OV^{h1} + A^{h0} ⊗ W_OV^{h0}"
  tcircuits check "(X Y)^T = Y^T X^T" --format markdown
  tcircuits check "(A ⊗ W)x = AxW^T"
  tcircuits check "softmax(A) = softmax(B)" --opaque
"""


def add_opaque(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--opaque", action="store_true",
                        help="read softmax(…), exp(…), LN(…) as opaque matrices, one unknown per function and "
                             "argument (softmax(A) is not softmax(B)), instead of refusing them")


def add_output_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--format", choices=FORMATS, default=None, help="output format (default: text; html: one self-contained page, "
                             "maths as MathML, open it in a browser)")
    add_out(parser, dest="output", help="write to FILE instead of standard output (- or /dev/stdout: standard output)")
    parser.add_argument("--force", action="store_true", help="let -o replace a checkpoint or a training record, "
                        "and --pdf an existing PDF")
    parser.add_argument("--pdf", action="store_true",
                        help="compile the LaTeX with pdflatex; the PDF goes next to -o FILE (or NAME.pdf), "
                        "and an existing one is kept unless --force")
    add_max_terms(parser, dest="max_terms", default=40, old=None,
                  help="elide the middle of sums longer than N terms (at least 3; all: every term; default 40)")


def register(subparsers) -> None:
    """Add ``derive``, ``expand`` and ``check`` to the ``tcircuits`` parser."""
    p = subparsers.add_parser("derive", help="print a derivation of the paper's equations",
                              description=DERIVE_HELP, epilog=DERIVE_EPILOG,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("name", nargs="?", metavar="NAME", help="a derivation (see --list)")
    p.add_argument("--list", action="store_true", help="list the derivations with a line each")
    p.add_argument(OPTIONS["layers"][0], type=int, help=OPTIONS["layers"][1])
    p.add_argument(OPTIONS["heads"][0], type=heads_arg, help=OPTIONS["heads"][1])
    p.add_argument(OPTIONS["layer"][0], type=int, help=OPTIONS["layer"][1])
    p.add_argument(OPTIONS["head"][0], type=int, help=OPTIONS["head"][1])
    p.add_argument(OPTIONS["positional"][0], choices=("none", "standard", "qk_only"), help=OPTIONS["positional"][1])
    for key in ("layer_norm", "biases", "mlp", "partial", "post_only"):
        p.add_argument(OPTIONS[key][0], dest=key, action="store_const", const=True, default=None, help=OPTIONS[key][1])
    p.add_argument(OPTIONS["frequencies"][0], type=int, metavar="F", help=OPTIONS["frequencies"][1])
    p.add_argument(OPTIONS["style"][0], choices=ROTARY_STYLES, help=OPTIONS["style"][1])
    p.add_argument(OPTIONS["max_order"][0], type=int, metavar="K", help=OPTIONS["max_order"][1])
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--concrete", dest="concrete", action="store_const", const=True, default=None,
                      help="enumerate the heads: L0H0, L0H1, …")
    mode.add_argument("--symbolic", dest="concrete", action="store_const", const=False,
                      help="write Σ over each layer's heads (the default)")
    add_index_from(p)
    add_output_options(p)
    p.set_defaults(func=derive)

    e = subparsers.add_parser("expand", help="print each rewrite step of an expression",
                              description=EXPAND_HELP, epilog=EXPAND_EPILOG,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    e.add_argument("expression", metavar="EXPR", help="the expression, quoted")
    e.add_argument("--max-order", type=int, metavar="K", help="keep the products through at most K non-identity terms")
    e.add_argument("--atom", type=atom_arg, action="append", metavar="NAME=ROWS,COLS",
                   help="declare an atom beyond the paper's, e.g. V=d_model,k (repeatable)")
    e.add_argument("--strict", action="store_true",
                   help="refuse names that are neither the paper's atoms nor declared with --atom "
                        "(catches typos such as W_0V) instead of giving them fresh shapes")
    add_opaque(e)
    e.add_argument("--fold", action="append", choices=tuple(STANDARD_DEFINITIONS), metavar="NAME",
                   help="fold a definition at the end: W_OV (W_O W_V → W_OV) or W_QK (W_Qᵀ W_K → W_QK); repeatable")
    add_index_from(e)
    add_output_options(e)
    e.set_defaults(func=expand)

    c = subparsers.add_parser("check", help="check an identity LHS = RHS (exit 0 when it holds, 1 when not)",
                              description=CHECK_HELP, epilog=CHECK_EPILOG,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    c.add_argument("identity", metavar="IDENTITY", help='the identity, quoted: "LHS = RHS"')
    c.add_argument("--atom", type=atom_arg, action="append", metavar="NAME=ROWS,COLS",
                   help="declare an atom beyond the paper's, e.g. V=d_model,k (repeatable)")
    c.add_argument("--seed", type=seed_arg, default=0, help="seed of the random bindings, 0 to 2**32 - 1 (default 0)")
    add_opaque(c)
    add_index_from(c)
    add_output_options(c)
    c.set_defaults(func=check_identity)


__all__ = ["FORMATS", "LatexError", "OutputError", "compile_latex", "expansion", "pdflatex", "register"]
