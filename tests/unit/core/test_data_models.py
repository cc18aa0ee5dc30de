import numpy as np
import pytest
import torch

from helpers.core.data import classification_data, image_data, torch_dataset, torch_loader
from helpers.models import MLP, SmallCNN, count_parameters


def test_classification_data_is_deterministic_and_typed():
    x1, y1 = classification_data(100, 8, 3, seed=5)
    x2, y2 = classification_data(100, 8, 3, seed=5)
    assert x1.dtype == np.float32 and y1.dtype == np.int64
    assert x1.shape == (100, 8) and set(np.unique(y1)) <= {0, 1, 2}
    np.testing.assert_array_equal(x1, x2)
    assert not np.array_equal(x1, classification_data(100, 8, 3, seed=6)[0])


def test_image_data_layouts():
    x, y = image_data(10, channels=3, size=16)
    assert x.shape == (10, 3, 16, 16)
    xl, _ = image_data(10, channels=3, size=16, channels_last=True)
    assert xl.shape == (10, 16, 16, 3)
    np.testing.assert_allclose(xl.transpose(0, 3, 1, 2), x)


@pytest.mark.parametrize(
    "kwargs, match",
    [({"n_samples": 0}, "n_samples"), ({"n_classes": 1}, "n_classes"),
     ({"seed": -1}, "seed"), ({"noise": -1.0}, "noise"), ({"noise": float("nan")}, "noise"),
     ({"n_features": 2.5}, "n_features"), ({"n_samples": 10**9}, "more than")],
)
def test_bad_data_arguments(kwargs, match):
    """A float count is a TypeError (the rule in helpers/core/checks.py), the rest ValueError."""
    error = TypeError if kwargs == {"n_features": 2.5} else ValueError
    with pytest.raises(error, match=match):
        classification_data(**kwargs)


def test_torch_loader_shuffles_the_same_way_every_time():
    x, y = classification_data(64, 4, 2)
    first = [b[1].tolist() for b in torch_loader(x, y, batch_size=16, seed=3)]
    again = [b[1].tolist() for b in torch_loader(x, y, batch_size=16, seed=3)]
    assert first == again
    with pytest.raises(ValueError, match="same length"):
        torch_dataset(x, y[:10])
    with pytest.raises(ValueError, match="batch_size"):
        torch_loader(x, y, batch_size=0)


def test_models_learn_and_count():
    torch.manual_seed(0)
    x, y = classification_data(256, 32, 4)
    model = MLP()
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    xt, yt = torch.as_tensor(x), torch.as_tensor(y)
    losses = []
    for _ in range(30):
        loss = torch.nn.functional.cross_entropy(model(xt), yt)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0]
    expected = (32 * 128 + 128) + 2 * (128 * 128 + 128) + (128 * 4 + 4)
    assert count_parameters(MLP(32, 128, 3, 4)) == expected
    out = SmallCNN()(torch.zeros(2, 3, 32, 32))
    assert out.shape == (2, 10)
    with pytest.raises(ValueError, match="hidden"):
        MLP(hidden=0)
    with pytest.raises(TypeError, match="nn.Module"):
        count_parameters("model")
