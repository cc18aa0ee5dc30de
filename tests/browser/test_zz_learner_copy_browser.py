"""A learner copy as JupyterLab shows it (issue 17): lessons/08_oom_challenge.ipynb opened,
not run. Its setup and check cells must be read-only and undeletable in the UI (the
``editable``/``deletable`` metadata JupyterLab honours), the check cells collapsed to their
``# Check: ...`` line, the exercise cells editable, and the cell that asks for a prediction
must show no result yet. A screenshot of the challenge goes to test-artifacts/.

The file name sorts it after the other browser tests: with it first, their waits for a live
plot to start timed out in two CI runs out of four (each passed on a rerun).
"""

from __future__ import annotations

import pytest
from playwright.sync_api import Page, expect

from helpers.authoring import build

from .test_widgets_browser import notebook

pytestmark = pytest.mark.browser

CELL_STATES = """() => window.jupyterapp.shell.currentWidget.content.widgets.map(c => ({
  type: c.model.type,
  first: c.model.sharedModel.getSource().split("\\n")[0],
  readOnly: c.readOnly,
  inputHidden: c.inputHidden,
  deletable: c.model.getMetadata("deletable"),
  tags: c.model.getMetadata("tags") || [],
  exercise: !!c.model.getMetadata("exercise"),
  outputs: c.model.type === "code" ? c.model.outputs.length : 0,
}))"""

SCROLL_TO = """(index) => {
  const nb = window.jupyterapp.shell.currentWidget.content;
  nb.activeCellIndex = index;
  nb.widgets[index].node.scrollIntoView({block: "center"});
}"""


def test_lesson_08_learner_copy_locks_collapses_and_hides_predictions(page: Page, lab):
    page.goto(lab.open_url("08_oom_challenge.ipynb"))
    panel = notebook(page)
    expect(panel).to_be_visible(timeout=60_000)
    # the panel shows before the notebook's content has loaded into it
    page.wait_for_function(f"() => ({CELL_STATES})().some(c => c.first.startsWith('# Check: '))",
                           timeout=60_000)
    cells = page.evaluate(CELL_STATES)
    code = [c for c in cells if c["type"] == "code"]

    setup = code[0]
    assert setup["first"].startswith("import "), setup
    assert setup["readOnly"] and setup["deletable"] is False

    n_exercises = len(build.exercises_in(build.SOLUTIONS / "08_oom_challenge.ipynb"))
    assert n_exercises >= 4  # three core challenges and one in Going further
    checks = [i for i, c in enumerate(cells) if c["first"].startswith("# Check: ")]
    assert len(checks) == n_exercises, [c["first"] for c in cells]
    for i in checks:
        c = cells[i]
        assert c["readOnly"] and c["deletable"] is False and c["inputHidden"], c

    exercises = [c for c in cells if c["exercise"]]
    assert len(exercises) == n_exercises
    assert not any(c["readOnly"] or c["inputHidden"] for c in exercises), exercises

    predict = [c for c in cells if "predict" in c["tags"]]
    assert predict and all(c["outputs"] == 0 for c in predict), predict

    # the collapsed check shows JupyterLab's placeholder, not the test body
    first_check = panel.locator(".jp-Cell").nth(checks[0])
    expect(first_check.locator(".jp-InputPlaceholder")).to_be_visible()
    page.evaluate(SCROLL_TO, checks[0] - 1)
    page.wait_for_timeout(300)  # let the scroll settle before the picture
    page.screenshot(path=lab.artifacts / "lab-08-learner-copy-challenge.png")
    # the core challenge whose fix is an edit of the script's own loop
    own_loop = next(i for i, c in enumerate(cells) if c["first"].startswith("# Write fixed_loop"))
    page.evaluate(SCROLL_TO, own_loop)
    page.wait_for_timeout(300)
    page.screenshot(path=lab.artifacts / "lab-08-learner-copy-fix-the-loop.png")
    # nothing ran: shut the kernel JupyterLab started, so it does not load the later tests
    page.evaluate("() => window.jupyterapp.shell.currentWidget.sessionContext.shutdown()")
