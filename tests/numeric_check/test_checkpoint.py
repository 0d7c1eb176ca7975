"""Checkpoints: round trips, torch files with weights_only, and a clear CheckpointError for every bad file."""

import json

import pytest
import torch
from safetensors.torch import save_file

from derivations.architecture import Architecture
from numeric_check.model.checkpoint import FORMAT, load_checkpoint, save_checkpoint
from numeric_check.errors import CheckpointError, UncheckedCheckpoint, WeightError
from numeric_check.model.circuit_model import CircuitModel

torch.set_num_threads(1)

ARCH = Architecture(2, (1, 3), positional="qk_only", layer_norm=True, biases=True, mlp=True)


def make(dtype=torch.float64, arch=ARCH):
    d_mlp = 10 if arch.mlp else None
    return CircuitModel.random(arch, d_model=8, d_head=3, d_vocab=13, n_ctx=5, d_mlp=d_mlp, act_fn="relu", seed=2, dtype=dtype, device="cpu")


def assert_same(a, b):
    assert a.cfg == b.cfg
    assert a.state_dict().keys() == b.state_dict().keys()
    for key, value in a.state_dict().items():
        assert torch.equal(value, b.state_dict()[key]), key


@pytest.fixture
def saved(tmp_path):
    model = make()
    path = tmp_path / "model.safetensors"
    save_checkpoint(model, path)
    return model, path


def test_round_trip_and_methods(saved, tmp_path):
    model, path = saved
    loaded = load_checkpoint(path, device="cpu")
    assert_same(model, loaded)
    assert loaded.dtype == torch.float64 and loaded.device.type == "cpu"
    toks = torch.tensor([[0, 4, 12, 3, 1]])
    assert torch.equal(loaded(toks), model(toks))
    save_checkpoint(model, tmp_path / "again.safetensors")
    assert_same(model, load_checkpoint(tmp_path / "again.safetensors", device="cpu"))
    assert load_checkpoint(str(path), dtype="float32", device="cpu").dtype == torch.float32


def test_round_trip_without_optional_weights(tmp_path):
    model = make(arch=Architecture(1, 2), dtype=torch.float32)
    save_checkpoint(model, tmp_path / "bare")
    loaded = load_checkpoint(tmp_path / "bare", device="cpu")
    assert_same(model, loaded)
    assert loaded.W_pos is None and loaded.b_U is None and loaded.dtype == torch.float32


def test_metadata_holds_config_and_version(saved):
    from safetensors import safe_open

    model, path = saved
    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata()
    assert meta["format"] == FORMAT and meta["format_version"] == "1"
    assert json.loads(meta["config"]) == model.cfg.to_dict()


def test_torch_file_loads_with_weights_only(tmp_path):
    model = make()
    path = tmp_path / "model.pt"
    torch.save({"config": model.cfg.to_dict(), "state_dict": model.state_dict()}, path)
    assert_same(model, load_checkpoint(path, device="cpu"))


class Payload:
    def __reduce__(self):
        return (print, ("unpickled!",))


def test_torch_file_with_objects_is_refused(tmp_path, capsys):
    path = tmp_path / "evil.pth"
    torch.save({"config": {}, "state_dict": {}, "x": Payload()}, path)
    with pytest.raises(CheckpointError, match=r"evil.pth holds the Python object print, not only tensors .* refusing to unpickle") as info:
        load_checkpoint(path, device="cpu")
    assert "unpickled!" not in capsys.readouterr().out
    assert "weights_only` set to `False" not in str(info.value)  # torch's advice to unpickle is not passed on


def test_a_torch_file_that_is_not_a_pickle_is_called_corrupt(tmp_path):
    path = tmp_path / "noise.pt"
    path.write_bytes(b"garbage that is no pickle")
    with pytest.raises(CheckpointError, match=r"noise.pt is corrupt or not a torch checkpoint \(") as info:
        load_checkpoint(path, device="cpu")
    assert "weights_only" not in str(info.value)


def test_torch_file_wrong_layout(tmp_path):
    path = tmp_path / "weights.pt"
    torch.save(make().state_dict(), path)
    with pytest.raises(CheckpointError, match=r"must be a dict with 'config' and 'state_dict'"):
        load_checkpoint(path, device="cpu")


def test_nonexistent_path(tmp_path):
    missing = tmp_path / "nope.safetensors"
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(missing, device="cpu")
    assert str(info.value) == f"checkpoint {missing} does not exist"
    with pytest.raises(CheckpointError, match="is not a file"):
        load_checkpoint(tmp_path, device="cpu")


def test_corrupt_and_truncated_files(saved, tmp_path):
    _, path = saved
    garbage = tmp_path / "garbage.safetensors"
    garbage.write_bytes(b"this is not a checkpoint at all")
    with pytest.raises(CheckpointError, match=r"garbage.safetensors is corrupt or truncated"):
        load_checkpoint(garbage, device="cpu")
    truncated = tmp_path / "truncated.safetensors"
    truncated.write_bytes(path.read_bytes()[:-40])
    with pytest.raises(CheckpointError, match=r"truncated.safetensors is corrupt or truncated"):
        load_checkpoint(truncated, device="cpu")
    torch_truncated = tmp_path / "cut.pt"
    torch.save({"config": {}, "state_dict": {}}, torch_truncated)
    torch_truncated.write_bytes(torch_truncated.read_bytes()[:50])
    with pytest.raises(CheckpointError, match=r"cut.pt is corrupt or truncated"):
        load_checkpoint(torch_truncated, device="cpu")


def _rewrite(path, tensors, **metadata):
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(path), metadata=metadata)


def _meta(model, **overrides):
    return {"format": FORMAT, "format_version": "1", "config": json.dumps(model.cfg.to_dict()), **overrides}


def test_missing_keys_wrong_shapes_and_nan(tmp_path):
    model = make()
    tensors = dict(model.state_dict())
    path = tmp_path / "bad.safetensors"
    _rewrite(path, {k: v for k, v in tensors.items() if k != "blocks.1.attn.W_Q"}, **_meta(model))
    with pytest.raises(CheckpointError, match=r"bad.safetensors does not match its config .*missing \['blocks.1.attn.W_Q'\]"):
        load_checkpoint(path, device="cpu")
    _rewrite(path, {**tensors, "blocks.0.attn.W_K": torch.zeros(1, 3, 9, dtype=torch.float64)}, **_meta(model))
    with pytest.raises(CheckpointError, match=r"blocks.0.attn.W_K has shape \(1, 3, 9\), expected \(1, 3, 8\)"):
        load_checkpoint(path, device="cpu")
    nan = tensors["W_U"].clone()
    nan[2, 3] = float("nan")
    _rewrite(path, {**tensors, "W_U": nan}, **_meta(model))
    with pytest.raises(CheckpointError, match=r"bad.safetensors is unusable: parameter W_U .* has 1 NaN"), \
            pytest.warns(UncheckedCheckpoint):  # written without a content hash
        load_checkpoint(path, device="cpu")


def test_version_format_and_config_problems(tmp_path):
    model = make()
    tensors = dict(model.state_dict())
    path = tmp_path / "meta.safetensors"
    _rewrite(path, tensors, **_meta(model, format_version="99"))
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(path, device="cpu")
    assert str(info.value) == f"checkpoint {path} has format version '99'; this version of tcircuits reads version 1"
    _rewrite(path, tensors)
    with pytest.raises(CheckpointError, match=r"is not a tcircuits CircuitModel checkpoint \(format None"):
        load_checkpoint(path, device="cpu")
    _rewrite(path, tensors, **_meta(model, config="{not json"))
    with pytest.raises(CheckpointError, match=r"no readable model config"):
        load_checkpoint(path, device="cpu")
    _rewrite(path, tensors, **_meta(model, config=json.dumps({**model.cfg.to_dict(), "d_head": -1})))
    with pytest.raises(CheckpointError, match=r"has a bad config: d_head must be an int >= 1, got -1"):
        load_checkpoint(path, device="cpu")


def test_save_refuses_nan_torch_suffix_and_missing_dir(tmp_path):
    model = make()
    with pytest.raises(CheckpointError, match=r"checkpoints are written as safetensors"):
        save_checkpoint(model, tmp_path / "model.pt")
    with pytest.raises(CheckpointError, match=r"directory .*nowhere does not exist"):
        save_checkpoint(model, tmp_path / "nowhere" / "model.safetensors")
    with torch.no_grad():
        model.W_E[0, 0] = float("inf")
    with pytest.raises(WeightError, match=r"parameter W_E"):
        save_checkpoint(model, tmp_path / "inf.safetensors")
    assert not list(tmp_path.iterdir())


def test_unusable_device_is_a_checkpoint_error(saved):
    _, path = saved
    with pytest.raises(CheckpointError, match=r"expected a floating dtype"):
        load_checkpoint(path, dtype=torch.int32, device="cpu")


from hypothesis import given  # noqa: E402

from tests.conftest import HEAVY  # noqa: E402
from tests.strategies import circuit_models  # noqa: E402


@HEAVY
@given(circuit_models())
def test_property_round_trip(tmp_path, model):
    path = tmp_path / "model.safetensors"
    save_checkpoint(model, path)
    assert_same(model, load_checkpoint(path, device="cpu"))
