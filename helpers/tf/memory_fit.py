"""``measure_keras_memory``: a Keras training step's memory as a line in the batch size.

TensorFlow has no fake tensors, so a step at full scale cannot be measured without running
it. But for fixed input shapes and a fixed program, the memory of a training step is close to
affine in the batch size: weights, gradients and optimizer slots do not grow with the batch,
activations (and the batch itself) grow in proportion to it. So::

    fit = helpers.measure_keras_memory(build_model, [16, 32, 64], check_batch=128)
    fit                                  # the line, each point's residual, the held-out error
    fit.predict(256)                     # bytes at batch 256
    fit.largest_batch("L40S", margin=0.1)

measures the peak of TensorFlow's own allocator (its BFC allocator; ``helpers.setup`` enables
it on the CPU) over a few training steps at each batch size, fits ``peak = a + b * batch`` by
least squares and checks the line on a larger batch that it was not fitted to.

What the line cannot see: a GPU's cuDNN autotuning workspaces and cuBLAS workspaces land in
the same peak there but not on a CPU, XLA (``jit_compile=True``, Keras' default on GPUs)
fuses and reorders the program, and the CUDA context is outside TensorFlow's allocator.
"""

from __future__ import annotations

import gc
import html
import math
import numbers
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from fractions import Fraction

from ..core.checks import positive_int, real_number, shown
from ..core.fmt import ShownAsTable, Table, fmt_mib
from ..memory.capacity import resolve_capacity

__all__ = ["measure_keras_memory", "KerasMemoryFit", "affine_fit"]

DEVICE = "CPU:0"


def affine_fit(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """Least-squares line through the points: ``(intercept, slope)`` of ``y = a + b * x``.

    Needs at least two distinct ``xs``; exact for points on a line.
    """
    xs = [Fraction(v) for v in xs]  # exact arithmetic: byte counts are whole numbers
    ys = [Fraction(v) for v in ys]
    if len(xs) != len(ys):
        raise ValueError(f"xs and ys must have the same length, got {len(xs)} and {len(ys)}")
    if len(set(xs)) < 2:
        raise ValueError("a line needs at least two different batch sizes")
    n = len(xs)
    mx, my = sum(xs) / n, sum(ys) / n
    sxx = sum((x - mx) ** 2 for x in xs)
    sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True))
    slope = sxy / sxx
    return float(my - slope * mx), float(slope)


def _pct(fraction: float) -> str:
    return f"~{fraction * 100:+.1f} %"


@dataclass(repr=False)
class KerasMemoryFit(ShownAsTable):
    """A Keras training step's memory as a line in the batch size, with its checks.

    ``peak = intercept_bytes + per_sample_bytes * batch``, fitted by least squares to the
    measured peaks ``peaks`` at ``batch_sizes``. Read:

    * ``residuals``: measured minus fitted, per fit point (bytes; ``residual_fractions``
      relative to the measurement);
    * ``neighbour_slopes``: bytes per sample between neighbouring fit points, and
      ``slope_spread``: their (max - min) / fitted slope (0 for a perfect line);
    * ``check_batch``, ``check_peak``, ``check_error``: the held-out batch, its measured
      peak and the line's relative error there, ``(predicted - measured) / measured``;
    * ``seconds``: how long each measurement took (fit batches, then the check batch), and
      ``step_peaks`` each step's peak there (the median of a point's is its peak).

    Methods: ``predict(batch)`` (bytes, an int) and ``largest_batch(capacity, margin=0.0)``.
    """

    title: str
    batch_sizes: list[int]
    peaks: list[int]
    intercept_bytes: float
    per_sample_bytes: float
    check_batch: int | None = None
    check_peak: int | None = None
    n_parameters: int = 0
    input_shape: tuple | None = None
    policy: str = "float32"
    steps: int = 0
    seconds: list[float] = field(default_factory=list)
    step_peaks: list[list[int]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @classmethod
    def from_points(cls, batch_sizes, peaks, *, check_batch=None, check_peak=None,
                    title: str = "a Keras model", **kwargs) -> KerasMemoryFit:
        """The line through measured ``(batch, peak)`` points (also for numbers measured
        elsewhere, such as a GPU's)."""
        batches = _batches(batch_sizes, "batch_sizes")
        if not isinstance(peaks, Sequence) or isinstance(peaks, str):
            raise TypeError(f"peaks must be a list of byte counts, got {type(peaks).__name__}")
        if len(peaks) != len(batches):
            raise ValueError(f"peaks must have one value per batch size ({len(batches)}), "
                             f"got {len(peaks)}")
        peaks = [_bytes(p, "peaks") for p in peaks]
        if (check_batch is None) != (check_peak is None):
            raise ValueError("give check_batch and check_peak together")
        if check_batch is not None:
            check_batch = positive_int(check_batch, "check_batch")
            check_peak = _bytes(check_peak, "check_peak")
        a, b = affine_fit(batches, peaks)
        return cls(title=title, batch_sizes=batches, peaks=peaks, intercept_bytes=a,
                   per_sample_bytes=b, check_batch=check_batch, check_peak=check_peak,
                   **kwargs)

    # -- the line ----------------------------------------------------------------------
    def predict(self, batch) -> int:
        """Bytes a training step needs at ``batch`` by the line (rounded to a byte)."""
        batch = positive_int(batch, "batch")
        return round(self.intercept_bytes + self.per_sample_bytes * batch)

    def largest_batch(self, capacity, *, margin=0.0) -> int:
        """The largest batch whose predicted need fits ``capacity * (1 - margin)``.

        Args:
            capacity: bytes, ``"48GB"``, ``"44 GiB"`` or a known card (``"L40S"``).
            margin: the fraction of the capacity to keep free (0 <= margin < 1), e.g. 0.1
                for the extrapolation's error and what the line does not see.

        Returns:
            The batch size (0 when not even the fixed part fits).
        """
        _, cap = resolve_capacity(capacity)
        margin = real_number(margin, "margin", 0.0, 1.0)
        if margin >= 1.0:
            raise ValueError(f"margin must be less than 1, got {shown(margin)}")
        budget = cap * (1.0 - margin)
        if self.per_sample_bytes <= 0:
            raise ValueError("the line does not grow with the batch (per-sample bytes "
                             f"{self.per_sample_bytes:.0f}): measure over larger batches")
        room = budget - self.intercept_bytes
        if room < self.per_sample_bytes:
            return 0
        batch = math.floor(room / self.per_sample_bytes)
        while batch > 0 and self.intercept_bytes + self.per_sample_bytes * batch > budget:
            batch -= 1  # float rounding at the boundary
        return batch

    @property
    def fitted(self) -> list[float]:
        return [self.intercept_bytes + self.per_sample_bytes * b for b in self.batch_sizes]

    @property
    def residuals(self) -> list[float]:
        return [p - f for p, f in zip(self.peaks, self.fitted, strict=True)]

    @property
    def residual_fractions(self) -> list[float]:
        return [r / p if p else 0.0 for r, p in zip(self.residuals, self.peaks, strict=True)]

    @property
    def neighbour_slopes(self) -> list[float]:
        pts = sorted(zip(self.batch_sizes, self.peaks, strict=True))
        return [(p2 - p1) / (b2 - b1) for (b1, p1), (b2, p2) in zip(pts, pts[1:], strict=False)
                if b2 != b1]

    @property
    def slope_spread(self) -> float:
        slopes = self.neighbour_slopes
        if not slopes or self.per_sample_bytes == 0:
            return 0.0
        return (max(slopes) - min(slopes)) / abs(self.per_sample_bytes)

    @property
    def check_prediction(self) -> int | None:
        return None if self.check_batch is None else self.predict(self.check_batch)

    @property
    def check_error(self) -> float | None:
        if self.check_batch is None or not self.check_peak:
            return None
        return (self.check_prediction - self.check_peak) / self.check_peak

    # -- showing -----------------------------------------------------------------------
    def _head(self) -> list[str]:
        lines = [f"Memory of a training step of {self.title} (TensorFlow's allocator, "
                 f"policy {self.policy}, jit_compile=False)",
                 f"line: ~{self.intercept_bytes / 2**20:.1f} MiB + "
                 f"~{self.per_sample_bytes / 2**20:.3f} MiB per sample (fit over batches "
                 f"{', '.join(str(b) for b in self.batch_sizes)})"]
        slopes = self.neighbour_slopes
        if len(slopes) > 1:
            lines.append("per sample between neighbours: "
                         + ", ".join(f"~{s / 2**20:.3f}" for s in slopes)
                         + f" MiB (spread {_pct(self.slope_spread)[:-1].rstrip()}"
                         " % of the slope)")
        return lines

    def _rows(self) -> list[list[str]]:
        """One row per point; every figure measured (or fitted to measurements): ``~``."""
        rows = [[str(b), "fit", f"~{fmt_mib(f)}", f"~{p / 2**20:.1f} MiB ({_pct(r)})"]
                for b, p, f, r in zip(self.batch_sizes, self.peaks, self.fitted,
                                      self.residual_fractions, strict=True)]
        if self.check_batch is not None:
            rows.append([str(self.check_batch), "held out",
                         f"~{fmt_mib(self.check_prediction)}",
                         f"~{self.check_peak / 2**20:.1f} MiB ({_pct(-self.check_error)})"])
        return rows

    def table(self) -> Table:
        return Table(["batch", "point", "line", "measured (residual)"], self._rows())

    def text(self) -> str:
        lines = self._head()
        for b, kind, line, measured in self._rows():
            lines.append(f"batch {b:>5} ({kind}): line {line}, measured {measured}")
        if self.check_error is not None:
            lines.append(f"held-out error at batch {self.check_batch}: "
                         f"{_pct(self.check_error)} (line vs measured)")
        return "\n".join(lines + self.notes)

    def _html(self) -> str:
        head = "<br>".join(html.escape(x) for x in self._head())
        foot = "<br>".join(html.escape(x) for x in self.text().splitlines()[
            len(self._head()) + len(self._rows()):])
        return f"<div><p>{head}</p>{self.table()._repr_html_()}<p>{foot}</p></div>"

    def to_dict(self) -> dict:
        return {"title": self.title, "batch_sizes": list(self.batch_sizes),
                "peaks": list(self.peaks), "intercept_bytes": self.intercept_bytes,
                "per_sample_bytes": self.per_sample_bytes, "residuals": self.residuals,
                "residual_fractions": self.residual_fractions,
                "neighbour_slopes": self.neighbour_slopes, "slope_spread": self.slope_spread,
                "check_batch": self.check_batch, "check_peak": self.check_peak,
                "check_prediction": self.check_prediction, "check_error": self.check_error,
                "seconds": list(self.seconds), "n_parameters": self.n_parameters,
                "steps": self.steps, "policy": self.policy}


def _bytes(value, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must hold byte counts (numbers), got "
                        f"{type(value).__name__}: {shown(value)}")
    value = real_number(value, name, 0)
    return int(round(value))


def _batches(values, name: str) -> list[int]:
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
        raise TypeError(f"{name} must be a list of batch sizes, got "
                        f"{type(values).__name__}: {shown(values)}")
    batches = [positive_int(v, name) for v in values]
    if len(set(batches)) < 2:
        raise ValueError(f"{name} must hold at least two different batch sizes, got "
                         f"{shown(values)}")
    return batches


def _largest_activation(model, batch: int) -> tuple[tuple, str]:
    """The shape and dtype of the largest layer output of ``model`` at ``batch`` (a model
    without known output shapes: one float32 value per sample)."""
    import tensorflow as tf

    best, best_bytes = ((batch,), "float32"), -1
    for layer in model.layers:
        if isinstance(layer, tf.keras.layers.InputLayer):
            continue
        try:
            outputs = layer.output
        except (AttributeError, ValueError):
            return (batch,), "float32"
        for o in outputs if isinstance(outputs, (list, tuple)) else [outputs]:
            dtype = str(o.dtype or layer.dtype_policy.compute_dtype)
            shape = tuple(batch if d is None else int(d) for d in o.shape)
            n = math.prod(shape) * tf.as_dtype(dtype).size
            if n > best_bytes:
                best, best_bytes = (shape, dtype), n
    return best


def _default_batch(model, batch: int):
    """Random inputs for every model input and integer labels for its classes."""
    import numpy as np

    rng = np.random.default_rng(0)
    shapes = model.input_shape if isinstance(model.input_shape, list) else [model.input_shape]
    xs = []
    for shape in shapes:
        if any(d is None for d in shape[1:]):
            raise ValueError(f"the model's input shape {shape} is not fixed: give "
                             "make_batch=lambda batch: (x, y)")
        xs.append(rng.standard_normal((batch, *shape[1:]), dtype=np.float32))
    n_out = model.output_shape[-1] if isinstance(model.output_shape, tuple) else None
    if not n_out or n_out < 2:
        raise ValueError("the default labels are class numbers for a model with one output "
                         "of at least two classes: give make_batch=lambda batch: (x, y)")
    y = rng.integers(0, n_out, size=(batch,), dtype=np.int32)
    return (xs[0] if len(xs) == 1 else xs), y


def _check_model(model, keras) -> None:
    if not isinstance(model, keras.Model):
        raise TypeError(f"build_model must return a keras.Model, got {type(model).__name__}")
    if not getattr(model, "compiled", False) or getattr(model, "optimizer", None) is None:
        raise ValueError("build_model must return a compiled model: call "
                         "model.compile(optimizer=..., loss=...) in it")


def _measure(build_model, batch: int, steps: int, make_batch, tf, keras):
    """One batch size in this process, on a fresh model (see :func:`_build_and_train`),
    with Keras' global state cleared before and after."""
    keras.backend.clear_session()
    gc.collect()
    with tf.device(DEVICE):  # on a machine with a GPU too: the line is the CPU allocator's
        measured = _build_and_train(build_model, batch, steps, make_batch, tf, keras)
    keras.backend.clear_session()
    gc.collect()
    return measured


def _build_and_train(build_model, batch: int, steps: int, make_batch, tf, keras):
    """Build a model with ``build_model``, run ``steps`` training steps on one batch:
    each step's allocator peak above the memory in use before the model was built, the
    seconds it all took, and ``(parameters, input shape, policy, name)``."""
    from ..memory.sources import TensorFlowSource

    source = TensorFlowSource(tf.config.experimental, DEVICE)
    source.reset()
    base = source.read()
    start = time.perf_counter()
    model = build_model()
    _check_model(model, keras)
    model.jit_compile = False
    x, y = _default_batch(model, batch) if make_batch is None else make_batch(batch)
    x = tf.nest.map_structure(tf.convert_to_tensor, x)
    y = tf.convert_to_tensor(y)
    peaks = []
    for _ in range(steps):
        source.reset()
        model.train_on_batch(x, y)
        peaks.append(source.peak() - base)
    seconds = time.perf_counter() - start
    info = (int(model.count_params()), _input_shape(model), model.dtype_policy.name,
            model.name)
    return peaks, seconds, info


def _child_measure(payload_path: str, batch: int, steps: int) -> dict:
    """In a fresh process (``python -m helpers.tf.memory_fit``): build the model with the
    caller's ``build_model`` (sent by value with cloudpickle, so a function or layer class
    defined in a notebook arrives too) under the caller's global dtype policy, run ``steps``
    training steps on one batch, return the steps' peaks above the memory in use before the
    model was built. One inter-op thread: the operations then run in the same order every
    time, and the steps of one process agree to 0.1 %."""
    import cloudpickle

    tf = _tensorflow()
    tf.config.threading.set_inter_op_parallelism_threads(1)
    import keras

    with open(payload_path, "rb") as f:
        build_model, make_batch, policy = cloudpickle.load(f)
    keras.config.set_dtype_policy(policy)
    peaks, seconds, info = _build_and_train(build_model, batch, steps, make_batch, tf, keras)
    return {"peaks": peaks, "seconds": seconds, "info": list(info)}


def _measure_isolated(payload_path, batch: int, steps: int, timeout: float):
    """One batch size in a fresh Python process (see :func:`_child_measure`)."""
    import json
    import os
    import subprocess
    import sys

    from ..core.environment import TF_ENV

    # the line is a CPU measurement (DEVICE): on a machine with a GPU, TensorFlow would place
    # the model there and the CPU allocator's peak would miss it, so the child sees no GPU
    env = {**os.environ, **TF_ENV, "TF_CPP_MIN_LOG_LEVEL": "3", "CUDA_VISIBLE_DEVICES": "-1"}
    try:
        done = subprocess.run(
            [sys.executable, "-m", "helpers.tf.memory_fit", str(payload_path), str(batch),
             str(steps)], capture_output=True, text=True, env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise TimeoutError(f"measuring batch {batch} in a fresh process took more than "
                           f"{timeout:g} s") from None
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        raise RuntimeError(f"measuring batch {batch} in a fresh process failed (exit code "
                           f"{done.returncode}): {done.stderr.strip()[-1500:]}")
    result = json.loads(lines[-1])
    shape = result["info"][1]
    result["info"][1] = tuple(shape) if shape is not None else None
    return result["peaks"], result["seconds"], tuple(result["info"])


def _payload(build_model, make_batch, policy: str) -> bytes:
    """``build_model``, ``make_batch`` and the global dtype policy, pickled by value for the
    fresh processes (cloudpickle: functions and classes defined in a notebook included)."""
    import pickle

    import cloudpickle

    try:
        return cloudpickle.dumps((build_model, make_batch, policy))
    except (pickle.PicklingError, TypeError, AttributeError) as exc:
        raise ValueError(
            f"build_model (or make_batch) cannot be sent to a fresh process: {exc}. With "
            "isolate=True it is pickled by value: let it build everything it needs (no "
            "open files, locks or models made outside it), or use isolate=False") from None


def _input_shape(model):
    shape = model.input_shape
    if isinstance(shape, tuple) and all(d is None or isinstance(d, int) for d in shape):
        return tuple(shape[1:])
    return None


def measure_keras_memory(build_model: Callable, batch_sizes, *, check_batch=None,
                         steps: int = 5, make_batch: Callable | None = None,
                         title: str | None = None, isolate: bool = False,
                         timeout: float = 600.0) -> KerasMemoryFit:
    """Measure a Keras training step's peak memory at several batch sizes and fit a line.

    Every batch size gets a fresh model from ``build_model`` (after
    ``keras.backend.clear_session()`` and a garbage collection), so every point measures the
    same program, and its own ``steps`` training steps (``train_on_batch`` on one synthetic
    batch). A point's peak is the median of its steps' peaks of TensorFlow's BFC allocator
    (``tf.config.experimental.get_memory_info("CPU:0")["peak"]`` after
    ``reset_memory_stats``), less the memory in use before the model was built: weights,
    gradients, optimizer slots, the batch and the activations, as a GPU would hold them.

    The model is compiled by you, and run with ``jit_compile=False`` here: Keras'
    ``"auto"`` turns XLA off on machines without a GPU and on on GPUs, so a line measured
    on a CPU with "auto" would describe another program than the one a GPU runs; XLA fuses
    and reorders operations and changes the peak.

    Choosing batches: a step's peak is the largest of several moments (the backward pass,
    the optimizer update, ...), each growing at its own rate; at small batches a moment
    dominated by the weights can be the largest, so the line bends there. Fit over batches
    where the activations dominate (the ``slope_spread`` is small) and check on a larger
    one. The peak is not exactly affine either, and what it does at one batch size is not
    what it does at the next: measured on 2 cores for the 32-px ResNet of the tests
    (``tests/unit/tf/test_keras_memory_fit.py``), the bytes per sample between neighbouring
    fit points varied from about 0.7 to 1.8 MiB, and a held-out batch of 384 came out between
    +1 % and -14 % of the line in eleven runs; for ResNet-50 at 224 px fitted over batches
    2 and 4, batch 6 came out at -0.1 % and +5.0 % in two runs. The BFC allocator's
    rounding is not the cause: handing it one large region first (as a GPU without memory
    growth has) left every peak the same within 0.3 %. What varies is what the operations
    themselves allocate at each batch size (the CPU kernels' temporary buffers, and the
    order the executor runs them in). Read the line as an estimate to the held-out error
    it prints, and keep a margin larger than that (``largest_batch(..., margin=0.15)``).

    Isolated or here: with ``isolate=True`` (below) the model is built and trained only in
    fresh processes, so the kernel never holds it; here, the step's peak is read above the
    memory already in use, so what a notebook holds does not enter it, but TensorFlow keeps
    the pool its allocator grew to until the process ends. Measured both ways for that
    ResNet: the two agreed within the run-to-run spread at batches of 64 and more; at batch 8
    a second measurement in the same process read 14 % higher than the first: use larger
    batches.

    Args:
        build_model: a function without arguments returning a new *compiled* Keras model
            with fixed input shapes (its optimizer must be new too: build it inside).
        batch_sizes: at least two different batch sizes to fit the line to.
        check_batch: a larger batch size, measured too but not fitted: the line's
            ``check_error`` there shows how far it extrapolates. None: no check.
        steps: training steps per batch size (the first traces the step and creates the
            optimizer's slots; the median of all is kept).
        make_batch: ``make_batch(batch) -> (x, y)``; default: normal random inputs of the
            model's input shape and integer class labels (``sparse_categorical_crossentropy``).
        title: a name for the report (default: the model's name).
        isolate: measure every batch size in a fresh Python process with one inter-op
            thread. ``build_model`` and ``make_batch`` are sent there by value
            (cloudpickle: functions and layer classes defined in a notebook arrive too),
            with the global dtype policy (``keras.mixed_precision.set_global_policy``);
            the model is built and trained only there, so the notebook's kernel never holds
            it or its large batches (TensorFlow keeps its allocator's pool until the
            process ends). The operations then run in the same order every time: measured
            for the 32-px ResNet of the tests, the steps of one process agree to 0.1 % and
            two processes to about 1.5 %. It does not make the peak a line: the BFC
            allocator's staircase stays (see above). About 5-10 s more per batch size (a
            new process imports TensorFlow).
        timeout: seconds each isolated measurement may take.

    Returns:
        A :class:`KerasMemoryFit` (``predict``, ``largest_batch``, ``residuals``,
        ``slope_spread``, ``check_error``; shows itself as a table).
    """
    tf = _tensorflow()
    import keras

    if not callable(build_model) or isinstance(build_model, keras.Model):
        raise TypeError("build_model must be a function that returns a new compiled Keras "
                        f"model, got {type(build_model).__name__}")
    batches = _batches(batch_sizes, "batch_sizes")
    if check_batch is not None:
        check_batch = positive_int(check_batch, "check_batch")
        if check_batch in batches:
            raise ValueError(f"check_batch must not be one of batch_sizes (it is held out), "
                             f"got {check_batch}")
    steps = positive_int(steps, "steps", maximum=1000)
    if make_batch is not None and not callable(make_batch):
        raise TypeError(f"make_batch must be a function batch -> (x, y), got "
                        f"{type(make_batch).__name__}")
    if title is not None and not isinstance(title, str):
        raise TypeError(f"title must be a string, got {type(title).__name__}")
    from ..memory.sources import TensorFlowSource

    if not TensorFlowSource(tf.config.experimental, DEVICE).available:
        raise RuntimeError("TensorFlow's CPU allocator keeps no statistics here: call "
                           "helpers.setup() before importing TensorFlow (it sets "
                           "TF_CPU_ALLOCATOR_USE_BFC=true)")
    if not isinstance(isolate, bool):
        raise TypeError(f"isolate must be True or False, got {type(isolate).__name__}")
    timeout = real_number(timeout, "timeout", 1, 24 * 3600)
    peaks, step_peaks, seconds, info = [], [], [], None
    every = [*batches, *([check_batch] if check_batch is not None else [])]
    if isolate:
        import tempfile
        from pathlib import Path

        payload = _payload(build_model, make_batch, keras.config.dtype_policy().name)
        with tempfile.TemporaryDirectory(prefix="keras-memory-") as tmp:
            path = Path(tmp) / "build_model.pkl"
            path.write_bytes(payload)
            measured_all = [_measure_isolated(path, b, steps, timeout) for b in every]
    else:
        measured_all = [_measure(build_model, b, steps, make_batch, tf, keras) for b in every]
    info = measured_all[-1][2]
    for measured, took, _ in measured_all:
        step_peaks.append(measured)
        peaks.append(sorted(measured)[len(measured) // 2])
        seconds.append(took)
    n_params, input_shape, policy, name = info
    check_peak = peaks.pop() if check_batch is not None else None
    return KerasMemoryFit.from_points(
        batches, peaks, check_batch=check_batch, check_peak=check_peak,
        title=title or name, n_parameters=n_params, input_shape=input_shape, policy=policy,
        steps=steps, seconds=seconds, step_peaks=step_peaks)


def _tensorflow():
    from .policies import tensorflow

    return tensorflow()


if __name__ == "__main__":  # the fresh process of measure_keras_memory(..., isolate=True)
    import json
    import sys

    _path, _batch, _steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    print(json.dumps(_child_measure(_path, _batch, _steps)))
