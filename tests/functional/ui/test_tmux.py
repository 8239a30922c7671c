"""End to end in a real terminal: ckpt-tui inside tmux (a pty, as over SSH) at 80×24."""

import shutil
import subprocess
import sys
import time
import uuid

import pytest

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")


class Tmux:
    def __init__(self, cmd: str, env: dict):
        self.name = f"ckpt-{uuid.uuid4().hex[:8]}"
        envs = " ".join(f"{k}={v}" for k, v in env.items())
        subprocess.run(["tmux", "new-session", "-d", "-s", self.name, "-x", "80", "-y", "24",
                        f"env {envs} {cmd}; sleep 60"], check=True)

    def keys(self, *keys):
        """Send keys; what they do is waited for on the screen (wait_for), never assumed done."""
        for k in keys:
            subprocess.run(["tmux", "send-keys", "-t", self.name, k], check=True)

    def enter_through(self, *steps: str) -> None:
        """Press enter once per wizard step, each after the screen shows the step: a key pressed
        before the step is drawn could land on the previous one."""
        for label in steps:
            self.keys("Enter")
            self.wait_for(label)

    def screen(self) -> str:
        return subprocess.run(["tmux", "capture-pane", "-p", "-t", self.name], capture_output=True, text=True).stdout

    def wait_for(self, text: str, timeout: float = 40.0) -> str:
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            s = self.screen()
            if text in s:
                return s
            time.sleep(0.2)
        raise AssertionError(f"{text!r} not on screen:\n{self.screen()}")

    def wait_gone(self, text: str, timeout: float = 40.0) -> None:
        t0 = time.monotonic()
        while text in self.screen():
            if time.monotonic() - t0 > timeout:
                raise AssertionError(f"{text!r} still on screen:\n{self.screen()}")
            time.sleep(0.2)

    def wait_exited(self, timeout: float = 40.0) -> None:
        """Wait until ckpt-tui has exited: the pane runs the `sleep` that follows it."""
        t0 = time.monotonic()
        while self.command() != "sleep":
            if time.monotonic() - t0 > timeout:
                raise AssertionError(f"still running {self.command()!r}:\n{self.screen()}")
            time.sleep(0.2)

    def command(self) -> str:
        return subprocess.run(["tmux", "display-message", "-p", "-t", self.name, "#{pane_current_command}"],
                              capture_output=True, text=True).stdout.strip()

    def close(self):
        subprocess.run(["tmux", "kill-session", "-t", self.name], capture_output=True)


@pytest.mark.parametrize("term", ["xterm-256color", "screen"])
def test_export_from_the_keyboard_in_tmux(real_ckpt, tmp_path, term):
    ck = tmp_path / "checkpoint-2000"
    shutil.copytree(real_ckpt("hf-fsdp1") / "checkpoint-2", ck)
    exe = f"{sys.executable} -m ckpt_tui"
    env = {"TERM": term, "COLUMNS": "80", "LINES": "24"}
    if term == "screen":
        env["NO_COLOR"] = "1"
    t = Tmux(f"{exe} {ck}", env)
    try:
        t.wait_for("optimizer in")  # the scan is done: the summary line is in
        s = t.wait_for("OPTIM")
        assert "pytorch_model_fsdp_0/" in s and "MODEL" in s
        assert "optimizer_0/" in s and "● 1" in s  # the dcp-components finding, as a glyph
        t.keys("e")
        t.wait_for("Export to safetensors")
        t.wait_for("Step 1 of 5")
        t.enter_through("Step 2 of 5", "Step 3 of 5", "Step 4 of 5", "Step 5 of 5")  # source, output, dtype, shards
        t.wait_for("Press enter to export")
        t.keys("Enter")
        s = t.wait_for("Export finished")
        assert "verified" in s
        assert (tmp_path / "checkpoint-2000-safetensors" / "model.safetensors").is_file()
        t.keys("Enter")
        t.wait_gone("Export finished")
        t.keys("q")
        t.wait_exited()
    finally:
        t.close()


def test_second_user_report_convert_to_universal_in_tmux(real_ckpt, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    ck = run / "checkpoint-3"
    shutil.copytree(real_ckpt("hf-ds-zero2") / "checkpoint-2", ck)
    t = Tmux(f"{sys.executable} -m ckpt_tui {ck}", {"TERM": "xterm-256color"})
    try:
        t.wait_for("model and optimizer in")
        s = t.wait_for("universal-info-missing")
        assert "universal_checkpoint_info" in s
        t.keys("u")
        t.wait_for("Convert to a DeepSpeed universal")
        t.wait_for("Step 1 of 3")
        t.enter_through("Step 2 of 3", "Step 3 of 3")  # why, output
        t.wait_for("Press enter to convert", timeout=60)
        t.keys("Enter")
        s = t.wait_for("Universal checkpoint ready", timeout=240)
        assert "load_universal" in s
        assert (ck / "latest_universal").read_text().strip() == "global_step2_universal"
        t.keys("Enter")
        t.wait_gone("Universal checkpoint ready")
        t.keys("q")
        t.wait_exited()
    finally:
        t.close()
