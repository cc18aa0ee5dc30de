"""helpers.keras_resnet (helpers/tf/models.py): the Keras track's ResNet, from keras.layers
only, compiled with jit_compile=False; bad arguments are named."""

import pytest

import helpers

keras = pytest.importorskip("keras")


def test_the_default_is_the_32px_cifar_resnet_of_lesson_05():
    model = helpers.keras_resnet()
    assert model.name == "resnet32" and model.count_params() == 176_378
    assert model.input_shape == (None, 32, 32, 3) and model.output_shape == (None, 10)
    assert isinstance(model.optimizer, keras.optimizers.Adam)
    assert model.jit_compile is False
    widths = [layer.filters for layer in model.layers if isinstance(layer, keras.layers.Conv2D)]
    assert sorted(set(widths)) == [16, 32, 64]


def test_shape_width_blocks_classes_optimizer_and_name_are_the_callers():
    sgd = keras.optimizers.SGD(0.1, gradient_accumulation_steps=4)
    model = helpers.keras_resnet(64, 8, (1, 1, 1, 1), classes=100, optimizer=sgd, name="r")
    assert model.name == "r" and model.optimizer is sgd
    assert model.input_shape == (None, 64, 64, 3) and model.output_shape == (None, 100)
    residual_adds = [layer for layer in model.layers if isinstance(layer, keras.layers.Add)]
    assert len(residual_adds) == 4


def test_it_saves_and_loads_as_a_keras_file(tmp_path):
    """measure_keras_memory(isolate=True) sends the model to a fresh process this way."""
    model = helpers.keras_resnet(16, 4, (1, 1))
    model.save(tmp_path / "m.keras")
    again = keras.models.load_model(tmp_path / "m.keras")
    assert again.count_params() == model.count_params()


@pytest.mark.parametrize("kwargs, error, words", [
    ({"image_size": 4}, ValueError, "image_size must be at least 8"),
    ({"image_size": 32.0}, TypeError, "image_size"),
    ({"width": 0}, ValueError, "width"),
    ({"blocks": "222"}, TypeError, "blocks must be a list"),
    ({"blocks": ()}, ValueError, "blocks must give 1 to 8 stages"),
    ({"blocks": (2, 0)}, ValueError, "blocks"),
    ({"classes": None}, TypeError, "classes"),
    ({"optimizer": "adam"}, TypeError, "optimizer must be a new Keras optimizer"),
    ({"name": 3}, TypeError, "name must be a string"),
])
def test_bad_arguments_are_named(kwargs, error, words):
    with pytest.raises(error, match=words):
        helpers.keras_resnet(**kwargs)
