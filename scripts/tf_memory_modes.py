"""Set ONE of TensorFlow's GPU memory settings in a fresh process, and show what it did.

    python scripts/tf_memory_modes.py growth            # memory growth on every GPU
    python scripts/tf_memory_modes.py limit --mib 1024  # each GPU capped at 1024 MiB
    python scripts/tf_memory_modes.py default           # neither: TensorFlow's own default

TensorFlow documents growth and a limit as alternatives: "Memory growth cannot be configured
on a PhysicalDevice with virtual devices configured" (tf.config.experimental.set_memory_growth).
In TensorFlow 2.21 (tensorflow/python/eager/context.py):

* limit, then growth: ``set_memory_growth`` raises
  ``ValueError: Cannot set memory growth on device when virtual devices configured``;
* growth, then limit: both calls return, but growth is dropped without a word:
  ``_compute_device_options`` sets ``allow_growth`` only when no virtual devices exist.

Both must be set before TensorFlow initialises its GPUs, and then cannot change
(``RuntimeError``). So this script applies exactly one mode and is run once per mode.
``TF_FORCE_GPU_ALLOW_GROWTH`` (``helpers.setup`` sets it) turns growth on inside TensorFlow's
allocator whatever the Python settings say, so the script removes it from its own
environment before importing TensorFlow: only the mode decides.

On a GPU it prints what it applied, reads the settings back, and shows GPU 0's memory in use
(NVML, the whole card, as nvidia-smi) before and after ``import tensorflow``, after the GPU
devices are initialised (``tf.config.list_logical_devices``) and after the first operation.
It exits 1 when a setting did not take. ``default`` maps nearly all of every GPU: run it only
on a GPU you have to yourself. Without a GPU there is nothing to configure: it says so.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODES = {
    "growth": "memory growth on every GPU: start small, take more as needed",
    "limit": "each GPU becomes one logical GPU of at most --mib MiB; memory growth is not set",
    "default": "no setting: TensorFlow maps nearly all of every GPU it sees",
}
DEFAULT_MIB = 1024
FORCE_GROWTH = "TF_FORCE_GPU_ALLOW_GROWTH"
QUIET = {"TF_CPP_MIN_LOG_LEVEL": "2", "TF_ENABLE_ONEDNN_OPTS": "0"}
MiB = 2**20


def _positive_mib(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--mib must be a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"--mib must be at least 1, got {value}")
    return value


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="\n".join(f"{m}: {what}" for m, what in MODES.items()))
    p.add_argument("mode", choices=list(MODES), help="the one setting this process makes")
    p.add_argument("--mib", type=_positive_mib, default=None,
                   help=f"the limit in MiB (mode limit only; default {DEFAULT_MIB})")
    args = p.parse_args(argv)
    if args.mib is not None and args.mode != "limit":
        p.error(f"--mib applies to mode limit only, not to {args.mode}")
    if args.mode == "limit" and args.mib is None:
        args.mib = DEFAULT_MIB
    return args


def apply_mode(tf, gpus, mode: str, mib: int | None) -> list[str]:
    """Make the one setting of ``mode``; return what was called, in words."""
    if mode == "growth":
        for gpu in gpus:
            tf.config.experimental.set_memory_growth(gpu, True)
        return [f"growth: tf.config.experimental.set_memory_growth({_short(g)}, True)"
                for g in gpus]
    if mode == "limit":
        for gpu in gpus:
            config = [tf.config.LogicalDeviceConfiguration(memory_limit=mib)]
            tf.config.set_logical_device_configuration(gpu, config)
        return [f"limit: tf.config.set_logical_device_configuration({_short(g)}, "
                f"[LogicalDeviceConfiguration(memory_limit={mib})])" for g in gpus]
    return []


def read_back(tf, gpus) -> list[tuple[str, bool, list[int] | None]]:
    """(device, memory growth, logical device limits in MiB or None) for every GPU."""
    rows = []
    for gpu in gpus:
        config = tf.config.get_logical_device_configuration(gpu)
        limits = None if config is None else [c.memory_limit for c in config]
        rows.append((_short(gpu), bool(tf.config.experimental.get_memory_growth(gpu)), limits))
    return rows


def check(mode: str, mib: int | None, settings) -> list[str]:
    """What contradicts ``mode`` in the read-back settings (empty: the mode took, alone)."""
    wrong = []
    for name, growth, limits in settings:
        want_growth = mode == "growth"
        want_limits = [mib] if mode == "limit" else None
        if growth != want_growth:
            wrong.append(f"{name}: memory growth is {growth}, mode {mode} wants {want_growth}")
        if limits != want_limits:
            wrong.append(f"{name}: logical devices {limits}, mode {mode} wants {want_limits}")
    return wrong


def _short(device) -> str:
    return device.name.replace("/physical_device:", "")


def _nvml_used():
    """GPU 0's memory in use (NVML, whole card), or None without NVML."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    from helpers.core import nvml

    memory = nvml.gpu_memory(0)
    return None if memory is None else memory.used_bytes


def _memory_table(used: list[tuple[str, int]]) -> str:
    from helpers.core.fmt import Table, fmt_mib

    rows = [[when, "~" + fmt_mib(n, 0)] for when, n in used]
    return str(Table(["GPU 0 (NVML, whole card)", "memory in use (MiB)"], rows))


def nvml_checks(mode: str, mib: int | None, used: dict[str, int], total: int) -> list[str]:
    """What the NVML figures contradict: a limit's pool is taken by the first operation
    (growth is off), growth takes far less than the card."""
    taken = used["after the first operation"] - used["before import tensorflow"]
    if mode == "limit" and taken < mib * MiB:
        return [f"limit: only {taken / MiB:.0f} MiB taken by the first operation, expected "
                f"the whole {mib} MiB pool (is {FORCE_GROWTH} set?)"]
    if mode == "growth" and taken > total / 2:
        return [f"growth: {taken / MiB:.0f} MiB taken, more than half of the card"]
    return []


def main(argv=None) -> int:
    args = parse_args(argv)
    removed = os.environ.pop(FORCE_GROWTH, None)
    for key, value in QUIET.items():
        os.environ.setdefault(key, value)
    print(f"mode {args.mode}: {MODES[args.mode].replace('--mib', str(args.mib))}")
    before = _nvml_used()
    import tensorflow as tf

    after_import = _nvml_used()
    gpus = tf.config.list_physical_devices("GPU")
    if not gpus:
        print("no GPU: nothing to configure (TensorFlow sees "
              f"{', '.join(_short(d) for d in tf.config.list_physical_devices())} only)")
        return 0
    if removed is not None:
        print(f"{FORCE_GROWTH}={removed} removed from this process: only the mode decides")
    for line in apply_mode(tf, gpus, args.mode, args.mib):
        print("applied:", line)
    settings = read_back(tf, gpus)
    for name, growth, limits in settings:
        print(f"read back: {name} memory growth {growth}, logical devices "
              f"{'none' if limits is None else [f'{n} MiB' for n in limits]}")
    wrong = check(args.mode, args.mib, settings)
    tf.config.list_logical_devices("GPU")  # initialises the GPU devices
    after_init = _nvml_used()
    with tf.device("/GPU:0"):
        first = tf.zeros((256, 256)) + 1.0  # the first operation
    first.numpy()
    after_first = _nvml_used()
    if before is not None:
        used = {"before import tensorflow": before, "after import tensorflow": after_import,
                "after the GPU devices are initialised": after_init,
                "after the first operation": after_first}
        print(_memory_table(list(used.items())))
        from helpers.core import nvml

        wrong += nvml_checks(args.mode, args.mib, used, nvml.gpu_memory(0).total_bytes)
    else:
        print("NVML not available: no memory figures")
    for line in wrong:
        print("NOT APPLIED:", line)
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
