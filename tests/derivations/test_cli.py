"""The ``derive`` and ``expand`` subcommands, in-process and through the installed script."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from derivations import catalogue, commands
from derivations.cli import main
from tests.conftest import needs_pdflatex


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def assert_clean_error(code, err, *fragments):
    assert code == 2
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if "warning: command" not in line]  # others' plugins
    assert len(lines) == 1, lines
    for fragment in fragments:
        assert fragment in lines[0]


# -- derive ---------------------------------------------------------------------------------


def test_list_gives_every_name_with_a_description(capsys):
    code, out, _ = run(capsys, "derive", "--list")
    assert code == 0
    lines = out.splitlines()
    assert [line.split()[0] for line in lines] == catalogue.names()
    assert all(len(line.split(None, 1)) == 2 for line in lines)


@pytest.mark.parametrize("fmt, marker", [("text", "Σ_{h1∈H_1}"), ("latex", r"\begin{align*}"),
                                         ("markdown", "$$"), ("json", '"chains"')])
def test_derive_prints_each_format(capsys, fmt, marker):
    code, out, _ = run(capsys, "derive", "two-layer-logits", "--format", fmt)
    assert code == 0 and marker in out
    if fmt == "json":
        assert json.loads(out)["name"] == "two-layer-logits"
    if fmt == "latex":
        assert out.startswith("% two-layer-logits") and out.rstrip().endswith(r"\end{document}")


def test_derive_passes_options_to_the_catalogue(capsys):
    code, out, _ = run(capsys, "derive", "path-expansion", "--layers", "3", "--heads", "1,2,1", "--concrete",
                       "--max-order", "1", "--format", "json")
    assert code == 0
    data = json.loads(out)
    assert data["params"]["heads"] == [1, 2, 1] and data["params"]["max_order"] == 1
    assert data["chains"][0]["steps"][-1]["expr"]["n_terms"] == 1 + 4


def test_symbolic_is_the_default_and_concrete_enumerates(capsys):
    _, symbolic, _ = run(capsys, "derive", "one-layer", "--heads", "2")
    _, concrete, _ = run(capsys, "derive", "one-layer", "--heads", "2", "--concrete")
    assert "Σ_{h0∈H_0}" in symbolic and "L0H1" not in symbolic
    assert "A^{L0H1}" in concrete and "Σ_{h0" not in concrete


def test_max_terms_elides_or_shows_all(capsys):
    _, elided, _ = run(capsys, "derive", "two-layer-logits", "--heads", "4", "--concrete", "--max-terms", "6")
    _, full, _ = run(capsys, "derive", "two-layer-logits", "--heads", "4", "--concrete", "--max-terms", "0")
    assert "⋯" in elided and "⋯" not in full and len(elided) < len(full)


def test_output_file(capsys, tmp_path):
    target = tmp_path / "d.md"
    code, out, _ = run(capsys, "derive", "zero-layer", "--format", "markdown", "-o", str(target))
    assert code == 0 and out.strip() == f"wrote {target}"
    assert target.read_text(encoding="utf-8").startswith("# A zero-layer transformer")


@pytest.mark.parametrize("argv, fragments", [
    (["derive", "two-layer-qq"], ["unknown derivation 'two-layer-qq'", "did you mean 'two-layer-qk'", "Known: zero-layer"]),
    (["derive", "path-expansion", "--layers", "-1"], ["n_layers must be >= 0, got -1"]),
    (["derive", "path-expansion", "--heads", "0"], ["at least one head"]),
    (["derive", "zero-layer", "--heads", "2"], ["zero-layer does not take --heads; it takes: no options"]),
    (["derive", "multi-head", "--layers", "2"], ["does not take --layers; it takes: --heads"]),
    (["derive", "path-expansion", "--layers", "12", "--heads", "12", "--concrete"],
     ["23,298,085,122,481 terms", "--max-order 1"]),
    (["derive", "path-expansion", "--max-order", "7"], ["an integer in 0..2 (the deepest term of the logits", "got 7"]),
    (["derive", "two-layer-logits", "-o", "/nonexistent-dir/x.tex"], ["cannot write to '/nonexistent-dir'"]),
    (["derive", "one-layer", "--pdf", "--format", "json"], ["--pdf compiles LaTeX"]),
    (["derive"], ["give a derivation NAME"]),
])
def test_bad_derive_requests_are_one_line_errors(capsys, argv, fragments):
    code, _, err = run(capsys, *argv)
    assert_clean_error(code, err, "tcircuits derive: error:", *fragments)


@pytest.mark.parametrize("argv", [["derive", "zero-layer", "--bogus"], ["derive", "path-expansion", "--heads", "two"],
                                  ["derive", "path-expansion", "--positional", "rotary"],
                                  ["derive", "one-layer", "--concrete", "--symbolic"],
                                  ["derive", "zero-layer", "--format", "docx"],
                                  ["expand", "A", "--atom", "V"]])
def test_malformed_options_are_argparse_errors(capsys, argv):
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "error:" in err and "Traceback" not in err


def test_unwritable_output_file_is_reported(capsys, tmp_path):
    directory = tmp_path / "a-directory"
    directory.mkdir()
    code, _, err = run(capsys, "derive", "zero-layer", "-o", str(directory))
    assert_clean_error(code, err, "is a directory; it must be a file that can be replaced")


def test_help_explains_the_notation_with_examples(capsys):
    for argv, words in ((["derive", "--help"], ["mixed-product rule", "A^h ⊗ W", "Σ_{h0∈H_0}", "examples:"]),
                        (["expand", "--help"], ["⊗ or (x)", "^T or ᵀ", "examples:", "--atom", "Σ_{h∈H_1}",
                                                "sum_{h in H_1}", "A^h", "(A ⊗ W) x = A x Wᵀ", "--index-from 1",
                                                "H_1 is the first", "--fold W_OV"])):
        with pytest.raises(SystemExit) as info:
            main(argv)
        assert info.value.code == 0
        out = capsys.readouterr().out
        for word in words:
            assert word in out, (argv, word)


# -- --pdf ------------------------------------------------------------------------------------


@needs_pdflatex
def test_pdf_is_written_next_to_the_output(capsys, tmp_path):
    target = tmp_path / "qk.tex"
    code, out, _ = run(capsys, "derive", "two-layer-qk", "-o", str(target), "--pdf")
    assert code == 0 and f"wrote {target} and {target.with_suffix('.pdf')}" in out
    assert target.read_text().startswith("% two-layer-qk")
    assert target.with_suffix(".pdf").read_bytes().startswith(b"%PDF")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["qk.pdf", "qk.tex"]  # no aux files left behind


def test_pdf_without_pdflatex_says_so_and_keeps_the_source(capsys, tmp_path, monkeypatch):
    monkeypatch.setattr(shutil, "which", lambda name: None)
    target = tmp_path / "z.tex"
    code, _, err = run(capsys, "derive", "zero-layer", "-o", str(target), "--pdf")
    assert_clean_error(code, err, "pdflatex is not installed")
    assert target.exists() and not target.with_suffix(".pdf").exists()


def test_a_failing_pdflatex_is_reported_with_its_error(monkeypatch):
    if shutil.which("pdflatex") is None:
        pytest.skip("pdflatex is not installed")
    with pytest.raises(commands.LatexError, match="Undefined control sequence"):
        commands.compile_latex("\\documentclass{article}\\begin{document}\\nosuchcommand\\end{document}")


# -- expand ------------------------------------------------------------------------------------


def test_expand_prints_each_rewrite_step(capsys):
    code, out, _ = run(capsys, "expand", "(Id ⊗ W_U)(Id ⊗ Id + A^{h} ⊗ W_OV^{h})(Id ⊗ W_E)")
    assert code == 0
    assert out.index("[Distributivity") < out.index("[Mixed-product rule") < out.index("= Id ⊗ W_U W_E + A^{h}")


def test_expand_with_declared_atoms_truncation_and_json(capsys):
    code, out, _ = run(capsys, "expand", "(A ⊗ B)(C ⊗ D) + (A ⊗ B)(C ⊗ D)", "--atom", "B=d_model,d_model",
                       "--atom", "C=n_ctx,n_ctx", "--atom", "D=d_model,d_model", "--format", "json")
    assert code == 0
    steps = json.loads(out)["chains"][0]["steps"]
    assert [s["rule"] for s in steps] == ["given", "mixed-product", "collect"]
    assert steps[-1]["expr"]["text"] == "2·A C ⊗ B D"
    code, out, _ = run(capsys, "expand", "(Id ⊗ Id + A^{1} ⊗ W_OV^{1})(Id ⊗ Id + A^{0} ⊗ W_OV^{0})",
                       "--max-order", "1")
    assert code == 0 and "[Truncation by order" in out and "A^{1} A^{0}" not in out.split("[Truncation")[1]


def test_expand_of_a_canonical_sum_says_so(capsys):
    code, out, _ = run(capsys, "expand", "A^{h} ⊗ W_OV^{h}")
    assert code == 0 and "already expanded" in out


@pytest.mark.parametrize("argv, fragments", [
    (["expand", "(A"], ["expected ')'", "position"]),
    (["expand", "A ⊗ B", "--strict"], ["unknown atom 'B'", "declare others with --atom NAME=ROWS,COLS"]),
    (["expand", "(A ⊗ B)(W_E ⊗ D)"], ["n_ctx x n_ctx", "d_model x d_vocab"]),
    (["expand", "B W_E ⊗ B W_U"], ["B (rows_B x d_model) by W_U (d_vocab x d_model)", "rows at position 10:"]),
    (["expand", "Σ h"], ["expected '_{' after 'Σ'", "position 1"]),
    (["expand", "Σ_{h∈H_0} A^h ⊗ W_OV^h", "--index-from", "1"], ["H_0 is not a layer"]),
    (["expand", "(A ⊗ W_OV) x", "--fold", "W_QK"], ["--fold W_QK", "nothing to fold"]),
    (["expand", "(Id ⊗ W_U)(Id ⊗ W_E)", "--max-order", "-1"], ["max_order must be None (every term) or an integer >= 0, got -1"]),
    (["expand", " ".join(f"(Id ⊗ Id + A^{{{i}}} ⊗ W_OV^{{{i}}})" for i in range(13))], ["8,192 terms", "--max-order 6"]),
])
def test_bad_expand_requests_are_one_line_errors(capsys, argv, fragments):
    code, _, err = run(capsys, *argv)
    assert code == 2 and "Traceback" not in err
    message = "\n".join(line for line in err.splitlines() if "warning: command" not in line)
    assert message.startswith("tcircuits expand: error:")
    first = message.splitlines()[0]
    assert "position" not in message or " at position " in first  # the position on the first line, a caret may follow
    for fragment in fragments:
        assert fragment in message


def test_the_api_hint_is_not_given_on_the_command_line(capsys):
    code, _, err = run(capsys, "expand", "W_0V ⊗ A", "--strict")
    assert code == 2 and "atoms=" not in err and "--atom NAME=ROWS,COLS" in err


def expand_json(capsys, *argv):
    code, out, err = run(capsys, "expand", *argv, "--format", "json")
    assert code == 0, err
    return json.loads(out)["chains"]


def test_generic_matrices_need_no_declaration(capsys):
    code, out, _ = run(capsys, "expand", "(A ⊗ B)(C ⊗ D)")
    assert code == 0 and out.rstrip().endswith("= A C ⊗ B D")


def test_indexed_sums_expand_symbolically(capsys):
    chains = expand_json(capsys, "(Id ⊗ W_U)(Id + Σ_{h∈H_1} A^h ⊗ W_OV^h)(Id ⊗ W_E)")
    assert chains[0]["steps"][-1]["expr"]["text"] == "Id ⊗ W_U W_E + Σ_{h1∈H_1} A^{h1} ⊗ W_U W_OV^{h1} W_E"
    chains = expand_json(capsys, "(Id ⊗ W_U)(Id + sum_{h in H_1} A^h (x) W_OV^h)(Id + sum_{h in H_0} A^h (x) W_OV^h)"
                                 "(Id ⊗ W_E)")
    last = chains[0]["steps"][-1]["expr"]["text"]
    assert "Σ_{h1∈H_1} Σ_{h0∈H_0} A^{h1} A^{h0} ⊗ W_U W_OV^{h1} W_OV^{h0} W_E" in last
    assert last.count("⊗") == 4


def test_an_operator_applied_to_an_activation_is_a_step(capsys):
    code, out, _ = run(capsys, "expand", "(A ⊗ W_OV) x")
    assert code == 0 and "[An operator applied to an activation: (A ⊗ W)·x = A x Wᵀ" in out
    assert out.rstrip().endswith("(A ⊗ W_OV) x = A x W_OVᵀ") and "already expanded" not in out
    chains = expand_json(capsys, "(A ⊗ W_O W_V)·x", "--fold", "W_OV")
    steps = chains[-1]["steps"]
    assert [s["rule"] for s in steps] == ["action", "fold"]
    assert "(W_O W_V)ᵀ = W_Vᵀ W_Oᵀ" in json.dumps(steps[0], ensure_ascii=False)
    assert steps[0]["expr"]["text"] == "A x W_Vᵀ W_Oᵀ" and steps[1]["expr"]["text"] == "A x W_OVᵀ"


def test_typed_transposes_and_like_terms_are_steps(capsys):
    steps = expand_json(capsys, "(W_O W_V)^T ⊗ A", "--fold", "W_OV")[0]["steps"]
    assert [s["rule"] for s in steps] == ["transpose", "fold"]
    assert steps[0]["expr"]["text"] == "W_Vᵀ W_Oᵀ ⊗ A" and steps[1]["expr"]["text"] == "W_OVᵀ ⊗ A"
    steps = expand_json(capsys, "A ⊗ W_E + A ⊗ W_E")[0]["steps"]
    assert [s["rule"] for s in steps] == ["given", "collect"] and steps[-1]["expr"]["text"] == "2·A ⊗ W_E"


def test_fold_folds_w_qk_too(capsys):
    steps = expand_json(capsys, "(Id ⊗ W_Q^h)^T (Id ⊗ W_K^h)", "--fold", "W_QK")[0]["steps"]
    assert steps[-1]["rule"] == "fold" and steps[-1]["expr"]["text"] == "Id ⊗ W_QK^{h}"


def test_index_from_sets_what_h_l_means(capsys):
    zero = expand_json(capsys, "Σ_{h∈H_1} A^h ⊗ W_OV^h")[0]["steps"][0]["expr"]["text"]
    assert zero == "Σ_{h1∈H_1} A^{h1} ⊗ W_OV^{h1}"  # 0-based: the second layer
    one = commands.expansion("Σ_{h∈H_1} A^h ⊗ W_OV^h", index_from=1)
    assert one.chains[0].sums[0].index == "h0"  # the paper's H_1 is the first layer
    two_layers = "(Id ⊗ W_U)(Id + Σ_{h∈H_2} A^h ⊗ W_OV^h)(Id + Σ_{h∈H_1} A^h ⊗ W_OV^h)(Id ⊗ W_E)"
    code, out, _ = run(capsys, "expand", two_layers, "--index-from", "1")
    assert code == 0  # read and printed in the paper's numbering alike
    assert out.rstrip().endswith("Σ_{h2∈H_2} Σ_{h1∈H_1} A^{h2} A^{h1} ⊗ W_U W_OV^{h2} W_OV^{h1} W_E")


def test_derive_numbers_layers_from_one_on_request(capsys):
    _, zero, _ = run(capsys, "derive", "two-layer-logits")
    code, one, _ = run(capsys, "derive", "two-layer-logits", "--index-from", "1")
    assert code == 0
    assert "Σ_{h1∈H_1} Σ_{h0∈H_0} A^{h1} A^{h0}" in zero and "H_2" not in zero
    assert "Σ_{h2∈H_2} Σ_{h1∈H_1} A^{h2} A^{h1}" in one and "H_0" not in one.split("[Definition")[1]
    code, concrete, _ = run(capsys, "derive", "two-layer-logits", "--heads", "1", "--concrete", "--index-from", "1")
    chains = concrete.split("[Definition", 1)[1]  # the notes may name both numberings
    assert code == 0 and "A^{L2H0} A^{L1H0}" in chains and "L0H0" not in chains
    with pytest.raises(SystemExit) as info:
        main(["derive", "two-layer-logits", "--index-from", "2"])
    assert info.value.code == 2 and "invalid choice: 2" in capsys.readouterr().err


def test_a_closed_pipe_ends_quietly():
    for argv in (["derive", "two-layer-qk", "--format", "json"], ["expand", "(Id ⊗ W_U)(Id + A ⊗ W_OV)(Id ⊗ W_E)"]):
        read_end, write_end = os.pipe()
        os.close(read_end)  # the reader is gone before anything is written, as after `| head -c 100`
        try:
            done = subprocess.run([sys.executable, "-m", "derivations.cli", *argv], stdout=write_end,
                                  stderr=subprocess.PIPE, timeout=120)
        finally:
            os.close(write_end)
        assert done.returncode in (0, 141) and done.stderr == b"", done.stderr.decode()


def test_latex_of_a_hostile_expression_is_escaped(capsys):
    code, out, _ = run(capsys, "expand", r"A^{\input\jobname %} ⊗ W_OV^{h}", "--format", "latex")
    assert code == 0 and r"\input" not in out and r"\jobname" not in out
    assert r"\mathrm{\backslash{}input\backslash{}jobname\ \%}" in out  # the index, escaped by the printer


# -- the installed console script -----------------------------------------------------------


def installed_script() -> str:
    script = Path(sys.executable).with_name("tcircuits")
    if script.exists():
        return str(script)
    found = shutil.which("tcircuits")
    if found is None:
        pytest.skip("the tcircuits console script is not installed (pip install -e .)")
    return found


def test_the_installed_script_derives_and_fails_cleanly():
    script = installed_script()
    env = {**os.environ, "PYTHONIOENCODING": "utf-8"}
    ok = subprocess.run([script, "derive", "zero-layer"], capture_output=True, text=True, env=env, timeout=120)
    assert ok.returncode == 0 and "T = (Id ⊗ W_U)" in ok.stdout and "= Id ⊗ W_U W_E" in ok.stdout
    bad = subprocess.run([script, "derive", "zero-layr"], capture_output=True, text=True, env=env, timeout=120)
    assert bad.returncode == 2 and "did you mean 'zero-layer'" in bad.stderr and "Traceback" not in bad.stderr
