"""Lesson 04's gauge and live plot in a real JupyterLab (and Notebook 7), in headless Chromium.

Runs every cell of lessons/04_monitoring.ipynb through the JupyterLab UI and checks what a
learner sees: the gauge shows the right numbers and moves while the training cell runs, the
live plot appears and grows in place, nothing raises, and the gauge follows the dark theme.
Screenshots go to test-artifacts/.
"""

from __future__ import annotations

import re

import psutil
import pytest
from playwright.sync_api import Page, expect

pytestmark = pytest.mark.browser

GiB = 2**30

# Records every change of the first gauge and the first live plot, as it happens, so the
# test needs no sleeps: it only waits for conditions.
OBSERVE = """() => {
  window.__gl = [];
  let last = "";
  const snap = () => {
    const gauge = document.querySelector(".gl-gauge-widget .gl-gauge");
    const status = document.querySelector(".gl-liveplot-status");
    const line = document.querySelector(".gl-liveplot-svg .gl-line-loss");
    const s = {
      used: gauge ? gauge.dataset.usedBytes : null,
      steps: status ? Number(status.dataset.steps) : null,
      state: status ? status.dataset.state : null,
      points: line ? line.getAttribute("points").split(" ").filter(Boolean).length : null,
    };
    const key = JSON.stringify(s);
    if (key !== last) { last = key; window.__gl.push(s); }
  };
  new MutationObserver(snap).observe(document.body,
    {subtree: true, childList: true, attributes: true, characterData: true});
}"""

LIGHT_TEXT = """(e) => {
  const [r, g, b] = getComputedStyle(e).color.match(/\\d+/g).map(Number);
  return (0.299 * r + 0.587 * g + 0.114 * b) / 255 > 0.5;
}"""

# the plot has started, or already finished (what it showed on the way is asserted after)
STARTED = """() => (window.__gl || []).some(s => s.steps > 0 && (s.state === "running"
                                                              || s.state === "done"))"""


def notebook(page: Page):
    """The visible notebook panel (JupyterLab keeps hidden panels in the DOM)."""
    return page.locator(".jp-NotebookPanel:not(.lm-mod-hidden)")


KERNEL_IDLE = """() => {
  const panel = window.jupyterapp && window.jupyterapp.shell.currentWidget;
  const session = panel && panel.sessionContext;
  const kernel = session && session.session && session.session.kernel;
  return Boolean(session && session.isReady && kernel
                 && kernel.connectionStatus === "connected" && kernel.status === "idle");
}"""


def wait_for_idle_kernel(page: Page) -> None:
    """Wait until the notebook's kernel is connected and idle.  (Toolbar indicators say
    "idle" before a kernel exists; running cells then opens a dialog and hangs.)"""
    page.wait_for_function(KERNEL_IDLE, timeout=90_000)


def run_all(page: Page) -> None:
    page.evaluate("window.jupyterapp.commands.execute('notebook:run-all-cells')")


def errors_and_warnings(panel) -> list[str]:
    errors = panel.locator('[data-mime-type="application/vnd.jupyter.error"]').all_inner_texts()
    stderr = panel.locator('[data-mime-type="application/vnd.jupyter.stderr"]').all_inner_texts()
    return errors + [t for t in stderr if re.search(r"\w+(Warning|Error)\b", t)]


def stdout_line(panel, pattern: str) -> str:
    texts = panel.locator('[data-mime-type="application/vnd.jupyter.stdout"]').all_inner_texts()
    lines = [ln for t in texts for ln in t.splitlines() if re.match(pattern, ln)]
    assert lines, f"no printed line matches {pattern!r}"
    return lines[-1]


def check_gauge_numbers(gauge, printed: str) -> None:
    """The gauge shows exactly the reading the kernel printed, with the machine's total."""
    assert gauge.get_attribute("data-text") == printed
    label = gauge.get_attribute("data-label")
    total = int(gauge.get_attribute("data-total-bytes"))
    if label == "RAM":  # the server runs here: its RAM is this machine's
        assert total == psutil.virtual_memory().total
        assert f"/{total / GiB:.1f} GiB" in printed
        assert "source: this process's RSS against system RAM" in printed
    title = gauge.locator(".gl-gauge-title").inner_text()
    assert title.startswith(label) and "source:" in title
    for band in gauge.locator(".gl-band").all():  # every band carries its name as text
        name = band.get_attribute("class").split("gl-band-")[-1]
        assert name in (band.get_attribute("title") or "")


def luminance(css_colour: str) -> float:
    r, g, b = (int(v) for v in re.findall(r"\d+", css_colour)[:3])
    return (0.299 * r + 0.587 * g + 0.114 * b) / 255


def test_lesson_04_gauge_and_live_plot_in_jupyterlab(page: Page, lab):
    page.goto(lab.open_url("04_monitoring.ipynb"))
    panel = notebook(page)
    expect(panel).to_be_visible(timeout=60_000)
    wait_for_idle_kernel(page)
    page.evaluate(OBSERVE)
    run_all(page)

    # while the PyTorch training cell runs: the plot has drawn a frame with steps > 0 (a wait,
    # not a timing assert: on a loaded CI machine the first cells import torch slowly)
    page.wait_for_function(STARTED, timeout=300_000)
    live = panel.locator(".gl-liveplot").first
    live.screenshot(path=lab.artifacts / "lab-04-live-plot-during-training.png")

    # the whole lesson finishes: the last check cell has printed its verdict
    expect(panel.get_by_text("Challenge 04-plot-your-loop")).to_be_visible(timeout=180_000)
    wait_for_idle_kernel(page)
    page.screenshot(path=lab.artifacts / "lab-04-finished.png")
    assert errors_and_warnings(panel) == []

    seen = page.evaluate("window.__gl")
    during = []  # observations from the plot's first appearance until training finished
    for s in seen:
        if s["state"] is not None:
            during.append(s)
        if s["state"] == "done":
            break
    assert during and during[-1]["state"] == "done", seen[-5:]
    # the live plot grew in place: more steps and a new image several times, one widget
    steps = [s["steps"] for s in during]
    assert len(set(steps)) >= 3 and steps == sorted(steps), steps
    assert steps[-1] == 3 * (64 + 16 + 4)
    # ... and the drawn lines changed with them (point counts fall when buckets merge)
    points = [s["points"] for s in during if s["points"] is not None]
    assert len(set(points)) >= 3 and max(points) <= 240, points
    assert panel.locator(".gl-liveplot").count() == 3  # PyTorch, Keras, challenge: one each
    # the gauge moved while the training cell ran (polled from a background thread)
    assert len({s["used"] for s in during}) >= 2, during

    # the right numbers: the gauge shows the reading the last gauge cell printed
    gauge = panel.locator(".gl-gauge-widget .gl-gauge").first
    label = gauge.get_attribute("data-label")
    printed = stdout_line(panel, rf"{label} \[[#.]+\] ")
    check_gauge_numbers(gauge, printed)
    gauge.screenshot(path=lab.artifacts / "lab-04-gauge-light.png")
    # the watch view listed this machine's devices
    expect(panel.locator(".gl-watch-widget .gl-watch").first).to_be_visible()

    # theme variables: the gauge's text follows JupyterLab's light and dark themes
    title = gauge.locator(".gl-gauge-title")
    light = luminance(title.evaluate("e => getComputedStyle(e).color"))
    page.evaluate("window.jupyterapp.commands.execute('apputils:change-theme', "
                  "{theme: 'JupyterLab Dark'})")
    expect(page.locator("body[data-jp-theme-light='false']")).to_have_count(1, timeout=30_000)
    page.wait_for_function(LIGHT_TEXT, arg=title.element_handle(), timeout=30_000)
    dark = luminance(title.evaluate("e => getComputedStyle(e).color"))
    assert light < 0.5 < dark, (light, dark)
    gauge.screenshot(path=lab.artifacts / "lab-04-gauge-dark.png")
    live.screenshot(path=lab.artifacts / "lab-04-live-plot-dark-theme.png")


def test_gauge_and_live_plot_in_notebook_7(page: Page, lab):
    page.goto(lab.open_url(lab.notebook7, app="notebooks"))
    panel = page.locator(".jp-NotebookPanel").first
    expect(panel).to_be_visible(timeout=60_000)
    wait_for_idle_kernel(page)
    page.evaluate(OBSERVE)
    run_all(page)
    # a wait, not a threshold: the kernel imports torch first, slowly on a loaded CI machine
    page.wait_for_function(STARTED, timeout=300_000)
    expect(panel.get_by_text("| source:")).to_be_visible(timeout=60_000)
    page.screenshot(path=lab.artifacts / "notebook7-finished.png")
    assert errors_and_warnings(panel) == []
    seen = page.evaluate("window.__gl")
    steps = [s["steps"] for s in seen if s["steps"] is not None]
    assert len(set(steps)) >= 3 and steps[-1] == 300, steps
    gauge = panel.locator(".gl-gauge-widget .gl-gauge").first
    printed = stdout_line(panel, rf"{gauge.get_attribute('data-label')} \[[#.]+\] ")
    check_gauge_numbers(gauge, printed)
