"""One command-line vocabulary (:mod:`derivations.vocabulary`), held over every subcommand's parser: the same
option names everywhere, no abbreviations, a "did you mean", the old spellings working with one note."""

from __future__ import annotations

import argparse

import pytest

from derivations.cli import build_parser, main
from derivations.vocabulary import terms_count

#: The names --format chooses among, one per format, in every command that has it.
FORMAT_NAMES = ("text", "latex", "markdown", "json", "html")

PARSER = build_parser()
COMMANDS = next(a for a in PARSER._actions if isinstance(a, argparse._SubParsersAction)).choices


def _visible(parser):
    return [a for a in parser._actions if a.help is not argparse.SUPPRESS]


def _options(parser) -> set[str]:
    return {s for a in _visible(parser) for s in a.option_strings}


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_command_spells_its_options_as_the_others_do(name):
    parser = COMMANDS[name]
    options = _options(parser)
    assert parser.allow_abbrev is False
    for old in ("--output", "--json", "--no-progress", "--formats", "--top", "--rows", "--max-rows"):
        assert old not in options, f"{name} shows {old}"  # issue 56: the terms shown are --max-terms everywhere
    for action in _visible(parser):
        if action.dest in ("out", "output"):
            assert action.option_strings == ["-o", "--out"], (name, action.option_strings)
            # issue 56: the old --output works in every command with -o (it worked in 5 of 10)
            assert "--output" in parser._option_string_actions, f"{name} refuses --output"
        if "progress" in (action.help or "") and action.option_strings:
            assert action.option_strings == ["--quiet"], (name, action.option_strings)
        if action.dest == "checkpoint" or action.metavar == "CHECKPOINT":
            assert action.option_strings in (["--checkpoint"], ["--control"]), (name, action.option_strings)
    if "--text" in options:  # a string; its file is --text-file
        assert "--text-file" in options
        text = next(a for a in _visible(parser) if "--text" in a.option_strings)
        assert text.metavar == "TEXT" and text.type is None
    if "--format" in options:  # issue 56: one name per format, text first and the default
        fmt = next(a for a in _visible(parser) if "--format" in a.option_strings)
        assert set(fmt.choices) <= set(FORMAT_NAMES) and fmt.choices[0] == "text", (name, fmt.choices)
        assert fmt.default in ("text", None), (name, fmt.default)
    if "--max-terms" in options:  # issue 56: one meaning, N at most (0: the summary only) or all
        terms = parser._option_string_actions["--max-terms"]
        assert terms.type is terms_count and terms.metavar == "N", name
        assert "all" in terms.help and ("0: the summary only" in terms.help or name in ("derive", "expand", "check")), name
    # issue 56: a vocabulary's size is --d-vocab (TransformerLens's name), its strings --vocab-file; --vocab is old
    assert "--vocab" not in options, name
    for action in _visible(parser):
        if not action.option_strings and action.dest not in ("help",):
            assert action.dest in ("name", "expression", "identity"), f"{name} takes a positional {action.dest}"


#: The commands whose output names heads (L0H3, H_0): each numbers layers as the others do.
NAMING_HEADS = ("analyze", "attention", "attribute", "check", "demo", "derive", "dynamics", "expand", "paper", "verify")


@pytest.mark.parametrize("name", NAMING_HEADS)
def test_every_command_that_names_heads_numbers_layers_from_the_same_default(name):
    action = next(a for a in _visible(COMMANDS[name]) if "--index-from" in a.option_strings)
    assert action.default == 0 and tuple(action.choices) == (0, 1)


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_one_dtype_default_and_one_name_for_a_batch(name):
    for action in _visible(COMMANDS[name]):
        if "--dtype" in action.option_strings:
            assert action.default == "float64", (name, action.default)
        assert "--batch" not in action.option_strings and "--n-sequences" not in action.option_strings, name


def test_the_paper_numbering_renumbers_every_head_label_and_only_those():
    from derivations.vocabulary import renumber

    assert renumber("tok→L0H1→L1H0 | k: L0KV2 (layer 0, L0, AL0H1)", 1) == "tok→L1H1→L2H0 | k: L1KV2 (layer 0, L0, AL0H1)"
    assert renumber("L0H1", 0) == "L0H1"


def test_index_from_one_is_read_back_as_typed(capsys):
    """verify --qk LAYER HEAD is numbered as --index-from says, and so is what it prints: L1H0 in, L1H0 out."""
    code = main(["verify", "--layers", "2", "--heads", "2", "--qk", "2", "0", "--index-from", "1", "--tokens", "1,2,3",
                 "--quiet"])
    out = capsys.readouterr().out
    assert code == 0 and out.startswith("verify the pre-softmax scores of L2H0 ") and "tok→L1H1" in out
    assert main(["verify", "--layers", "2", "--heads", "2", "--qk", "0", "0", "--index-from", "1"]) == 2
    assert "with --index-from 1 the first layer is 1" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["derive", "expand", "check", "verify", "attribute"])
def test_every_command_that_writes_a_file_takes_minus_o(name):
    assert {"-o", "--out"} <= _options(COMMANDS[name])


@pytest.mark.parametrize("argv, dest, value, note", [
    (["verify", "--json"], "format", "json", "--json is an old spelling and goes in a later release; use --format json"),
    (["verify", "--no-progress"], "quiet", True, "use --quiet"),
    (["verify", "--output", "r.txt"], "output", "r.txt", "use -o/--out"),
    (["derive", "--output", "r.tex"], "output", "r.tex", "use -o/--out"),
    (["attention", "--output", "a.html"], "out", "a.html", "use -o/--out"),  # -o is required: either spelling gives it
    (["analyze", "--formats", "png", "-o", "r"], "formats", "png", "use --figure-formats"),
    (["verify", "--batch", "3"], "batch_size", 3, "use --batch-size N"),
    (["demo", "--batch", "3"], "batch_size", 3, "use --batch-size N"),
    (["demo", "--rows", "3"], "rows", 3, "--rows is an old spelling and goes in a later release; use --max-terms N"),
    (["verify", "--max-rows", "3"], "max_rows", 3, "use --max-terms N"),
    (["attribute", "--top", "3", "--target", "4"], "top", 3, "use --max-terms N"),
    (["train-toy", "--vocab", "300", "-o", "m.safetensors"], "vocab", 300, "--vocab is an old spelling and goes in a "
     "later release; use --d-vocab N"),
    (["analyze", "--vocab", "v.json", "-o", "r"], "vocab", "v.json", "use --vocab-file FILE"),
])
def test_an_old_spelling_still_works_and_says_once_what_to_use(argv, dest, value, note, capsys):
    args = build_parser().parse_args(argv + argv[1:2] if argv[1] in ("--json", "--no-progress") else argv)
    got = getattr(args, dest)
    assert (list(map(str, got)) if isinstance(got, list) else str(got) if hasattr(got, "parts") else got) == value
    err = capsys.readouterr().err
    assert note in err and err.count("\n") == 1  # said once, even when given twice


def test_a_positional_checkpoint_still_works_with_a_note(tmp_path, capsys):
    from derivations.vocabulary import checkpoint_of

    args = build_parser().parse_args(["analyze", "m.safetensors", "-o", str(tmp_path / "r")])
    checkpoint_of(args)
    assert str(args.checkpoint) == "m.safetensors"
    assert "a positional CHECKPOINT is an old spelling" in capsys.readouterr().err


@pytest.mark.parametrize("argv, suggestion", [
    (["verfy"], "did you mean 'verify'?"),
    (["derive", "two-layer-logits", "--formt", "html"], "did you mean --format?"),
    (["derive", "two-layer-logits", "--format", "htm"], "did you mean 'html'?"),
    (["verify", "--max-ordr", "1"], "did you mean --max-order?"),
    # issue 56: a mistyped option is why a required one is missing: both said, with the suggestion
    (["attention", "--checkpoint", "m.safetensors", "--ouput", "x.html"],
     "the following arguments are required: -o/--out; unrecognized arguments: --ouput; did you mean -o/--out?"),
    (["derive", "two-layer-logits", "--fo", "html"], "did you mean --force or --format?"),  # a prefix of two: both
    (["verify", "--outpt", "r.txt"], "did you mean -o/--out?"),  # an old spelling: by what it points to
])
def test_a_mistyped_command_option_or_choice_gets_a_suggestion(argv, suggestion, capsys):
    with pytest.raises(SystemExit) as info:
        main(argv)
    err = capsys.readouterr().err
    assert info.value.code == 2 and suggestion in err and err.count("\n") == 1


def test_no_option_is_taken_by_an_abbreviation(capsys):
    with pytest.raises(SystemExit):
        main(["derive", "two-layer-logits", "--form", "html"])
    assert "unrecognized arguments: --form" in capsys.readouterr().err


def test_plain_tcircuits_prints_a_short_usage_and_exits_2(capsys):
    """Issue 56: a bare tcircuits printed 48 lines and exited 0; as git and pip, a usage line, where help is, 2."""
    assert main([]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("usage: tcircuits") and err.count("\n") == 2
    assert "no command given; 'tcircuits --help' lists the commands, 'tcircuits help COMMAND' explains one" in err


def test_version_and_help_command(capsys):
    from derivations.cli import version

    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0 and capsys.readouterr().out == f"tcircuits {version()}\n" and version()[0].isdigit()
    for argv in (["help", "derive"], ["derive", "--help"]):
        with pytest.raises(SystemExit) as info:
            main(argv)
        assert info.value.code == 0
        helped = capsys.readouterr().out
        assert helped.startswith("usage: tcircuits derive")
    with pytest.raises(SystemExit) as info:
        main(["help"])
    assert info.value.code == 0 and "train-toy" in capsys.readouterr().out
    with pytest.raises(SystemExit) as info:
        main(["help", "verfy"])
    assert info.value.code == 2 and "did you mean 'verify'?" in capsys.readouterr().err


def test_a_file_given_as_text_is_read_as_text_with_a_note(tmp_path, capsys, monkeypatch):
    prompt = tmp_path / "prompt.txt"
    prompt.write_text("1 2 3")
    monkeypatch.chdir(tmp_path)
    from pathlib import Path

    shipped = Path(__file__).resolve().parents[1] / "numeric_check" / "data" / "kjv_2l.safetensors"
    assert main(["verify", "--checkpoint", str(shipped), "--text", "prompt.txt", "--max-order", "0", "--quiet"]) == 0
    assert "to read the file, use --text-file prompt.txt" in capsys.readouterr().err


def test_paper_refuses_text_in_one_line_pointing_to_the_file_option(tmp_path, capsys, monkeypatch):
    """Issue 56: --text is text everywhere; paper measures on a whole file, so its --text (once a file) is refused."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a.txt").write_text("words")
    for text, pointer in (("a.txt", "'a.txt' names a file: use --text-file a.txt"), ("hello", "use --text-file FILE")):
        assert main(["paper", "--text", text, "-o", str(tmp_path / "site")]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "paper measures your model on a whole text read from a file, not on --text" in err
        assert err.rstrip().endswith(pointer) and not (tmp_path / "site").exists()


#: The commands that show progress (a bar, or a status line while a model loads or a report is made).
SHOWING_PROGRESS = ("analyze", "attention", "attribute", "dynamics", "paper", "train-toy", "verify")


@pytest.mark.parametrize("name", SHOWING_PROGRESS)
def test_every_command_that_shows_progress_takes_quiet(name):
    """Issue 56: --quiet was missing in analyze, attention and attribute (and verify's status line ignored it)."""
    action = COMMANDS[name]._option_string_actions.get("--quiet")
    assert action is not None and action.dest == "quiet" and action.help is not argparse.SUPPRESS, name


@pytest.mark.parametrize("name, argv", [("verify", ["--layers", "1"]), ("attribute", ["--layers", "1", "--target", "3"]),
                                        ("demo", [])])
def test_max_terms_zero_is_the_summary_only_and_all_is_every_term(name, argv, capsys):
    """Issue 56: --max-terms 0 showed every term in derive and none in demo; now 0 is the summary only and all
    every term wherever terms are listed (derive's old 0 still shows all, with a note)."""
    quiet = ["--quiet"] if name != "demo" else []
    assert main([name, *argv, *quiet, "--max-terms", "0"]) == 0
    summary = capsys.readouterr().out
    assert main([name, *argv, *quiet, "--max-terms", "all"]) == 0
    every = capsys.readouterr().out
    assert len(every.splitlines()) > len(summary.splitlines())
    assert ("tok→L0H0" in every) and ("tok→L0H0" not in summary)


def test_max_terms_in_derive_reads_all_and_its_old_zero(capsys, monkeypatch):
    monkeypatch.setattr("derivations.vocabulary._noted", set())  # the note is said once a process: not yet here
    assert main(["derive", "two-layer-logits", "--max-terms", "all"]) == 0
    every = capsys.readouterr().out
    assert main(["derive", "two-layer-logits", "--max-terms", "0"]) == 0
    out, err = capsys.readouterr()
    assert out == every and "use --max-terms all" in err and err.count("\n") == 1
    assert main(["derive", "two-layer-logits", "--max-terms", "2"]) == 2
    assert "--max-terms 2: a sum keeps its first and last terms" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["derive", "two-layer-logits", "--max-terms", "many"])
    assert "expected a number of terms (0 or more) or 'all', got 'many'" in capsys.readouterr().err
