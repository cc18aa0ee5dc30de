"""Re-running a gauge cell 50 times in a real kernel leaves one polling thread (lesson 04)."""

import os

import pytest

pytestmark = pytest.mark.slow


def test_fifty_cell_reruns_in_a_live_kernel_leave_one_polling_thread():
    from jupyter_client.manager import start_new_kernel

    # a live-notebook kernel (not headless), so every gauge also builds its widget
    env = {k: v for k, v in os.environ.items()
           if k not in ("GPU_LESSONS_HEADLESS", "PYTEST_CURRENT_TEST")}
    km, kc = start_new_kernel(kernel_name="python3", env=env, startup_timeout=120)
    outputs = []

    def collect(msg):
        if msg["msg_type"] == "stream":
            outputs.append(msg["content"]["text"])
        elif msg["msg_type"] == "error":
            outputs.append("ERROR " + msg["content"]["evalue"])

    try:
        cell = "import helpers\ngauge = helpers.MemoryGauge(poll=0.25)\ngauge"
        for _ in range(50):
            reply = kc.execute_interactive(cell, timeout=120, output_hook=collect)
            assert reply["content"]["status"] == "ok", outputs
        kc.execute_interactive(
            "import threading\n"
            "print(helpers.core.runtime.mode(), gauge.widget() is not None)\n"
            "print(helpers.watch.gauge.polling_threads())\n"
            "print(sum(t.name.endswith('-poller') for t in threading.enumerate()))",
            timeout=60, output_hook=collect)
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
    assert "".join(outputs).split("\n")[:3] == [
        "jupyter True", "['helpers-gauge-poller']", "1"], outputs
