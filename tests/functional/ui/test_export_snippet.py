"""The TUI's export-done dialog shows the same "Load it with" code as the CLI, literally, and it loads."""

import shutil

from ckpt_tui.core.export.api import plan_export
from ckpt_tui.ui.app import make_app
from tests.functional.ui.test_app import message_shown, screen_text, wait_for
from tests.snippets import run_load_snippet, snippet_after


async def test_export_done_dialog_shows_the_snippet_that_loads(real_ckpt, tmp_path):
    src = tmp_path / "ds-zero2-tied"
    shutil.copytree(real_ckpt("ds-zero2-tied"), src)
    app = make_app(src)
    async with app.run_test(size=(120, 60)) as pilot:
        await wait_for(pilot, lambda: app.report is not None)
        plan, _ = plan_export(src, tmp_path / "tui-out")  # the wizard passes the folder typed in its field
        job = app.main.run_export(plan)
        await wait_for(pilot, lambda: message_shown(app, "Load it with:"), timeout=60)
        shown = screen_text(app)
        code = job.result[0].load_code  # the export's results: one, or (both) the model's and the optimizer's
    # shown as is: the tied line's [brackets] are code, not markup
    assert "sd['lm_head.weight'] = sd['embed_tokens.weight']" in code
    assert "Load it with:\n" + "\n".join(f"  {ln}" if ln else "" for ln in code.splitlines()) in shown
    run_load_snippet(snippet_after(shown), tmp_path, "ds-zero2-tied")
