"""reveal() in a real lesson in JupyterLab: the solution appears as a new cell, and works.

Runs lesson 01 as a learner would (every cell, exercises unsolved), then types
``helpers.reveal("01-device-agnostic")`` into a new cell at the end and runs it. JupyterLab
must insert the solution as a new cell right below, the highlighted code must be shown in
the output, and running the inserted cell followed by the lesson's own check must say
"solved". Screenshots go to test-artifacts/.
"""

from __future__ import annotations

import pytest
from playwright.sync_api import Page, expect

from .test_widgets_browser import errors_and_warnings, notebook, run_all, wait_for_idle_kernel

pytestmark = pytest.mark.browser

EXERCISE = "01-device-agnostic"

APPEND_AND_RUN = """async (source) => {
  const app = window.jupyterapp;
  const nb = app.shell.currentWidget.content;
  nb.activeCellIndex = nb.widgets.length - 1;
  await app.commands.execute("notebook:insert-cell-below");
  nb.activeCell.model.sharedModel.setSource(source);
  await app.commands.execute("notebook:run-cell");
  return nb.widgets.length;
}"""

SOURCES = "() => window.jupyterapp.shell.currentWidget.content.widgets" \
          ".map(c => c.model.sharedModel.getSource())"

RUN_CELL_AT = """async (index) => {
  const app = window.jupyterapp;
  const nb = app.shell.currentWidget.content;
  nb.activeCellIndex = index;
  await app.commands.execute("notebook:run-cell");
}"""


def test_reveal_inserts_the_solution_as_a_new_cell(page: Page, lab):
    page.goto(lab.open_url("01_pytorch_gpu.ipynb"))
    panel = notebook(page)
    expect(panel).to_be_visible(timeout=60_000)
    wait_for_idle_kernel(page)
    run_all(page)
    expect(panel.get_by_text(f"Challenge {EXERCISE}: not solved yet")).to_be_visible(
        timeout=180_000)
    wait_for_idle_kernel(page)
    before = page.evaluate(SOURCES)
    assert not any(s.startswith(f"# Solution of {EXERCISE}") for s in before)

    page.evaluate(APPEND_AND_RUN, f'helpers.reveal("{EXERCISE}")')
    wait_for_idle_kernel(page)
    # the highlighted solution is shown in the output of the reveal cell ...
    expect(panel.get_by_text(f"Solution of {EXERCISE}").first).to_be_visible(timeout=30_000)
    assert panel.locator(".jp-OutputArea-output .highlight").count() >= 1
    # ... and inserted as a new cell right below it, ready to run
    page.wait_for_function(f"() => ({SOURCES})().length === {len(before) + 2}",
                           timeout=30_000)
    after = page.evaluate(SOURCES)
    assert after[-2] == f'helpers.reveal("{EXERCISE}")'
    assert after[-1].startswith(f"# Solution of {EXERCISE}\n")
    assert "def train_step(" in after[-1]
    page.screenshot(path=lab.artifacts / "lab-01-reveal.png")

    # run the revealed solution, then the lesson's own check: it passes now
    page.evaluate(RUN_CELL_AT, len(after) - 1)
    wait_for_idle_kernel(page)
    page.evaluate(APPEND_AND_RUN, f'helpers.check("{EXERCISE}", test_train_step)')
    expect(panel.get_by_text(f"Challenge {EXERCISE}: solved").first).to_be_visible(
        timeout=60_000)
    wait_for_idle_kernel(page)
    assert errors_and_warnings(panel) == []
