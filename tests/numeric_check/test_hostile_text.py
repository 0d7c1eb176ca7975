"""Hostile input, round 6: training on a person's text bounded in time and memory and stopped at once by a
signal, and a tokenizer beside a checkpoint that is not the model's (issue 48).

Each case was tried before the change: a 20 MB "word" with no space ran 91 minutes deaf to SIGTERM, a 49 MB
line peaked at 6.5 GB, a tokenizer with ids beyond the model's vocabulary or 13 MB of repeated merges was
read. Bad input: one line, exit 2; a stopping signal: exit 128 + N, nothing written, an existing output whole.
"""

from __future__ import annotations

import json
import os
import random
import signal
import string
import subprocess
import sys
import time
from pathlib import Path

import pytest

from derivations.cli import main
from numeric_check.training import text as T
from tests.helpers import terminal_signals

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
TINY = ["--d-vocab", "300", "--steps", "2", "--layers", "1", "--heads", "2", "--d-model", "16", "--d-head", "8",
        "--n-ctx", "32", "--seg-min", "2", "--seg-max", "8", "--batch-size", "4", "--quiet", "--threads", "1"]


def _prose(n_lines: int, seed: int = 0) -> str:
    rng = random.Random(seed)
    words = [''.join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(2, 9))) for _ in range(3000)]
    return "\n".join(" ".join(rng.choice(words) for _ in range(rng.randint(5, 20))) for _ in range(n_lines)) + "\n"


# --- the text: bounded ----------------------------------------------------------------------------------


def test_a_line_longer_than_is_read_is_one_line_at_once(tmp_path, capsys):
    path = tmp_path / "one-line.txt"
    path.write_text(_prose(2100) + "x" * (T.MAX_LINE_BYTES + 1) + "\n")
    start = time.monotonic()
    assert main(["train-toy", "--text-file", str(path), *TINY, "--out", str(tmp_path / "m.safetensors")]) == 2
    err = capsys.readouterr().err
    assert time.monotonic() - start < 20
    assert f"has a line of {T.MAX_LINE_BYTES + 1:,} bytes (line 2,101)" in err and "fold -s" in err and err.count("\n") == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["one-line.txt"]


def test_a_pretoken_longer_than_the_budget_is_cut_in_training_and_in_encoding():
    pieces = [p for p, _ in T.pre_tokenizer().pre_tokenize_str("a" * 1000 + " b")]
    assert max(map(len, pieces)) <= T.MAX_PRETOKEN and "".join(pieces).endswith("Ġb")
    ordinary = "In the beginning God created the heaven and the earth."
    from tokenizers import pre_tokenizers
    assert T.pre_tokenizer().pre_tokenize_str(ordinary) == pre_tokenizers.ByteLevel(add_prefix_space=False).pre_tokenize_str(ordinary)


def test_the_tokenizer_trains_on_a_bounded_sample_spread_over_the_text():
    text = "".join(f"{i:07d} words of line {i}\n" for i in range(400_000))  # 10 MB
    sample = T.tokenizer_sample(text)
    assert len(sample) <= T.TOKENIZER_SAMPLE_CHARS
    numbers = [int(line[:7]) for line in sample.splitlines() if line[:7].isdigit()]
    assert numbers[0] == 0 and max(numbers) > 390_000  # from the start to the end
    assert T.tokenizer_sample(text[:1000]) == text[:1000]


def test_encoding_in_chunks_gives_the_tokens_of_the_whole(monkeypatch):
    text = _prose(300)
    tokenizer = T.train_tokenizer(text, 300)
    whole = T.encode_compact(tokenizer, text)
    monkeypatch.setattr(T, "ENCODE_CHUNK_CHARS", 50)
    assert whole.dtype.is_signed is False and bool((T.encode_compact(tokenizer, text) == whole).all())
    assert T.encode(tokenizer, text).tolist() == whole.tolist()


#: The command in a child process; at its end it prints on standard error the largest resident size (MiB) it and
#: the processes it waited for (the tokenizer's) reached.
COMMAND = """import resource, sys
from derivations.cli import main
code = main()
peak = max(resource.getrusage(w).ru_maxrss for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
print(f"peak {peak / 1024:.0f}", file=sys.stderr)
raise SystemExit(code)
"""


def _run(argv, **kwargs) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", COMMAND, *argv],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=terminal_signals,
                            env={**os.environ, "PYTHONPATH": str(ROOT)}, **kwargs)


def test_a_large_text_of_long_words_trains_in_bounded_time_and_memory(tmp_path):
    """16 MB, 2 MB of it lines of random letters with no space (pretokens of 100,000 characters): finishes
    within a minute, under 1 GB beyond what the command holds before it reads the text."""
    rng = random.Random(1)
    letters = "".join(rng.choice(string.ascii_letters) for _ in range(2_000_000))
    path = tmp_path / "big.txt"
    path.write_text(_prose(2100) + "\n".join(letters[i:i + 100_000] for i in range(0, len(letters), 100_000)) + "\n"
                    + _prose(40_000, seed=2))
    start = time.monotonic()
    child = _run(["train-toy", "--text-file", str(path), *TINY, "--out", str(tmp_path / "big.safetensors")])
    out, err = child.communicate(timeout=120)
    seconds = time.monotonic() - start
    assert child.returncode == 0, err
    peak = float(err.rsplit("peak ", 1)[1])  # MiB: the command and its tokenizer's process
    assert seconds < 60 and peak < 1024 + 600, (seconds, peak)  # 600 MiB: torch and the command before the text


# --- stopping signals ----------------------------------------------------------------------------------


def _grandchild_started(pid: int, timeout: float = 60) -> bool:
    """Whether ``pid`` has started a child process (the tokenizer's) within ``timeout`` seconds."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        except OSError:
            return False
        if children:
            return True
        time.sleep(0.02)
    return False


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="needs /proc to see the tokenizer's process")
@pytest.mark.parametrize("signum, code, group", [(signal.SIGTERM, 143, False), (signal.SIGINT, 130, True),
                                                 (signal.SIGHUP, 129, False)])
def test_a_stopping_signal_during_tokenizer_training_stops_within_two_seconds(tmp_path, signum, code, group):
    path = tmp_path / "text.txt"
    path.write_text(_prose(60_000))  # the tokenizer's training takes seconds
    out = tmp_path / "m.safetensors"
    out.write_bytes(b"an existing checkpoint")
    child = _run(["train-toy", "--text-file", str(path), *TINY, "--d-vocab", "8000", "--force", "--out", str(out)],
                 start_new_session=group)
    assert _grandchild_started(child.pid), child.communicate()
    time.sleep(0.3)
    start = time.monotonic()
    (os.killpg(child.pid, signum) if group else child.send_signal(signum))
    _, err = child.communicate(timeout=30)
    bound = 2.0 * max(1.0, os.getloadavg()[0] / (os.cpu_count() or 1))  # 2 s on a machine not oversubscribed
    assert time.monotonic() - start < bound and child.returncode == code, (child.returncode, err, bound)
    assert out.read_bytes() == b"an existing checkpoint"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.safetensors", "text.txt"]


# --- a tokenizer beside a checkpoint -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    folder = tmp_path_factory.mktemp("trained")
    text = folder / "text.txt"
    text.write_text(_prose(2200))
    out = folder / "m.safetensors"
    assert main(["train-toy", "--text-file", str(text), *TINY, "--snapshots", "0", "--out", str(out)]) == 0
    return out


def _tampered(original: dict, case: str):
    t = json.loads(json.dumps(original))
    if case == "not JSON":
        return "{not json"
    if case == "deep":
        return "[" * 10_000 + "]" * 10_000
    if case == "not a BPE":
        t["model"]["type"] = "WordPiece"
    elif case == "repeated merges":
        t["model"]["merges"] = t["model"]["merges"] * 50
    elif case == "another model's ids":
        first = next(iter(t["model"]["vocab"]))
        t["model"]["vocab"][first] = 5000
    elif case == "vocab of strings":
        t["model"]["vocab"] = {k: str(v) for k, v in t["model"]["vocab"].items()}
    elif case == "too large":
        return json.dumps(t) + " " * 11_000_000
    return json.dumps(t)


@pytest.mark.parametrize("case, message", [
    ("not JSON", "is not usable JSON"), ("deep", "nests 10,000 deep"), ("not a BPE", "is not a byte-level BPE"),
    ("repeated merges", "merges for 300 tokens"), ("another model's ids", "belongs to another model"),
    ("vocab of strings", "is not a byte-level BPE"), ("too large", "more than the 10,000,000 read"),
])
def test_a_tokenizer_that_is_not_the_models_is_one_line(trained, tmp_path, capsys, case, message):
    for suffix in (".safetensors", ".json"):
        (tmp_path / f"m{suffix}").write_bytes(trained.with_suffix(suffix).read_bytes())
    original = json.loads(trained.with_suffix(".tokenizer.json").read_text())
    (tmp_path / "m.tokenizer.json").write_text(_tampered(original, case))
    code = main(["verify", "--checkpoint", str(tmp_path / "m.safetensors"), "--text", "line of words", "--max-order", "1"])
    err = capsys.readouterr().err
    assert code == 2 and message in err and err.count("\n") == 1 and "Traceback" not in err, err
