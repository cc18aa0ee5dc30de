"""How well a Keras step's memory line extrapolates, and what each measurement costs.

    python benchmarks/keras_memory.py [--batches 64,128,192,256] [--check 384] [--steps 5]
                                      [--isolate]

Builds helpers.keras_resnet() (the 32-px CIFAR ResNet of lesson 05's Keras section: widths
16/32/64, Adam), runs helpers.measure_keras_memory and prints the line, each point's
residual, the per-sample slopes between neighbours, the held-out error, and how long each
measurement took, as a ratio to the first (no thresholds: the numbers depend on the
machine).
"""

from __future__ import annotations

import argparse
import time

import helpers


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", default="64,128,192,256")
    parser.add_argument("--check", type=int, default=384)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--isolate", action="store_true",
                        help="one fresh process per batch size, one inter-op thread")
    args = parser.parse_args()
    helpers.setup(seed=0, tensorflow=True)
    batches = [int(b) for b in args.batches.split(",")]
    start = time.perf_counter()
    fit = helpers.measure_keras_memory(helpers.keras_resnet, batches, check_batch=args.check,
                                       steps=args.steps, isolate=args.isolate)
    total = time.perf_counter() - start
    print(fit.text())
    print("residuals: " + ", ".join(f"batch {b}: {r / 2**20:+.2f} MiB ({f * 100:+.2f} %)"
                                     for b, r, f in zip(fit.batch_sizes, fit.residuals,
                                                        fit.residual_fractions, strict=True)))
    print(f"held-out error at batch {fit.check_batch}: {fit.check_error * 100:+.2f} %")
    print("step peaks (MiB): " + "; ".join(
        f"{b}: " + ", ".join(f"{p / 2**20:.1f}" for p in peaks)
        for b, peaks in zip([*fit.batch_sizes, fit.check_batch], fit.step_peaks,
                            strict=True)))
    first = fit.seconds[0]
    print("time per measurement (ratio to the first, batch "
          f"{fit.batch_sizes[0]}): " + ", ".join(
              f"{b}: {helpers.fmt_ratio(s / first)}"
              for b, s in zip([*fit.batch_sizes, fit.check_batch], fit.seconds, strict=True)))
    print(f"whole measurement: {helpers.fmt_seconds(total)}")


if __name__ == "__main__":
    main()
