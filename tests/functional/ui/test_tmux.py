"""End to end in a real terminal: ckpt-tui inside tmux (a pty, as over SSH) at 80×24."""

import shutil
import sys

import pytest

from tests.tmux import HAVE_TMUX, Tmux

pytestmark = pytest.mark.skipif(not HAVE_TMUX, reason="tmux is not installed")


@pytest.mark.parametrize("term", ["xterm-256color", "screen"])
def test_export_from_the_keyboard_in_tmux(real_ckpt, tmp_path, term):
    ck = tmp_path / "checkpoint-2000"
    shutil.copytree(real_ckpt("hf-fsdp1") / "checkpoint-2", ck)
    exe = f"{sys.executable} -m ckpt_tui"
    env = {"TERM": term, "COLUMNS": "80", "LINES": "24"}
    if term == "screen":
        env["NO_COLOR"] = "1"
    with Tmux(f"{exe} {ck}", env) as t:
        t.wait_for("optimizer in")  # the scan is done: the summary line is in
        # the tree's roles and the dcp-components finding, as a glyph
        t.wait_for_all("OPTIM", "pytorch_model_fsdp_0/", "MODEL", "optimizer_0/", "● 1")
        s = t.export_with_defaults()
        assert "verified" in s
        assert (tmp_path / "checkpoint-2000-safetensors" / "model.safetensors").is_file()
        assert t.close_dialog_and_quit("Export finished") == 0


def test_second_user_report_convert_to_universal_in_tmux(real_ckpt, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    ck = run / "checkpoint-3"
    shutil.copytree(real_ckpt("hf-ds-zero2") / "checkpoint-2", ck)
    with Tmux(f"{sys.executable} -m ckpt_tui {ck}", {"TERM": "xterm-256color"}) as t:
        t.wait_for("model and optimizer in")
        t.wait_for_all("universal-info-missing", "universal_checkpoint_info")
        t.keys("u")
        t.wait_for("Convert to a DeepSpeed universal")
        t.wait_for("Step 1 of 3")
        t.enter_through("Step 2 of 3", "Step 3 of 3")  # why, output
        t.wait_for("Press enter to convert", timeout=60)
        t.keys("Enter")
        t.wait_for_all("Universal checkpoint ready", "load_universal", timeout=240)
        assert (ck / "latest_universal").read_text().strip() == "global_step2_universal"
        t.keys("Enter")
        t.wait_gone("Universal checkpoint ready")
        t.keys("q")
        assert t.exit_code() == 0


def test_names_follow_the_terminal_width_in_tmux(real_ckpt):
    """At 120 columns the tree shows whole file names; narrowed to 80 the tensor table redraws its columns for the
    new width: the shape stays and each name keeps its layer index (issue 12)."""
    ck = real_ckpt("hf-ds-zero2")
    # without COLUMNS/LINES (the test run sets them): the size comes from the terminal, and follows its resize
    with Tmux(
        f"env -u COLUMNS -u LINES {sys.executable} -m ckpt_tui {ck.name}",
        {"TERM": "xterm-256color"},
        size=(120, 40),
        cwd=ck.parent,
    ) as t:
        t.wait_for("optimizer in")
        t.keys("j")  # the cursor starts on the run (its run view): down to checkpoint-2/, its tensors
        t.wait_for("model.layers.0.self_attn.q_proj.weight")  # 120 columns: the table's names whole
        t.keys("j", "Enter")  # open global_step2/ below checkpoint-2/
        t.wait_for_all("bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt 694.9 kB", "mp_rank_00_model_states.pt 237.7 kB")
        t.resize(80, 24)
        s = t.wait_for("model.layers.0…q_proj.weight")
        line = next(x for x in s.splitlines() if "model.layers.0…q_proj.weight" in x)
        assert "64×64" in line  # the shape is on the same row
        t.keys("q")
        assert t.exit_code() == 0


def test_errors_first_model_states_tensors_and_stats_in_tmux(real_ckpt, tmp_path):
    """Issue 12's data, in a real terminal at 120×40: with a dangling `latest` (an error) and no
    universal_checkpoint_info (a warning) the error is the first finding shown; a DeepSpeed model-states
    file lists its tensors; `s` fills the min/max columns."""
    d = tmp_path / "ds"
    shutil.copytree(real_ckpt("ds-zero2-bf16"), d)
    (d / "latest").write_text("global_step999")
    with Tmux(
        f"env -u COLUMNS -u LINES {sys.executable} -m ckpt_tui ds",
        {"TERM": "xterm-256color"},
        size=(120, 40),
        cwd=tmp_path,
    ) as t:
        s = t.wait_for("universal-info-missing")
        first = [ln for ln in s.splitlines() if "latest-dangling" in ln or "universal-info-missing" in ln]
        assert "latest-dangling" in first[0], s  # the error leads the details pane
        t.wait_for("17 tensors")  # the model component's table (fp32 masters)
        t.keys("s")  # statistics of the selected component fill the table's min/max columns
        s = t.wait_for(" max ")
        row = next(ln for ln in s.splitlines() if "embed_t" in ln and "256×64" in ln)  # the embedding's row
        assert sum(ch.isdigit() for ch in row.split("256×64", 1)[1]) >= 4, row  # min and max are numbers
        t.keys("j", "j", "j")  # global_step2/ -> optim rank 0 -> optim rank 1 -> mp_rank_00_model_states.pt
        s = t.wait_for("module.embed_tokens.weight")  # its module tensors as the file holds them
        row = next(ln for ln in s.splitlines() if "module.embed_tokens.weight" in ln)
        assert "bf16" in row and "256×64" in row  # the training dtype, not the fp32 masters
        t.keys("q")
        assert t.exit_code() == 0
