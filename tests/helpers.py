"""Helpers shared by the tests: numeric bindings, numeric equality, standard expressions, hand-built models."""

from __future__ import annotations

import os
import re
import signal
import time
from contextlib import contextmanager
from typing import Iterable, Mapping

import numpy as np
import sympy as sp
import torch

from derivations.architecture import Architecture
from numeric_check.model.circuit_model import CircuitModel
from numeric_check.model.config import ModelConfig
from tensoralg import Add, Atom, Expr, Product, TensorSum, add, atom, identity, term, to_numpy

# Small numeric sizes of the symbolic dimensions; all different, so a transposed or
# misplaced factor fails loudly in numpy as well.
SIZES = {"n_ctx": 3, "d_model": 4, "d_head": 2, "d_vocab": 5, "d_mlp": 6}
DEFAULT_SIZE = 3  # for a dimension not in SIZES (declared atoms)

# Derived atoms bound consistently with their definitions: name -> (left, right, transpose left)
_DERIVED = {"W_OV": ("W_O", "W_V", False), "W_QK": ("W_Q", "W_K", True)}


def base_atoms(*exprs: Expr | Atom | Iterable) -> set[Atom]:
    """The untransposed atoms of expressions (without expanding lazy products)."""
    found: set[Atom] = set()
    for e in exprs:
        if isinstance(e, Atom):
            found.add(e.base)
        elif isinstance(e, Product):
            found |= base_atoms(*e.factors)
        elif isinstance(e, Add):
            found |= base_atoms(*e.parts)
        elif isinstance(e, TensorSum):
            found |= {a.base for t in e for w in t.words for a in w}
        else:  # a word
            found |= {a.base for a in e}
    return found


def size_of(dim, sizes: Mapping[str, int] = SIZES) -> int:
    """The numeric size of a symbolic dimension (``d_model`` -> 4)."""
    dim = sp.sympify(dim)
    value = dim.subs({s: sizes.get(s.name, DEFAULT_SIZE) for s in dim.free_symbols})
    return int(value)


def random_bindings(*exprs, seed: int = 0, sizes: Mapping[str, int] = SIZES) -> dict[str, np.ndarray]:
    """Random arrays for every atom of ``exprs``, keyed by label (``"W_OV^{h1}"``).

    Entries are normal with variance ``1/cols`` (long words stay of order one); symmetric
    atoms are symmetric; ``W_OV^{i} = W_O^{i} W_V^{i}`` and ``W_QK^{i} = W_Q^{i}ᵀ W_K^{i}``
    hold for every index, so folding and unfolding definitions keep the numbers.
    """
    rng = np.random.default_rng(seed)
    wanted = base_atoms(*exprs)
    for a in list(wanted):
        if a.name in _DERIVED:
            left, right, _ = _DERIVED[a.name]
            wanted |= {atom(left, a.index), atom(right, a.index)}
    values: dict[str, np.ndarray] = {}
    for a in sorted(wanted, key=lambda a: a.key):
        if a.name in _DERIVED:
            continue
        rows, cols = size_of(a.rows, sizes), size_of(a.cols, sizes)
        value = rng.normal(size=(rows, cols)) / np.sqrt(cols)
        values[a.label] = (value + value.T) / 2 if a.symmetric else value
    for a in wanted:
        if a.name in _DERIVED:
            left, right, transpose_left = _DERIVED[a.name]
            lv = values[atom(left, a.index).label]
            values[a.label] = (lv.T if transpose_left else lv) @ values[atom(right, a.index).label]
    return values


def slot_sizes_of(*exprs: Expr, sizes: Mapping[str, int] = SIZES, default: int = 2) -> dict[int, int]:
    """Slot sizes for slots that hold only ``Id``, read from whichever expression knows the slot."""
    n = exprs[0].n_slots
    out = {}
    for i in range(n):
        shapes = [e.slot_shapes[i] for e in exprs if e.slot_shapes[i] is not None]
        out[i] = size_of(shapes[0][0], sizes) if shapes else default
    return out


def numeric(expr: Expr, bindings: Mapping, sizes: Mapping[str, int] = SIZES, slot_sizes=None) -> np.ndarray:
    """The dense operator of ``expr`` with the test sizes."""
    return to_numpy(expr, bindings, dims=dict(sizes), slot_sizes=slot_sizes or slot_sizes_of(expr, sizes=sizes))


def assert_numerically_equal(expr1: Expr, expr2: Expr, seed: int = 0, bindings: Mapping | None = None,
                             sizes: Mapping[str, int] = SIZES, rtol: float = 1e-9, atol: float = 1e-9) -> None:
    """Both expressions give the same dense operator on random bindings of their atoms."""
    bindings = bindings if bindings is not None else random_bindings(expr1, expr2, seed=seed, sizes=sizes)
    slots = slot_sizes_of(expr1, expr2, sizes=sizes)
    left = to_numpy(expr1, bindings, dims=dict(sizes), slot_sizes=slots)
    right = to_numpy(expr2, bindings, dims=dict(sizes), slot_sizes=slots)
    np.testing.assert_allclose(left, right, rtol=rtol, atol=atol, err_msg=f"\n{expr1!r}\n!=\n{expr2!r}")


def head(layer: int, h: int) -> str:
    """The head label used everywhere: ``L{l}H{h}``."""
    return f"L{layer}H{h}"


def transformer_product(n_layers: int, n_heads: int) -> Product:
    """``(Id⊗W_U) · Π_{l<L} (Id + Σ_{h<H} A^{l,h} ⊗ W_OV^{l,h}) · (Id⊗W_E)``, last layer leftmost."""
    layers = [
        identity(2) + add(*[term(atom("A", head(l, h)), atom("W_OV", head(l, h))) for h in range(n_heads)])
        for l in range(n_layers)
    ]
    return Product([term(None, atom("W_U")), *reversed(layers), term(None, atom("W_E"))])


# --- hand-built models ----------------------------------------------------------------------
# Circuits set by hand, so a test knows which head does what: induction (a previous-token head
# in layer 0, an induction head in layer 1), with or without noise, and a copying control.

NOISY_VOCAB, NOISY_CONTEXT = 20, 16  # sizes of noisy_induction_model


def noisy_induction_model(positional: str = "qk_only", beta: float = 40.0, noise: float = 0.05, seed: int = 0) -> CircuitModel:
    """2 layers x 2 heads: L0H0 a previous-token head, L1H0 an induction head, the others small noise.

    The residual stream has three blocks: the token (``W_E``), the previous token (written by
    L0H0) and, for the QK input, the position. L0H0's queries at position i match keys at
    i - 1 and copy their token into the previous-token block; L1H0's query token matches a
    key's previous token and copies the key's token to the logits.
    """
    V, N = NOISY_VOCAB, NOISY_CONTEXT
    d_model = 2 * V + N
    model = CircuitModel.random(
        Architecture(2, 2, positional=positional), d_model=d_model, d_head=max(V, N), d_vocab=V, n_ctx=N, seed=seed, dtype=torch.float64, device="cpu"
    )
    tok, prev, pos = slice(0, V), slice(V, 2 * V), slice(2 * V, d_model)

    def eye(n):
        return torch.eye(n, dtype=torch.float64)

    with torch.no_grad():
        for p in model.parameters():
            p.mul_(noise)
        model.W_E[tok] += eye(V)
        model.W_U[:, tok] += eye(V)
        if model.W_pos is not None:
            model.W_pos[pos] += eye(N)
        a0, a1 = model.blocks[0].attn, model.blocks[1].attn
        for W in (a0.W_Q, a0.W_K, a0.W_V, a0.W_O, a1.W_Q, a1.W_K, a1.W_V, a1.W_O):
            W[0].zero_()
        a0.W_Q[0, :N, pos] = beta * eye(N)  # query at position i -> head direction i
        a0.W_K[0, 1:N, pos][:, : N - 1] = eye(N - 1)  # key at position j -> head direction j + 1
        a0.W_V[0, :V, tok] = eye(V)
        a0.W_O[0, prev, :V] = eye(V)
        a1.W_Q[0, :V, tok] = beta * eye(V)
        a1.W_K[0, :V, prev] = eye(V)
        a1.W_K[0, :V, pos.start] = -1.0  # key 0 has no previous token (L0H0 copies its own there): ignored
        a1.W_V[0, :V, tok] = eye(V)
        a1.W_O[0, tok, :V] = 3 * eye(V)
    return model


def half_working_induction_model():
    """The hand-built induction model with L0H0's positional query switched off from position N/2 on:
    a previous-token head for the first half of the context only (issue 12's shipped model)."""
    N = NOISY_CONTEXT
    model = noisy_induction_model()
    with torch.no_grad():
        model.blocks[0].attn.W_Q[0, N // 2 : N] = 0.0
    return model


def exact_induction_model(d_vocab: int = 48, n_ctx: int = 24, sharp: float = 100.0) -> CircuitModel:
    """Residual = [token | previous token | position]; L0H0 moves the previous token, L1H0 does induction.

    L0H0 attends from position i to i - 1 (positional QK) and writes the token it reads into
    the "previous token" slot; L1H0's query (its token) matches keys whose previous token is
    the same (K-composition with L0H0) and copies the key's token into the logits.
    """
    V, n = d_vocab, n_ctx
    tok, prev, pos = slice(0, V), slice(V, 2 * V), slice(2 * V, 2 * V + n)
    cfg = ModelConfig(Architecture(2, 1, positional="qk_only"), d_model=2 * V + n, d_head=max(V, n), d_vocab=V, n_ctx=n)
    model = CircuitModel(cfg, dtype=torch.float64, device="cpu")
    with torch.no_grad():
        model.W_E[tok] = torch.eye(V)
        model.W_pos[pos] = torch.eye(n)
        model.W_U[:, tok] = 10 * torch.eye(V)
        a0, a1 = model.blocks[0].attn, model.blocks[1].attn
        a0.W_Q[0][:n, pos] = sharp * torch.eye(n)
        a0.W_K[0][:n, pos] = torch.diag(torch.ones(n - 1), -1)  # key position j scores against query j + 1
        a0.W_V[0][:V, tok] = torch.eye(V)
        a0.W_O[0][prev, :V] = torch.eye(V)
        a1.W_Q[0][:V, tok] = sharp * torch.eye(V)
        a1.W_K[0][:V, prev] = torch.eye(V)
        a1.W_K[0][:V, pos.start] = -1.0  # key 0 has no previous token (L0H0 copies its own there): ignored
        a1.W_V[0][:V, tok] = torch.eye(V)
        a1.W_O[0][tok, :V] = 2 * torch.eye(V)
    return model


def copying_model(d_vocab: int = 48, n_ctx: int = 24) -> CircuitModel:
    """A 1-layer control: one head attends uniformly and copies (W_OV = identity)."""
    V = d_vocab
    cfg = ModelConfig(Architecture(1, 1, positional="qk_only"), d_model=V, d_head=V, d_vocab=V, n_ctx=n_ctx)
    model = CircuitModel(cfg, dtype=torch.float64, device="cpu")
    with torch.no_grad():
        model.W_E.copy_(torch.eye(V))
        model.W_U.copy_(torch.eye(V))
        model.W_pos.normal_(generator=torch.Generator().manual_seed(0))
        attn = model.blocks[0].attn
        attn.W_V[0].copy_(torch.eye(V))
        attn.W_O[0].copy_(torch.eye(V))
    return model


def _cpu_seconds() -> float:
    """CPU time of this process (every thread) and of the children it has waited for."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


class quickly:
    """Assert that the block ends within ``seconds`` of wall time (a bound of the "seconds, not hours"
    kind for hostile input, never a timing). ``work=True``: the block only computes (no sleep, network or
    lock to wait on), so the bound takes the lesser of wall and CPU time (this process's threads and the
    children it waited for): a machine shared with other jobs stretches the wall time but not the CPU
    time, torch's threads the CPU time but not the wall time, and work out of bounds exceeds both. A
    block that waits keeps the wall time alone: a wait that never ends costs no CPU."""

    def __init__(self, seconds: float, work: bool = False):
        self.seconds, self.work = seconds, work

    def __enter__(self):
        self.start, self.cpu = time.perf_counter(), _cpu_seconds()

    def __exit__(self, *exc):
        wall, cpu = time.perf_counter() - self.start, _cpu_seconds() - self.cpu
        took = min(wall, cpu) if self.work else wall
        assert took < self.seconds, f"took more than {self.seconds} s ({wall:.1f} s wall, {cpu:.1f} s CPU)"
        return False


def explained(error: Exception) -> str:
    """An error's one line and its detail lines as one text, ``"; "`` between them: what a refusal said in one
    line before its diagnosis moved to ``error.detail`` (a :class:`~numeric_check.SourceMismatch`)."""
    return "; ".join(error.explain().splitlines())


@contextmanager
def refused(error_type: type, match: str):
    """``pytest.raises(error_type)`` whose ``match`` is searched in :func:`explained` (the line and the detail)."""
    import pytest

    with pytest.raises(error_type) as info:
        yield info
    assert re.search(match, explained(info.value)), info.value.explain()


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    """``tcircuits ARGV`` in-process: ``(exit status, stdout, stderr)``; argparse's exit is a status too."""
    from derivations.cli import main

    try:
        code = main(list(argv))
    except SystemExit as exit_:
        code = exit_.code
    out, err = capsys.readouterr()
    return code, out, err


#: the sentences a test tokenizer learns from (a few hundred byte-level BPE tokens)
TOKENIZER_TEXT = (
    "The cat sat on the mat. The dog sat on the log.",
    "When Mary and John went to the store, John gave a drink to Mary.",
    "The capital of France is Paris. The capital of Italy is Rome.",
    "A B C D A B C D: induction heads copy what followed the last time.",
)


def saved_hf_model(folder, family: str = "gpt2", seed: int = 0, n_ctx: int = 32):
    """A user's model as they keep it: a small Hugging Face causal LM (every parameter perturbed
    off its default) and a byte-level BPE tokenizer trained offline, saved with
    ``save_pretrained`` into ``folder``, which is returned."""
    import torch
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator(TOKENIZER_TEXT, trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|endoftext|>", bos_token="<|endoftext|>")
    vocab = len(tokenizer)
    torch.manual_seed(seed)
    if family == "gpt2":
        model = transformers.GPT2LMHeadModel(transformers.GPT2Config(
            n_layer=2, n_embd=16, n_head=4, n_positions=n_ctx, vocab_size=vocab, bos_token_id=0, eos_token_id=0))
    elif family == "llama":
        model = transformers.LlamaForCausalLM(transformers.LlamaConfig(
            vocab_size=vocab, hidden_size=16, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
            intermediate_size=24, max_position_embeddings=n_ctx, bos_token_id=0, eos_token_id=0, pad_token_id=None))
    else:
        raise ValueError(f"saved_hf_model builds gpt2 or llama, not {family!r}")
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():  # uniform draws are the generator's bits scaled, the same on every processor (randn's
        for p in model.parameters():  # vectorised Box-Muller is not: its float32 digits follow the CPU's kernels)
            u = torch.rand(p.shape, generator=gen, dtype=torch.float64) * 2 - 1
            p.copy_(u * (0.5 if p.ndim == 1 else 0.9) + (1.0 if p.ndim == 1 else 0.0))
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def folder_state(folder) -> dict[str, tuple]:
    """What each entry of ``folder`` (recursively) is: kind, link target, bytes — to compare
    before and after a command ("no file changed except the one written")."""
    import os
    import stat
    from pathlib import Path

    state = {}
    for path in sorted(Path(folder).rglob("*")):
        mode = os.lstat(path).st_mode
        if stat.S_ISLNK(mode):
            state[str(path)] = ("link", os.readlink(path))
        elif stat.S_ISREG(mode):
            state[str(path)] = ("file", path.read_bytes())
        else:
            state[str(path)] = ("dir" if stat.S_ISDIR(mode) else "other",)
    return state


class bounded(quickly):
    """:class:`quickly` for a block that only computes (``work=True``), and the Python memory allocated
    within the block (its tracemalloc peak) under ``megabytes``."""

    def __init__(self, seconds: float, megabytes: float):
        super().__init__(seconds, work=True)
        self.megabytes = megabytes

    def __enter__(self):
        import tracemalloc

        tracemalloc.start()
        super().__enter__()

    def __exit__(self, *exc):
        import tracemalloc

        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        assert peak < self.megabytes * 2**20, f"allocated {peak / 2**20:.0f} MiB, more than {self.megabytes}"
        return super().__exit__(*exc)


def terminal_signals() -> None:
    """A child's ``preexec_fn``: Ctrl-C and hang-up act as on a terminal, whatever the test run inherited (a suite
    started with ``nohup`` or in the background of a script ignores them, and a child would inherit that)."""
    for name in ("SIGINT", "SIGHUP"):
        signal.signal(getattr(signal, name), signal.SIG_DFL)
