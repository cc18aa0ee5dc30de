"""``KerasVirtualGPU``: a GPU's memory for Keras training, down to a real
``tf.errors.ResourceExhaustedError``.

TensorFlow on a CPU has no memory cap, and no fake tensors to run a step without its memory,
so the card works from a measured memory line (:func:`helpers.measure_keras_memory`): a
training step at batch ``b`` needs ``fit.predict(b)`` bytes. Inside ``with
KerasVirtualGPU("L40S", fit):`` every training call of the measured model is checked *before*
it runs; one that needs more than the card holds raises ``ResourceExhaustedError`` with
TensorFlow's wording and one more line saying that it was simulated, what the step needed and
what the card holds. Batches that fit run as usual, on the CPU::

    fit = helpers.measure_keras_memory(build_model, [32, 64, 128], check_batch=256)
    with helpers.KerasVirtualGPU("L40S", fit) as gpu:
        model.fit(x, y, batch_size=4096)          # -> ResourceExhaustedError
    gpu.last_oom                                  # batch, need, capacity

What is checked (a *training call*): the outermost Keras model called with
``training=True``, or called inside Keras' ``train_step`` (``fit``, ``train_on_batch``,
``model.train_step``), eagerly or inside a ``tf.function``. A custom ``tf.GradientTape`` loop
is checked when it calls ``model(x, training=True)``, as Keras' guides write it. The batch is
the first input's first dimension: known when the call runs eagerly or is traced for a fixed
shape (checked at once, before any work), else checked when the traced step runs (a small
``tf.py_function`` in front of the model; inside a ``tf.function`` of your own, the error then
carries TensorFlow's graph context around the same message). ``fit``'s step function is
traced again inside the card, so one traced before it is still checked; a ``tf.function`` of
your own traced before the card was entered is not (trace it inside).
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass

from ..core.checks import whole_number
from ..core.fmt import ShownAsTable, fmt_bytes
from ..memory.capacity import resolve_capacity
from .memory_fit import KerasMemoryFit, _largest_activation
from .policies import tensorflow

__all__ = ["KerasVirtualGPU", "KerasOOM", "current_keras_virtual_gpu", "tf_oom_message"]

_TF_DTYPE_NAMES = {"float32": "float", "float16": "half", "bfloat16": "bfloat16",
                   "float64": "double", "int32": "int32", "int64": "int64"}

_lock = threading.Lock()
_active: KerasVirtualGPU | None = None
_local = threading.local()  # depth (nested model calls), train_step (inside Keras' step)


def current_keras_virtual_gpu() -> KerasVirtualGPU | None:
    """The ``KerasVirtualGPU`` entered now (any thread), or None."""
    return _active


def tf_oom_message(shape, dtype: str = "float32", device_index: int = 0) -> str:
    """The first line of TensorFlow's out-of-memory error on a GPU, for a tensor of ``shape``
    and ``dtype`` (as the BFC allocator of ``GPU:<device_index>`` writes it)."""
    dims = ",".join(str(int(d)) for d in shape)
    name = _TF_DTYPE_NAMES.get(str(dtype), str(dtype))
    return (f"OOM when allocating tensor with shape[{dims}] and type {name} on "
            f"/job:localhost/replica:0/task:0/device:GPU:{device_index} by allocator "
            f"GPU_{device_index}_bfc")


@dataclass(frozen=True, repr=False)
class KerasOOM(ShownAsTable):
    """One simulated out-of-memory error: the batch, what the step needed by the memory
    line (``need_bytes``), what the card holds (``capacity_bytes``, less ``context_bytes``:
    ``limit_bytes``) and the tensor named in the message."""

    card: str
    model: str
    batch: int
    need_bytes: int
    capacity_bytes: int
    limit_bytes: int
    shape: tuple
    dtype: str
    message: str

    def text(self) -> str:
        return (f"out of memory on the virtual {self.card}: {self.model} at batch "
                f"{self.batch} needs ~{self.need_bytes / 2**30:.2f} GiB, the card holds "
                f"{fmt_bytes(self.limit_bytes)} for TensorFlow")


class KerasVirtualGPU(ShownAsTable):
    """A GPU of a given memory size for Keras training, simulated from a memory line.

    Args:
        capacity: bytes, ``"48GB"``, ``"48 GiB"`` or a known card (``"L40S"``,
            ``"A100-80GB"``, ...; see ``helpers.KNOWN_GPUS``: the total its driver reports).
        memory: the model's memory line, a :class:`helpers.tf.memory_fit.KerasMemoryFit`
            from :func:`helpers.measure_keras_memory`. Only models with its number of
            parameters and its input shape are trained inside (ValueError otherwise: measure
            the model you train; a policy or ``tf.recompute_grad`` change needs a new line).
        context_bytes: memory the GPU holds outside TensorFlow's allocator (the CUDA
            context, typically 300-600 MiB); bytes or a size string. Default 0.
        index: the GPU number in messages (``device:GPU:0``, ``GPU_0_bfc``).

    Attributes: ``name``, ``capacity_bytes``, ``context_bytes``, ``limit_bytes`` (capacity
    less context), ``memory``, ``n_oom`` (errors raised), ``last_oom`` (a :class:`KerasOOM`,
    or None), ``checked`` (``(batch, need_bytes, fits)`` for every training call checked),
    ``largest_batch`` (the largest batch the line fits in ``limit_bytes``).

    A card can be entered again later; cards cannot be nested.
    """

    def __init__(self, capacity, memory, *, context_bytes=0, index: int = 0):
        card, cap = resolve_capacity(capacity)
        if not isinstance(memory, KerasMemoryFit):
            raise TypeError(f"memory must be a KerasMemoryFit (from "
                            f"helpers.measure_keras_memory), got {type(memory).__name__}")
        self.capacity_bytes = cap
        self.name = card if card is not None else fmt_bytes(cap)
        self.context_bytes = resolve_capacity(context_bytes, what="context_bytes",
                                              allow_zero=True)[1]
        if self.context_bytes >= cap:
            raise ValueError(f"context_bytes ({fmt_bytes(self.context_bytes)}) must be "
                             f"smaller than the capacity ({fmt_bytes(cap)})")
        self.index = whole_number(index, "index", 0, 1023)
        self.memory = memory
        self.n_oom = 0
        self.last_oom: KerasOOM | None = None
        self.checked: list[tuple[int, int, bool]] = []
        self._pending: KerasOOM | None = None
        self._patches: list = []
        self._models = weakref.WeakSet()

    @property
    def limit_bytes(self) -> int:
        return self.capacity_bytes - self.context_bytes

    @property
    def largest_batch(self) -> int:
        return self.memory.largest_batch(self.limit_bytes)

    # -- for helpers.find_batch_size -----------------------------------------------------
    #: nothing is faked (steps that run, run for real) and there are no CUDA workspaces
    fake = False
    workspaces = None

    @property
    def run_limit(self) -> int:
        """The largest batch the memory line was measured at: :func:`helpers.find_batch_size`
        runs trials up to it for real and plans larger ones from the line."""
        measured = list(self.memory.batch_sizes)
        if self.memory.check_batch is not None:
            measured.append(self.memory.check_batch)
        return max(measured)

    def need_bytes(self, batch) -> int:
        """What a training step at ``batch`` holds on the card by the line, the context
        included (``nvidia-smi``'s view)."""
        return self.memory.predict(batch) + self.context_bytes

    def plan(self, model, batch) -> str | None:
        """Check a training step of ``model`` at ``batch`` without running it: None if it
        fits, else the first line of the ``ResourceExhaustedError`` the card would raise
        (recorded in ``checked``, not counted in ``n_oom``)."""
        self._verify(model)
        record = self._oom(model, whole_number(batch, "batch", 1))
        return None if record is None else \
            f"ResourceExhaustedError: {record.message.splitlines()[0]}"

    # -- showing -----------------------------------------------------------------------
    def text(self) -> str:
        lines = [f"Keras virtual GPU {self.name}: {fmt_bytes(self.capacity_bytes)}"
                 + (f", {fmt_bytes(self.context_bytes)} outside TensorFlow"
                    if self.context_bytes else ""),
                 f"memory line: {self.memory.title} (~{self.memory.intercept_bytes / 2**20:.1f}"
                 f" MiB + ~{self.memory.per_sample_bytes / 2**20:.2f} MiB per sample)",
                 f"largest batch that fits: ~{self.largest_batch}",
                 f"out-of-memory errors: {self.n_oom}"]
        if self.last_oom is not None:
            lines.append(f"last: {self.last_oom.text()}")
        return "\n".join(lines)

    # -- checking ----------------------------------------------------------------------
    def _verify(self, model) -> None:
        fit = self.memory
        n = int(model.count_params())
        shape = tuple(model.input_shape[1:]) if _single_input(model) else None
        if n != fit.n_parameters or (shape is not None and fit.input_shape is not None
                                     and shape != fit.input_shape):
            raise ValueError(
                f"this card has the memory line of {fit.title} ({fit.n_parameters:,} "
                f"parameters, input {fit.input_shape}), but {model.name!r} "
                f"({n:,} parameters, input {shape}) is trained: measure it with "
                "helpers.measure_keras_memory and give the card its line")

    def _oom(self, model, batch: int) -> KerasOOM | None:
        """The error record if a training step of ``model`` at ``batch`` does not fit."""
        need = self.memory.predict(batch)
        fits = need <= self.limit_bytes
        self.checked.append((batch, need, fits))
        if fits:
            return None
        shape, dtype = _largest_activation(model, batch)
        message = (
            tf_oom_message(shape, dtype, self.index)
            + f"\n(simulated by helpers.KerasVirtualGPU: a training step of {model.name!r} at "
            f"batch {batch} needs ~{need / 2**30:.2f} GiB by its measured memory line; the "
            f"virtual {self.name} holds {fmt_bytes(self.limit_bytes)} for TensorFlow)")
        return KerasOOM(self.name, model.name, batch, need, self.capacity_bytes,
                        self.limit_bytes, tuple(shape), str(dtype), message)

    def _raise(self, record: KerasOOM):
        tf = tensorflow()
        self.n_oom += 1
        self.last_oom = record
        raise tf.errors.ResourceExhaustedError(None, None, record.message)

    def _check_now(self, model, batch: int) -> None:
        self._verify(model)
        record = self._oom(model, batch)
        if record is not None:
            self._raise(record)

    def _runtime_check(self, model):
        """A function for ``tf.py_function``: checks the batch when a traced step runs."""
        ref = weakref.ref(model)

        def check(batch):
            card, model = _active, ref()
            if card is None or model is None:
                return True
            record = card._oom(model, int(batch))
            if record is not None:
                card._pending = record
                card.n_oom += 1
                card.last_oom = record
                raise MemoryError(record.message)  # tf.py_function: ResourceExhaustedError
            return True

        return check

    # -- entering ----------------------------------------------------------------------
    def __enter__(self):
        global _active
        with _lock:
            if _active is not None:
                raise RuntimeError("a KerasVirtualGPU is already active: do not nest them")
            _active = self
        try:
            self._install()
        except BaseException:
            _active = None
            raise
        return self

    def __exit__(self, *exc):
        global _active
        self._uninstall()
        for model in list(self._models):  # traced with the card's guard: trace again later
            model.train_function = None
        self._models = weakref.WeakSet()
        _active = None
        return False

    def _patch(self, owner, name, new):
        had = name in owner.__dict__
        self._patches.append((owner, name, owner.__dict__.get(name), had))
        setattr(owner, name, new)

    def _uninstall(self) -> None:
        for owner, name, old, had in reversed(self._patches):
            if had:
                setattr(owner, name, old)
            else:
                delattr(owner, name)
        self._patches = []

    def _install(self) -> None:
        tf = tensorflow()
        import keras
        from keras.src.backend.tensorflow.trainer import TensorFlowTrainer

        card = self
        call, train_step = keras.Model.__call__, TensorFlowTrainer.train_step
        make_train_function = TensorFlowTrainer.make_train_function

        def guarded_call(model, *args, **kwargs):
            depth = getattr(_local, "depth", 0)
            training = kwargs.get("training")
            if depth or not (training is True or getattr(_local, "train_step", False)):
                _local.depth = depth + 1
                try:
                    return call(model, *args, **kwargs)
                finally:
                    _local.depth = depth
            x = args[0] if args else kwargs.get("inputs")
            first = tf.nest.flatten(x)[0]
            batch = first.shape[0]
            if batch is not None:
                card._check_now(model, int(batch))
            elif tf.inside_function():
                card._verify(model)
                ok = tf.py_function(card._runtime_check(model), [tf.shape(first)[0]],
                                    tf.bool)
                with tf.control_dependencies([ok]):
                    x = tf.nest.map_structure(tf.identity, x)
                args = (x, *args[1:]) if args else args
                if not args:
                    kwargs["inputs"] = x
            _local.depth = depth + 1
            try:
                return call(model, *args, **kwargs)
            finally:
                _local.depth = depth

        def flagged_train_step(model, data):
            before = getattr(_local, "train_step", False)
            _local.train_step = True
            try:
                return train_step(model, data)
            finally:
                _local.train_step = before

        def guarded_make_train_function(model, force=False):
            if model not in card._models:
                force = True  # traced before the card: trace again, with the guard
            result = make_train_function(model, force=force)
            fn = model.train_function
            if fn is not None and not getattr(fn, "_keras_virtual_gpu", False):
                model.train_function = _clean_errors(fn, card)
            card._models.add(model)
            return model.train_function if result is not None else result

        self._patch(keras.Model, "__call__", guarded_call)
        self._patch(TensorFlowTrainer, "train_step", flagged_train_step)
        self._patch(TensorFlowTrainer, "make_train_function", guarded_make_train_function)


def _clean_errors(fn, card: KerasVirtualGPU):
    """``fn`` (a traced Keras step function) whose simulated out-of-memory errors come out
    as TensorFlow's plain ``ResourceExhaustedError`` (without the graph's traceback text)."""
    tf = tensorflow()

    def step_function(*args, **kwargs):
        card._pending = None
        try:
            return fn(*args, **kwargs)
        except tf.errors.ResourceExhaustedError:
            record, card._pending = card._pending, None
            if record is None:
                raise
        raise tf.errors.ResourceExhaustedError(None, None, record.message)

    step_function._keras_virtual_gpu = True
    return step_function


def _single_input(model) -> bool:
    try:
        shape = model.input_shape
    except (AttributeError, ValueError):
        return False
    return isinstance(shape, tuple) and all(d is None or isinstance(d, int) for d in shape)
