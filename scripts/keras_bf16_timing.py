"""Time a Keras training step in float32 and mixed_bfloat16, in a process of its own.

    python scripts/keras_bf16_timing.py                  # oneDNN at TensorFlow's default
    python scripts/keras_bf16_timing.py --onednn off     # as in the lessons (helpers.setup)
    python scripts/keras_bf16_timing.py --json           # one JSON line instead of the table
    python scripts/keras_bf16_timing.py --policy mixed_float16   # fp16 instead (GPUs)

Why a process of its own: ``TF_ENABLE_ONEDNN_OPTS`` is read once, when TensorFlow starts.
``helpers.setup`` sets it to ``0`` in every lesson kernel (the kit needs TensorFlow's BFC
allocator statistics, and oneDNN off keeps the start quiet). oneDNN is also what makes
TensorFlow's bf16 fast on CPUs with AVX512-BF16 or AMX instructions, so a bf16 timing taken in
a lesson kernel measures the kit's setting, not the processor. This script removes the
variable (``--onednn default``, TensorFlow's default: oneDNN on, on x86 CPUs) or sets it to
``0`` (``--onednn off``) *before* importing TensorFlow, then times lesson 07's classifier
(256 -> 512 -> 512 -> 10, softmax in float32) with ``train_on_batch`` on one batch,
interleaved rounds, best of each (``helpers.compare_times``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ONEDNN = "TF_ENABLE_ONEDNN_OPTS"
POLICIES = ("mixed_bfloat16", "mixed_float16")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--onednn", choices=("default", "off"), default="default",
                   help="default: TF_ENABLE_ONEDNN_OPTS unset (TensorFlow's default); "
                        "off: TF_ENABLE_ONEDNN_OPTS=0 (helpers.setup's)")
    p.add_argument("--policy", choices=POLICIES, default=POLICIES[0],
                   help="the mixed policy timed against float32 (default mixed_bfloat16)")
    p.add_argument("--batch", type=int, default=512, help="samples per step (default 512)")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds (default 3)")
    p.add_argument("--json", action="store_true", help="print one JSON line")
    args = p.parse_args(argv)
    for name in ("batch", "rounds"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be at least 1, got {getattr(args, name)}")
    return args


def configure(onednn: str, environ=os.environ) -> None:
    """Set the environment TensorFlow will start with (call before importing it)."""
    environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if onednn == "default":
        environ.pop(ONEDNN, None)
    else:
        environ[ONEDNN] = "0"


def build_classifier(keras):
    """Lesson 07's classifier; its softmax output always computes in float32."""
    classes = 10
    return keras.Sequential([
        keras.Input((256,)),
        keras.layers.Dense(512, activation="relu"),
        keras.layers.Dense(512, activation="relu"),
        keras.layers.Dense(classes),
        keras.layers.Softmax(dtype="float32"),  # the output layer in float32, as lesson 07 teaches
    ])


def main(argv=None) -> int:
    args = parse_args(argv)
    configure(args.onednn)
    import tensorflow as tf  # noqa: F401  (after configure: TensorFlow reads the variable once)

    sys.path.insert(0, str(ROOT))
    import helpers

    keras = tf.keras
    if args.policy == "mixed_float16" and not tf.config.list_physical_devices("GPU"):
        print("note: mixed_float16 on a CPU is very slow with oneDNN on", file=sys.stderr)
    keras.utils.set_random_seed(0)
    x, y = helpers.classification_data(n_samples=args.batch, n_features=256, n_classes=10)
    models = {}
    for policy in ("float32", args.policy):
        with helpers.keras_policy(policy):
            model = build_classifier(keras)
        model.compile(optimizer=keras.optimizers.Adam(1e-3),
                      loss="sparse_categorical_crossentropy")
        models[policy] = model
    times = helpers.compare_times(
        {policy: (lambda m=m: m.train_on_batch(x, y)) for policy, m in models.items()},
        rounds=args.rounds, warmup=1)
    setting = helpers.onednn_setting()
    if args.json:
        print(json.dumps({"onednn": setting, "batch": args.batch, "policy": args.policy,
                          "seconds": times.best_seconds,
                          "speedup": times.speedup(args.policy)}))
    else:
        print(times)
        print(f"{args.policy} ran {helpers.fmt_ratio(times.speedup(args.policy))} as fast as "
              f"float32, with {setting}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
