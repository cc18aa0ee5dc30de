"""The TensorFlow side of :func:`helpers.find_batch_size`: Keras models and optimizers.

``helpers.batch_size`` imports this module only for a Keras model or optimizer (or for a
bare step where TensorFlow, and not PyTorch, is loaded). It gives the finder

* :func:`keras_kind`: is an object a Keras model or optimizer? (It looks at the Keras modules
  already imported and never imports TensorFlow, so it is safe to ask about anything.)
* :func:`keras_memory`: where the step's memory is measured: TensorFlow's allocator on the
  first GPU (else the CPU), the capacity to plan against (the GPU's total from NVML, or the
  CPU BFC allocator's limit) and what the GPU holds outside TensorFlow;
* :class:`KerasState`: the model's weights and the optimizer's variables, put back after
  every trial.

Out-of-memory errors (``ResourceExhaustedError``) are recognised by
:func:`helpers.memory.errors.is_oom_error`. Not used by a lesson yet (the Keras track will).
"""

from __future__ import annotations

import os
import sys

from ..memory.sources import MemorySource, NvmlSource, TensorFlowSource

__all__ = ["keras_kind", "keras_memory", "KerasState"]


def keras_kind(obj) -> str | None:
    """``"model"`` for a Keras model, ``"optimizer"`` for a Keras optimizer, else None.

    Only Keras modules already imported (``keras``, ``tf_keras``) are asked: an object can
    only be a Keras one if its module was imported, so nothing is imported here.
    """
    for name in ("keras", "tf_keras"):
        keras = sys.modules.get(name)
        if keras is None:
            continue
        if isinstance(obj, getattr(keras, "Model", ())):
            return "model"
        if isinstance(obj, getattr(getattr(keras, "optimizers", None), "Optimizer", ())):
            return "optimizer"
    return None


def keras_memory(capacity: int | None = None) -> tuple[MemorySource, int | None, int]:
    """Where a Keras step's memory is measured: ``(source, capacity, other)``.

    ``source`` reads TensorFlow's allocator on ``GPU:0``, else ``CPU:0`` (its ``available`` is
    False where TensorFlow keeps no statistics: the CPU without the BFC allocator).
    ``capacity`` is the one given, else the GPU's total from NVML, else the CPU BFC
    allocator's limit (``TF_CPU_BFC_MEM_LIMIT_IN_MB``), else None. ``other`` is the memory
    the GPU holds outside TensorFlow (the CUDA context, other processes; 0 where unknown).
    """
    import tensorflow as tf

    device = "GPU:0" if tf.config.list_physical_devices("GPU") else "CPU:0"
    source = TensorFlowSource(tf.config.experimental, device)
    other = 0
    if capacity is None and device.startswith("GPU"):
        nvml = NvmlSource(int(device.split(":")[1]))
        if nvml.available:
            capacity = nvml.total
            current = source.read() if source.available else 0
            other = max(0, nvml.read() - current)
    elif capacity is None:
        capacity = _tf_cpu_limit()
    return source, capacity, other


def _tf_cpu_limit() -> int | None:
    """The CPU BFC allocator's limit when TF_CPU_ALLOCATOR_USE_BFC / ..._MEM_LIMIT_IN_MB set it."""
    if os.environ.get("TF_CPU_ALLOCATOR_USE_BFC", "").lower() != "true":
        return None
    mb = os.environ.get("TF_CPU_BFC_MEM_LIMIT_IN_MB")
    try:
        return int(mb) * 1024**2 if mb else None
    except ValueError:
        return None


class KerasState:
    """Weights and optimizer variables of a Keras model, as numpy copies (host memory);
    :meth:`restore` puts them back."""

    def __init__(self, model, optimizer):
        self.model = model
        self.optimizer = optimizer
        self.weights = model.get_weights() if model is not None else None
        self.opt_values = ([v.numpy() for v in optimizer.variables]
                           if optimizer is not None else None)

    def restore(self) -> None:
        if self.weights is not None:
            self.model.set_weights(self.weights)
        if self.opt_values is not None:
            # variables made by the search (slots built on the first step) keep their shape
            for v, value in zip(self.optimizer.variables, self.opt_values, strict=False):
                v.assign(value)
