"""The "Resume under torch FSDP2" wizard (`m`) on a real DeepSpeed run: why, where, the plan, the job, and
the load code at the end; dimmed where there is no DeepSpeed checkpoint."""

import shutil

from ckpt_tui.core.convert.torch_dcp import load_code
from ckpt_tui.ui.app import make_app
from ckpt_tui.ui.screens.wizards import ResumeWizard
from tests.functional.ui.test_app import message_shown, plan_in_tag_wizard, screen_text, wait_for


async def test_resume_wizard_converts_and_shows_the_load_code(real_ckpt, tmp_path):
    ck = tmp_path / "run" / "checkpoint"
    shutil.copytree(real_ckpt("ds-resume-zero2") / "checkpoint", ck)
    app = make_app(ck)
    async with app.run_test(size=(100, 30)) as pilot:
        wiz = await plan_in_tag_wizard(pilot, app, "m", ResumeWizard, "fully_shard")
        out = tmp_path / "run-checkpoint-torch-dcp"  # outside the run folder
        assert wiz.plan.out == out
        await pilot.press("enter")
        await wait_for(pilot, lambda: message_shown(app, "set_state_dict(model, optimizer"), timeout=120)
        assert "Ready to resume under torch FSDP2" in screen_text(app)
        assert (out / ".metadata").is_file() and (out / "conversion.json").is_file()
        # the dialog's code is the code the CLI prints for this output (run by test_convert_torch_dcp)
        assert load_code(wiz.plan) in app.screen.body.plain


async def test_resume_is_dimmed_without_a_deepspeed_checkpoint(real_ckpt):
    app = make_app(real_ckpt("fsdp2-dcp"))
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_for(pilot, lambda: app.report is not None)
        main = app.main
        assert main.why_not("resume_fsdp2") == "no DeepSpeed ZeRO checkpoint here"
        assert main.check_action("resume_fsdp2", ()) is None
        await pilot.press("m")
        await pilot.pause(0.2)
        assert not isinstance(app.screen, ResumeWizard)
