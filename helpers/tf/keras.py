"""``measure_keras_step``: the memory report for a Keras training step (TensorFlow side).

TensorFlow has no dispatch hook to count every tensor, so the report combines

* what TensorFlow's allocator measured: ``tf.config.experimental.get_memory_info(device)``
  (current and peak bytes) around each step, after ``reset_memory_stats``; and
* an analytic breakdown from the model itself: parameters and gradients from the variables,
  optimizer slots from the optimizer's variables, activations from every layer's output shape
  at this batch size and the dtype policy's compute dtype (``mixed_bfloat16`` halves them).

On GPUs the statistics are always available. On the CPU, TensorFlow's default allocator keeps
none when oneDNN is off (as the kit sets it): set ``TF_CPU_ALLOCATOR_USE_BFC=true`` before
TensorFlow is imported to use the BFC allocator, which keeps them (lesson 06 does). Without
statistics the report says so and shows the analytic breakdown only.
"""

from __future__ import annotations

import html
import os
from dataclasses import dataclass, field

from ..core.checks import positive_int
from ..core.fmt import ShownAsTable, Table, fmt_bytes
from ..memory.report import category_bytes
from .memory import tensorflow_source
from .policies import tensorflow

__all__ = ["measure_keras_step", "KerasMemoryReport", "LayerActivation", "STATS_ENV"]

STATS_ENV = "TF_CPU_ALLOCATOR_USE_BFC"
_TITLES = {
    "parameters": "parameters (and non-trainable weights)",
    "gradients": "gradients",
    "optimizer_state": "optimizer state (slots)",
    "activations": "activations (layer outputs)",
    "inputs": "inputs (batch, labels)",
}


@dataclass(frozen=True)
class LayerActivation:
    name: str
    shape: tuple
    dtype: str
    n_bytes: int


@dataclass(repr=False)
class KerasMemoryReport(ShownAsTable):
    """Memory of a Keras training step: measured peaks and an analytic breakdown.

    ``peak_bytes`` is the largest peak TensorFlow's allocator reported during the measured
    steps (everything live on the device, as ``torch.cuda.max_memory_allocated``), or None
    where it keeps no statistics; ``step_peaks`` holds each step's, and ``step_increases``
    how far each step's peak rose above what was live when it started
    (``peak_increase_bytes`` is the largest: compare variants of a model with it).
    ``category_max`` is the analytic breakdown (bytes by category) and
    ``analytic_peak_bytes`` its sum.
    """

    title: str
    device: str
    policy: str
    batch_size: int
    peak_bytes: int | None
    baseline_bytes: int | None
    step_peaks: list[int]
    step_increases: list[int]
    category_max: dict[str, int]
    layers: list[LayerActivation]
    notes: list[str] = field(default_factory=list)

    phase_peaks = {}  # TensorFlow does not expose forward/backward/optimizer peaks

    @property
    def measured(self) -> bool:
        return self.peak_bytes is not None

    @property
    def peak_increase_bytes(self) -> int | None:
        return max(self.step_increases) if self.step_increases else None

    @property
    def analytic_peak_bytes(self) -> int:
        return sum(self.category_max.values())

    @property
    def at_peak(self) -> dict[str, int]:
        return dict(self.category_max)

    parameter_bytes = category_bytes("parameters")
    gradient_bytes = category_bytes("gradients")
    optimizer_state_bytes = category_bytes("optimizer_state")
    activation_bytes = category_bytes("activations")
    input_bytes = category_bytes("inputs")

    def table(self) -> Table:
        rows = [[_TITLES[c], fmt_bytes(b)] for c, b in self.category_max.items()]
        rows.append(["analytic total", fmt_bytes(self.analytic_peak_bytes)])
        return Table(["category (analytic)", "bytes"], rows)

    def _lines(self) -> tuple[list[str], list[str]]:
        head = [f"Memory of {self.title} (TensorFlow, {self.device}, policy {self.policy}, "
                f"batch {self.batch_size})"]
        if self.measured:
            rises = ", ".join(fmt_bytes(p) for p in self.step_increases)
            head.append(f"measured peak {fmt_bytes(self.peak_bytes)}, "
                        f"{fmt_bytes(self.baseline_bytes)} in use before; each step rose "
                        f"by {rises}")
        else:
            head.append("measured peak: not available (see note)")
        return head, list(self.notes)

    def text(self) -> str:
        head, foot = self._lines()
        return "\n".join(head + [self.table().text()] + foot)

    def _html(self) -> str:
        head, foot = self._lines()
        esc = "<br>".join
        return (f"<div><p>{esc(html.escape(x) for x in head)}</p>{self.table()._repr_html_()}"
                f"<p>{esc(html.escape(x) for x in foot)}</p></div>")

    def to_dict(self) -> dict:
        return {
            "title": self.title, "device": self.device, "policy": self.policy,
            "batch_size": self.batch_size, "peak_bytes": self.peak_bytes,
            "baseline_bytes": self.baseline_bytes, "step_peaks": list(self.step_peaks),
            "step_increases": list(self.step_increases),
            "category_max": dict(self.category_max),
            "analytic_peak_bytes": self.analytic_peak_bytes,
            "layers": [layer.__dict__.copy() for layer in self.layers],
        }


def _nbytes(shape, dtype) -> int:
    import numpy as np
    import tensorflow as tf

    n = 1
    for d in shape:
        n *= int(d)
    return n * tf.as_dtype(dtype).size if not isinstance(dtype, np.dtype) else n * dtype.itemsize


def _layer_activations(model, batch: int) -> list[LayerActivation]:
    import tensorflow as tf

    out = []
    for layer in model.layers:
        if isinstance(layer, tf.keras.layers.InputLayer):
            continue
        try:
            outputs = layer.output
        except (AttributeError, ValueError):
            raise ValueError(
                f"layer {layer.name!r} has no known output shape: measure_keras_step needs a "
                "built Sequential or functional model (call it once or give an Input)"
            ) from None
        outputs = outputs if isinstance(outputs, (list, tuple)) else [outputs]
        dtype = layer.dtype_policy.compute_dtype
        for o in outputs:
            shape = tuple(batch if d is None else int(d) for d in o.shape)
            out.append(LayerActivation(layer.name, shape, str(o.dtype or dtype),
                                       _nbytes(shape, o.dtype or dtype)))
    return out


def _device(device) -> str:
    import tensorflow as tf

    if device is None:
        return "GPU:0" if tf.config.list_physical_devices("GPU") else "CPU:0"
    if not isinstance(device, str) or not device.upper().replace("/DEVICE:", "").startswith(
            ("CPU:", "GPU:")):
        raise ValueError(f"device must look like 'CPU:0' or 'GPU:0', got {device!r}")
    return device.upper().replace("/DEVICE:", "")


def _no_stats(device: str) -> str:
    if device.startswith("CPU"):
        return (f"TensorFlow's CPU allocator keeps no statistics here: set {STATS_ENV}=true "
                "before importing TensorFlow (os.environ, or in the shell) to use its BFC "
                "allocator, which does; shown: the analytic breakdown only.")
    return f"TensorFlow keeps no allocator statistics for {device}."


def measure_keras_step(model, x, y, *, loss=None, optimizer=None, steps: int = 1,
                       device: str | None = None, title: str | None = None
                       ) -> KerasMemoryReport:
    """Run ``steps`` eager training steps of a Keras model and report its memory.

    Args:
        model: a built ``tf.keras`` Sequential or functional model.
        x, y: one batch (arrays or tensors); its first dimension is the batch size.
        loss: a Keras loss (default: the one given to ``model.compile``).
        optimizer: a Keras optimizer (default: the compiled one). Its slots appear during the
            first step, as with PyTorch's Adam: measure ``steps=2`` to see both.
        steps: how many steps to run and measure.
        device: "CPU:0" or "GPU:0" (default: the first GPU if any, else the CPU).
        title: a name for the report.

    Returns:
        A :class:`KerasMemoryReport` (``peak_bytes``, ``step_peaks``, ``category_max``,
        ``analytic_peak_bytes``, ``layers``, ``text()``, HTML).
    """
    tf = tensorflow()
    if not isinstance(model, tf.keras.Model):
        raise TypeError(f"model must be a tf.keras.Model, got {type(model).__name__}")
    steps = positive_int(steps, "steps", maximum=10_000)
    loss = loss if loss is not None else getattr(model, "loss", None)
    optimizer = optimizer if optimizer is not None else getattr(model, "optimizer", None)
    if loss is None or isinstance(loss, str):
        loss = tf.keras.losses.get(loss) if isinstance(loss, str) else None
    if loss is None or not callable(loss):
        raise ValueError("give loss=... (a Keras loss) or compile the model with one")
    if optimizer is None or isinstance(optimizer, str):
        if isinstance(optimizer, str):
            optimizer = tf.keras.optimizers.get(optimizer)
        else:
            raise ValueError("give optimizer=... (a Keras optimizer) or compile the model")
    dev = _device(device)
    x = tf.convert_to_tensor(x)
    y = tf.convert_to_tensor(y)
    batch = int(x.shape[0])
    variables = model.trainable_variables

    def step():
        with tf.GradientTape() as tape:
            value = loss(y, model(x, training=True))
        grads = tape.gradient(value, variables)
        optimizer.apply_gradients(zip(grads, variables, strict=True))

    source = tensorflow_source(dev)
    ok = source.available
    peaks, befores = [], []
    with tf.device(dev):
        for _ in range(steps):
            if ok:
                source.reset()
                befores.append(source.read())
            step()
            if ok:
                peaks.append(source.peak())
    layers = _layer_activations(model, batch)
    cats = {
        "parameters": sum(_nbytes(v.shape, v.dtype) for v in model.weights),
        "gradients": sum(_nbytes(v.shape, v.dtype) for v in variables),
        "optimizer_state": sum(_nbytes(v.shape, v.dtype) for v in optimizer.variables),
        "activations": sum(a.n_bytes for a in layers),
        "inputs": _nbytes(x.shape, x.dtype) + _nbytes(y.shape, y.dtype),
    }
    policy = tf.keras.mixed_precision.global_policy().name
    report = KerasMemoryReport(
        title=title or f"{model.name} training step", device=dev, policy=policy,
        batch_size=batch, peak_bytes=max(peaks) if peaks else None,
        baseline_bytes=befores[0] if befores else None, step_peaks=peaks,
        step_increases=[p - b for p, b in zip(peaks, befores, strict=True)],
        category_max=cats, layers=layers,
    )
    if not ok:
        report.notes.append(_no_stats(dev))
    if ok and dev.startswith("CPU") and os.environ.get(STATS_ENV, "").lower() == "true":
        report.notes.append("CPU: measured with TensorFlow's BFC allocator "
                            f"({STATS_ENV}=true), which rounds and pools its blocks.")
    return report
