"""helpers.KerasVirtualGPU (helpers/tf/virtual_card.py): a Keras training step that the card
cannot hold raises TensorFlow's ResourceExhaustedError, in fit, train_on_batch, train_step and
a GradientTape loop; batches that fit run. Tiny models, a memory line from synthetic numbers."""

import numpy as np
import pytest

import helpers
from helpers.tf.memory_fit import KerasMemoryFit
from helpers.tf.virtual_card import current_keras_virtual_gpu

tf = pytest.importorskip("tensorflow")
keras = pytest.importorskip("keras")

MiB, GiB = 2**20, 2**30
L40S = 46068 * MiB
WORDING = ("and type float on /job:localhost/replica:0/task:0/device:GPU:0 by allocator "
           "GPU_0_bfc")


def tiny():
    inp = keras.Input((8,))
    h = keras.layers.Dense(16, activation="relu")(inp)
    model = keras.Model(inp, keras.layers.Dense(3)(h), name="tiny")
    model.compile(optimizer="sgd",
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


def memory_of(model, a=GiB, b=100 * MiB):
    """A line: 1 GiB + 100 MiB per sample; an L40S holds batches up to 450."""
    return KerasMemoryFit.from_points([16, 32], [a + 16 * b, a + 32 * b], title="tiny",
                                      n_parameters=model.count_params(), input_shape=(8,))


def data(n):
    rng = np.random.default_rng(0)
    return (rng.standard_normal((n, 8)).astype("float32"),
            rng.integers(0, 3, n).astype("int32"))


def assert_simulated_oom(error, gpu, batch):
    message = str(error.value)
    assert message.startswith(f"OOM when allocating tensor with shape[{batch},16] ")
    assert WORDING in message.splitlines()[0]
    assert "Graph execution error" not in message
    assert message.splitlines()[1] == (
        f"(simulated by helpers.KerasVirtualGPU: a training step of 'tiny' at batch {batch} "
        f"needs ~{(GiB + batch * 100 * MiB) / GiB:.2f} GiB by its measured memory line; the "
        "virtual L40S holds 44.99 GiB for TensorFlow)")
    assert gpu.last_oom.batch == batch and gpu.last_oom.need_bytes == GiB + batch * 100 * MiB
    assert gpu.last_oom.capacity_bytes == L40S and gpu.last_oom.shape == (batch, 16)
    assert helpers.is_oom_error(error.value)


def test_fit_at_a_batch_the_card_cannot_hold_raises_tensorflows_error():
    model = tiny()
    x, y = data(1024)
    with helpers.KerasVirtualGPU("L40S", memory_of(model)) as gpu:
        assert gpu.largest_batch == 450
        with pytest.raises(tf.errors.ResourceExhaustedError) as error:
            model.fit(x, y, batch_size=512, epochs=1, verbose=0)
    assert_simulated_oom(error, gpu, 512)
    assert gpu.n_oom == 1
    assert "out-of-memory errors: 1" in gpu.text() and repr(gpu) == gpu.text()


def test_train_on_batch_fits_then_raises_at_a_new_batch_size():
    model = tiny()
    x, y = data(512)
    before = [w.copy() for w in model.get_weights()]
    with helpers.KerasVirtualGPU("L40S", memory_of(model)) as gpu:
        model.train_on_batch(x[:32], y[:32])      # fits: it trains, on the CPU
        model.train_on_batch(x[:64], y[:64])      # a second shape: Keras traces for any batch
        with pytest.raises(tf.errors.ResourceExhaustedError) as error:
            model.train_on_batch(x, y)            # checked when the traced step runs
    assert_simulated_oom(error, gpu, 512)
    assert any((a != b).any() for a, b in zip(before, model.get_weights(), strict=True))
    assert [(b, fits) for b, _, fits in gpu.checked][-1] == (512, False)
    assert (32, True) in [(b, fits) for b, _, fits in gpu.checked]


def test_a_step_traced_before_the_card_is_traced_again_and_checked():
    model = tiny()
    x, y = data(512)
    model.train_on_batch(x, y)  # batch 512 runs without the card
    with helpers.KerasVirtualGPU("L40S", memory_of(model)) as gpu, \
            pytest.raises(tf.errors.ResourceExhaustedError) as error:
        model.train_on_batch(x, y)
    assert_simulated_oom(error, gpu, 512)
    model.train_on_batch(x, y)  # after the card: runs again, unchecked
    assert current_keras_virtual_gpu() is None


def test_a_gradient_tape_loop_raises_and_a_fitting_batch_trains():
    model = tiny()
    x, y = data(512)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    opt = keras.optimizers.SGD(0.1)

    def step(xb, yb):
        with tf.GradientTape() as tape:
            loss = loss_fn(yb, model(xb, training=True))
        grads = tape.gradient(loss, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables, strict=True))
        return float(loss)

    with helpers.KerasVirtualGPU("L40S", memory_of(model)) as gpu:
        first = step(x[:64], y[:64])
        for _ in range(20):
            last = step(x[:64], y[:64])
        with pytest.raises(tf.errors.ResourceExhaustedError) as error:
            step(x, y)
    assert last < first  # the fitting batch trained
    assert_simulated_oom(error, gpu, 512)


def test_train_step_called_directly_and_a_traced_loop_are_checked():
    model = tiny()
    x, y = data(512)
    with helpers.KerasVirtualGPU("L40S", memory_of(model)) as gpu:
        with pytest.raises(tf.errors.ResourceExhaustedError) as error:
            model.train_step((tf.constant(x), tf.constant(y)))
        assert_simulated_oom(error, gpu, 512)

        @tf.function(reduce_retracing=True)
        def step(xb, yb):
            with tf.GradientTape() as tape:
                loss = model.compute_loss(xb, yb, model(xb, training=True))
            return tape.gradient(loss, model.trainable_variables)

        step(x[:32], y[:32])
        step(x[:48], y[:48])  # traced again for any batch size
        with pytest.raises(tf.errors.ResourceExhaustedError) as error:
            step(x, y)  # inside a function of your own: TensorFlow's graph context around it
        assert "OOM when allocating tensor with shape[512,16]" in str(error.value)
        assert gpu.last_oom.batch == 512 and gpu.n_oom == 2


def test_inference_and_other_models_outside_training_are_not_checked():
    model = tiny()
    x, _ = data(512)
    with helpers.KerasVirtualGPU("L40S", memory_of(model)) as gpu:
        model(x)                       # not a training call
        model.predict(x, verbose=0)
    assert gpu.checked == [] and gpu.n_oom == 0


def test_a_model_the_line_was_not_measured_for_is_refused():
    model, other = tiny(), keras.Sequential([keras.Input((8,)), keras.layers.Dense(3)])
    x, _ = data(4)
    with helpers.KerasVirtualGPU("L40S", memory_of(model)), \
            pytest.raises(ValueError, match="measure it with helpers.measure_keras_memory"):
        other(x, training=True)


def test_the_card_puts_keras_back_and_cannot_be_nested():
    model = tiny()
    call = keras.Model.__call__
    gpu = helpers.KerasVirtualGPU("L40S", memory_of(model))
    with gpu:
        assert keras.Model.__call__ is not call
        with pytest.raises(RuntimeError, match="already active"), \
                helpers.KerasVirtualGPU("L40S", memory_of(model)):
            pass
    assert keras.Model.__call__ is call
    with gpu:  # entered again
        pass
    assert keras.Model.__call__ is call


def test_context_bytes_reduce_what_the_card_holds():
    model = tiny()
    gpu = helpers.KerasVirtualGPU("L40S", memory_of(model), context_bytes="1000 MiB", index=1)
    assert gpu.limit_bytes == L40S - 1000 * MiB and gpu.largest_batch == 440
    x, y = data(445)
    with gpu, pytest.raises(tf.errors.ResourceExhaustedError, match="device:GPU:1 by allocat"):
        model(x, training=True)


@pytest.mark.parametrize("args, kwargs, error, words", [
    (("L40", None), {}, ValueError, "L40"),
    ((None, None), {}, TypeError, "capacity"),
    (("L40S", "fit"), {}, TypeError, "memory"),
    (("L40S", None), {}, TypeError, "memory"),
    (("L40S", "M"), {"context_bytes": "50 GiB"}, ValueError, "context_bytes"),
    (("L40S", "M"), {"context_bytes": -1}, ValueError, "context_bytes"),
    (("L40S", "M"), {"index": -1}, ValueError, "index"),
    (("L40S", "M"), {"index": True}, TypeError, "index"),
])
def test_keras_virtual_gpu_checks_its_arguments(args, kwargs, error, words):
    memory = memory_of(tiny())
    args = tuple(memory if a == "M" else a for a in args)
    with pytest.raises(error, match=words):
        helpers.KerasVirtualGPU(*args, **kwargs)


# ------------------------------------------------------------- helpers.find_batch_size on it
def counting_step(model, calls):
    x, y = data(64)

    def step(batch):
        calls.append(batch)
        model.train_on_batch(x[:batch], y[:batch])
    return step


def test_the_finder_runs_the_measured_range_and_plans_larger_batches_from_the_line():
    model, calls = tiny(), []
    fit = memory_of(model)                     # measured at 16 and 32: run up to 32
    before = [w.copy() for w in model.get_weights()]
    with helpers.KerasVirtualGPU("L40S", fit, context_bytes="500 MiB") as gpu:
        assert gpu.run_limit == 32
        found = helpers.find_batch_size(counting_step(model, calls), model=model,
                                        optimizer=model.optimizer, start=16)
    budget = int(L40S * 0.95)
    best = max(b for b in range(8, 1000, 8) if fit.predict(b) + 500 * MiB <= budget)
    assert found.batch_size == best == 416
    assert found.device == "KerasVirtualGPU L40S" and found.virtual
    ran = {t.batch_size for t in found.trials if not t.planned}
    assert ran and max(ran) <= 32 and set(calls) == ran       # only the measured range ran
    assert len(calls) == 2 * len(ran)                          # steps_per_trial=2
    for t in found.trials:
        if t.fits:
            assert t.peak_bytes == fit.predict(t.batch_size) + 500 * MiB
        assert t.samples_per_s is None
    over = [t for t in found.trials if not t.fits]
    assert over and all(t.planned and t.oom or t.peak_bytes > budget for t in over)
    text = found.text()
    assert "(planned)" in text and "planned from the line, not run" in text
    assert "trials up to batch 32 (the line's measured range) ran on the CPU" in text
    # the weights are put back after every trial; planned errors are not counted as raised
    assert all((a == b).all() for a, b in zip(before, model.get_weights(), strict=True))
    planned = {t.batch_size for t in found.trials if t.planned}
    assert gpu.n_oom == 0 and planned <= {b for b, _, _ in gpu.checked}


def test_on_the_card_a_small_batch_that_does_not_fit_is_the_cards_real_error():
    model, calls = tiny(), []
    fit = memory_of(model, a=10 * GiB, b=2 * GiB)   # 16 GiB at batch 3: fits exactly
    with helpers.KerasVirtualGPU("16 GiB", fit) as gpu:
        found = helpers.find_batch_size(counting_step(model, calls), model=model, start=8,
                                        multiple_of=1, margin=0)
    assert found.batch_size == 3 and gpu.n_oom >= 1       # raised by the step itself
    assert not any(t.planned for t in found.trials)
    assert "OOM when allocating tensor" in found.trial(8).error


def test_on_the_card_the_finder_needs_the_model():
    model = tiny()
    with helpers.KerasVirtualGPU("L40S", memory_of(model)), \
            pytest.raises(TypeError, match="give model="):
        helpers.find_batch_size(counting_step(model, []), optimizer=model.optimizer)


def test_on_the_card_another_model_is_refused():
    model, other = tiny(), keras.Sequential([keras.Input((8,)), keras.layers.Dense(3)])
    other.compile(optimizer="sgd", loss="mse")
    with helpers.KerasVirtualGPU("L40S", memory_of(model)), \
            pytest.raises(ValueError, match="measure it with helpers.measure_keras_memory"):
        helpers.find_batch_size(lambda b: None, model=other, start=64)
