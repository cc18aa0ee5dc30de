"""What watching costs: the live plot's history cost and the gauge+plot step overhead.

    python benchmarks/widgets.py            (or `make bench`)

Prints two ratios measured side by side in this run:

1. history cost: one live-plot update (10 new steps, a frame, the status line) after 10,000
   recorded steps against after 100.  Target: at most 2x (the drawn lines are downsampled to a
   fixed number of points, so it should be ~1x).
2. step overhead: training lesson 04's models with a polling memory gauge and a live plot
   (frames rendered into real ipywidgets, as in JupyterLab) against training without them,
   interleaved block by block.  Target: at most 2% of step time; the plot's own account of
   its share is printed next to the measured one.

No thresholds are enforced here: on a shared machine timings wobble, and the measured step
overhead can come out negative; read the ratios and the self-reported share together. On a
busy 2-core machine run it as `OMP_NUM_THREADS=1 python benchmarks/widgets.py`, or torch's
two threads wait on each other and every step takes many times longer.
"""

from __future__ import annotations

import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import helpers  # noqa: E402
from helpers.core.fmt import Table, fmt_ratio, fmt_seconds  # noqa: E402
from helpers.watch.liveplot import LivePlot  # noqa: E402


def live(plot: LivePlot) -> LivePlot:
    """Render frames as in a notebook (into an ipywidgets.HTML), though no front end listens."""
    import ipywidgets

    plot._widget = ipywidgets.HTML()  # the live view's in-place frame
    if plot.gauge is not None and plot.gauge._widget is None:
        plot.gauge._widget = ipywidgets.HTML()
    return plot


def update_cost(history: int, repeats: int = 200) -> list[float]:
    plot = live(LivePlot("bench", gauge=helpers.MemoryGauge(), show=False))
    for i in range(history):
        plot.step(loss=1.0 / (i + 1), samples=32)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(10):
            plot.step(loss=0.5, samples=32)
        plot._tick()
        times.append(time.perf_counter() - t0)
    return times


def history_ratio() -> tuple[float, float, float]:
    small, large = [], []
    for _ in range(3):  # interleave, so drift in machine load hits both alike
        small += update_cost(100)
        large += update_cost(10_000)
    a, b = statistics.median(small), statistics.median(large)
    return a, b, b / a


def torch_steps(n_blocks: int = 16, block: int = 30):
    import torch
    from torch import nn

    helpers.setup(seed=0)
    x, y = helpers.image_data(1024, size=16)
    model = helpers.SmallCNN(width=8)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    loss_fn = nn.CrossEntropyLoss()
    batches = [(xb, yb) for xb, yb in helpers.torch_loader(x, y, 64)]

    def train(n, plot=None):
        t0 = time.perf_counter()
        for i in range(n):
            xb, yb = batches[i % len(batches)]
            loss = loss_fn(model(xb), yb)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if plot is not None:
                plot.step(loss=loss, samples=len(xb))
        return (time.perf_counter() - t0) / n

    train(20)  # warm up
    gauge = helpers.MemoryGauge(poll=0.5)
    plot = live(LivePlot("bench", gauge=gauge, show=False, total=n_blocks * block))
    plain, watched = [], []
    for i in range(n_blocks):  # alternate which goes first: no bias from the order
        if i % 2:
            watched.append(train(block, plot))
            plain.append(train(block))
        else:
            plain.append(train(block))
            watched.append(train(block, plot))
    gauge.stop()
    return statistics.median(plain), statistics.median(watched), plot.summary()


def keras_epochs(n_rounds: int = 12):
    helpers.core.environment.quiet_tensorflow_env()
    import keras

    keras.utils.set_random_seed(0)
    x, y = helpers.classification_data(2048, noise=4.0)
    model = keras.Sequential([keras.Input((32,)), keras.layers.Dense(128, activation="relu"),
                              keras.layers.Dense(4)])
    model.compile(optimizer="adam",
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(x, y, batch_size=64, epochs=1, verbose=0)  # build and trace first
    gauge = helpers.MemoryGauge(poll=0.5)
    plot = live(LivePlot("bench", gauge=gauge, show=False))
    plain, watched = [], []
    steps = len(x) // 64
    def fit(callbacks):
        t0 = time.perf_counter()
        model.fit(x, y, batch_size=64, epochs=1, verbose=0, callbacks=callbacks)
        return (time.perf_counter() - t0) / steps

    for i in range(n_rounds):  # alternate which goes first: no bias from the order
        if i % 2:
            watched.append(fit([plot.keras_callback(batch_size=64)]))
            plain.append(fit([]))
        else:
            plain.append(fit([]))
            watched.append(fit([plot.keras_callback(batch_size=64)]))
    gauge.stop()
    return statistics.median(plain), statistics.median(watched), plot.summary()


def main() -> None:
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPU cores; "
          f"memory source: {helpers.read_memory().source}")
    a, b, ratio = history_ratio()
    rows = [["live-plot update, 100 steps recorded", fmt_seconds(a), ""],
            ["live-plot update, 10,000 steps recorded", fmt_seconds(b), ""],
            ["  history cost ratio (target <= 2x)", fmt_ratio(ratio), ""]]
    for name, (plain, watched, summary) in (("SmallCNN (PyTorch)", torch_steps()),
                                            ("Keras MLP (model.fit)", keras_epochs())):
        rows += [
            [f"{name}: step, plain", fmt_seconds(plain), ""],
            [f"{name}: step, gauge + live plot", fmt_seconds(watched), ""],
            [f"  {name} step overhead (target <= 2%)",
             f"~{100 * (watched / plain - 1):+.1f}%",
             f"self-reported ~{100 * summary.overhead_share:.2f}% "
             f"({summary.redraws} frames)"],
        ]
    print(Table(["measurement", "value", "note"], rows,
                title="benchmarks/widgets.py: what watching costs (measured in this run)"))


if __name__ == "__main__":
    main()
