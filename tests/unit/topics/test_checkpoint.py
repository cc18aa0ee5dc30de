import random

import numpy as np
import pytest
import torch
from torch import nn

from helpers.checkpoint import (
    load_checkpoint,
    read_checkpoint,
    rng_state,
    save_checkpoint,
    set_rng_state,
    unwrap,
)
from helpers.models import MLP


def trained(seed=0, steps=2, scaler_scale=2.0**10):
    torch.manual_seed(seed)
    model = MLP(8, 16, 2, 3)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    scaler = torch.amp.GradScaler("cpu", init_scale=scaler_scale)
    for _ in range(steps):
        loss = model(torch.randn(4, 8)).square().mean()
        optimizer.zero_grad()
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
    return model, optimizer, scaler


def draws():
    return random.random(), float(np.random.rand()), torch.rand(1).item()


def test_round_trip_restores_everything_and_continues_identically(tmp_path):
    model, optimizer, scaler = trained()
    path = save_checkpoint(tmp_path / "run" / "ckpt.pt", model=model, optimizer=optimizer,
                           scaler=scaler, epoch=3, step=7, extra={"loss_sum": 1.5, "n": [1, 2]})
    expected = draws()
    x = torch.randn(4, 8)

    model2, optimizer2, scaler2 = trained(seed=1, steps=1, scaler_scale=1.0)
    info = load_checkpoint(path, model=model2, optimizer=optimizer2, scaler=scaler2)
    assert (info.epoch, info.step, info.extra) == (3, 7, {"loss_sum": 1.5, "n": [1, 2]})
    assert info.restored[:3] == ["model", "optimizer", "scaler"]
    assert "rng:torch" in info.restored and "epoch 3, step 7" in repr(info)
    assert draws() == expected  # RNG streams continue where they were saved
    assert scaler2.get_scale() == scaler.get_scale()
    for a, b in zip(model.parameters(), model2.parameters(), strict=True):
        assert torch.equal(a, b)
    # one more identical step from both: optimizer state (momentum) was restored too
    for m, opt in ((model, optimizer), (model2, optimizer2)):
        opt.zero_grad()
        m(x).square().mean().backward()
        opt.step()
    for a, b in zip(model.parameters(), model2.parameters(), strict=True):
        assert torch.equal(a, b)


def test_wrapped_models_are_saved_unwrapped_and_load_into_either(tmp_path):
    model, _, _ = trained()
    wrapped = nn.DataParallel(model)
    assert unwrap(wrapped) is model
    assert next(iter(wrapped.state_dict())).startswith("module.")
    path = save_checkpoint(tmp_path / "c.pt", model=wrapped, epoch=1)
    keys = list(read_checkpoint(path)["model"])
    assert keys and not any(k.startswith("module.") for k in keys)
    plain = MLP(8, 16, 2, 3)
    load_checkpoint(path, model=plain)
    load_checkpoint(path, model=nn.DataParallel(MLP(8, 16, 2, 3)))


def test_a_foreign_module_prefixed_state_dict_still_loads(tmp_path):
    model, _, _ = trained()
    path = save_checkpoint(tmp_path / "c.pt", model=model, epoch=0)
    state = read_checkpoint(path)
    state["model"] = nn.DataParallel(model).state_dict()  # as saved by other code
    torch.save(state, path)
    fresh = MLP(8, 16, 2, 3)
    load_checkpoint(path, model=fresh)
    assert torch.equal(fresh.head.weight, model.head.weight)


def test_map_location_and_rng_off(tmp_path):
    model, _, _ = trained()
    path = save_checkpoint(tmp_path / "c.pt", model=model, epoch=0)
    info = load_checkpoint(path, model=MLP(8, 16, 2, 3), map_location=torch.device("cpu"),
                           restore_rng=False)
    assert info.restored == ["model"]


def test_saving_is_atomic(tmp_path, monkeypatch):
    model, _, _ = trained()
    path = save_checkpoint(tmp_path / "c.pt", model=model, epoch=1)
    before = path.read_bytes()

    def broken_save(obj, f, *args, **kwargs):
        with open(f, "wb") as out:
            out.write(b"half a file")
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", broken_save)
    with pytest.raises(OSError, match="disk full"):
        save_checkpoint(path, model=model, epoch=2)
    assert path.read_bytes() == before  # the old checkpoint survives
    assert [p.name for p in tmp_path.iterdir()] == ["c.pt"]  # no temporary file left


def test_rng_state_round_trip():
    state = rng_state()
    first = draws()
    assert set_rng_state(state)[:3] == ["python", "numpy", "torch"]
    assert draws() == first


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"model": "model"}, TypeError, "model"),
        ({"optimizer": "sgd"}, TypeError, "optimizer"),
        ({"scaler": 1.0}, TypeError, "scaler"),
        ({"epoch": -1}, ValueError, "epoch"),
        ({"epoch": 1.0}, TypeError, "epoch"),
        ({"step": None}, TypeError, "step"),
        ({"extra": [1]}, TypeError, "extra"),
        ({"extra": {"f": print}}, TypeError, r"extra\['f'\]"),
        ({"extra": {1: 2}}, TypeError, "non-string key"),
        ({"extra": {"a": np.zeros(2)}}, TypeError, "ndarray"),
    ],
)
def test_save_rejects_bad_input(tmp_path, kwargs, error, match):
    args = {"model": MLP(8, 16, 2, 3), "epoch": 0, **kwargs}
    with pytest.raises(error, match=match):
        save_checkpoint(tmp_path / "c.pt", **args)
    with pytest.raises(TypeError, match="path"):
        save_checkpoint(3, model=MLP(8, 16, 2, 3), epoch=0)


def test_load_rejects_bad_input(tmp_path):
    with pytest.raises(FileNotFoundError, match="no checkpoint"):
        load_checkpoint(tmp_path / "missing.pt", model=MLP())
    torch.save({"weights": 1}, tmp_path / "other.pt")
    with pytest.raises(ValueError, match="not a checkpoint"):
        read_checkpoint(tmp_path / "other.pt")
    model, optimizer, _ = trained()
    path = save_checkpoint(tmp_path / "c.pt", model=model, epoch=0)
    with pytest.raises(ValueError, match="no optimizer state"):
        load_checkpoint(path, model=MLP(8, 16, 2, 3), optimizer=optimizer)
    with pytest.raises(RuntimeError, match="size mismatch"):
        load_checkpoint(path, model=MLP(8, 32, 2, 3))
    with pytest.raises(TypeError, match="restore_rng"):
        load_checkpoint(path, model=MLP(8, 16, 2, 3), restore_rng="yes")
    with pytest.raises(ValueError, match="rng_state"):
        set_rng_state({"python": None})
