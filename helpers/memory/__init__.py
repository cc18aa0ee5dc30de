"""Exact memory accounting for training steps, and a virtual GPU that really runs out of memory.

The kit's memory lessons (04-08) stand on this package.  Public names are exported lazily from
:mod:`helpers` (``helpers.VirtualGPU``, ``helpers.measure_step``, ...); this ``__init__`` imports
nothing heavy, and only the modules that need torch (``engine``, ``virtual``, ``measure``,
``cuda_standin``) import it, when they are used.  Nothing here imports TensorFlow.

Modules:

* :mod:`.sources`   -- ``MemorySource``: the one place that reads memory counters (virtual
  GPU, CUDA, TensorFlow's allocator handed in by ``helpers.tf``, process RAM, NVML);
* :mod:`.errors`    -- which errors are out-of-memory errors, and releasing a failed step;
* :mod:`.capacity`  -- ``parse_capacity`` and ``KNOWN_GPUS`` (driver-reported card totals);
* :mod:`.allocator` -- exact counting and a simulation of PyTorch's CUDA caching allocator;
* :mod:`.state`     -- ``current_virtual_gpu()`` (no torch needed to ask);
* :mod:`.engine`    -- the dispatch mode that sees every tensor storage come and go;
* :mod:`.virtual`   -- ``VirtualGPU`` and ``full_scale`` (fake tensors);
* :mod:`.measure`   -- ``measure_step``;  :mod:`.report` -- ``MemoryReport`` and its timeline;
* :mod:`.cuda_standin` -- ``SimulatedCuda``, a ``torch.cuda`` stand-in for rehearsals.
* :mod:`.notebook_cuda` -- ``virtual_cuda``: plain CUDA code in notebook cells on a virtual card.

``measure_keras_memory`` (TensorFlow/Keras) lives in :mod:`helpers.tf.memory_fit`.
"""

from ..core import lazy_submodules as _lazy_submodules

__getattr__ = _lazy_submodules(__name__)
