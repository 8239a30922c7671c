"""The CLI's contract: exit codes, stderr messages, JSON with schema_version, no traceback."""

import json
import os
import subprocess
import sys

import torch
from click.testing import CliRunner

from ckpt_tui.cli import main_group
from tests.util import as_nobody


def run(*args, cwd=None):
    return subprocess.run(
        [sys.executable, "-m", "ckpt_tui", *args], capture_output=True, text=True, cwd=cwd, timeout=120
    )


def test_version_and_help_do_not_import_torch():
    r = run("--version")
    assert r.returncode == 0 and "ckpt-tui" in r.stdout
    code = (
        "import sys; from ckpt_tui.cli import main\n"
        "try:\n    main(['--help'])\nexcept SystemExit as e:\n    assert e.code == 0\n"
        "bad = [m for m in ('torch', 'deepspeed', 'textual', 'textual_plotext', 'plotext') if m in sys.modules]\n"
        "print('IMPORTED', bad)"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert "IMPORTED []" in r.stdout, r.stdout + r.stderr
    assert "Exit codes" in r.stdout


def test_missing_path_is_exit_2_with_message(tmp_path):
    r = run("inspect", str(tmp_path / "nope"))
    assert r.returncode == 2
    assert "no such file or folder" in r.stderr and "Traceback" not in r.stderr and r.stdout == ""


def test_bad_usage_is_exit_2():
    r = run("inspect", "--no-such-flag")
    assert r.returncode == 2 and "Traceback" not in r.stderr


def test_empty_folder_is_not_a_checkpoint(tmp_path):
    r = run("inspect", str(tmp_path), "--json")
    assert r.returncode == 1
    doc = json.loads(r.stdout)
    assert doc["schema_version"] == 1 and doc["layout"] == "unknown"
    assert [f["code"] for f in doc["findings"]] == ["not-a-checkpoint"]


def test_permission_denied_folder_and_file(shared_tmp):
    base = str(shared_tmp)
    locked = os.path.join(base, "locked")
    os.mkdir(locked)
    ck = os.path.join(base, "ck")
    os.mkdir(ck)
    torch.save({"w": torch.ones(2)}, os.path.join(ck, "model.pt"))
    os.chmod(ck, 0o755)
    os.chmod(os.path.join(ck, "model.pt"), 0)
    os.chmod(locked, 0)

    def child():
        out = {}
        for name, path in (("dir", locked), ("file", ck)):
            res = CliRunner().invoke(main_group, ["inspect", path, "--json"])
            out[name] = [res.exit_code, res.output]
        return out

    try:
        out = as_nobody(child)
    finally:
        os.chmod(locked, 0o755)
    code, text = out["dir"]
    assert code == 2 and "permission denied" in text and "Traceback" not in text
    code, text = out["file"]
    assert code == 1
    doc = json.loads(text[text.index("{") :])
    f = [f for f in doc["findings"] if f["path"] == "model.pt"]
    assert f and f[0]["code"] == "unreadable" and "permission denied" in f[0]["message"]


def test_fifo_is_refused_without_blocking(tmp_path):
    f = tmp_path / "pipe"
    os.mkfifo(f)
    r = run("inspect", str(f))
    assert r.returncode == 2 and "FIFO" in r.stderr
    d = tmp_path / "ck"
    d.mkdir()
    torch.save({"w": torch.ones(2)}, d / "model.pt")
    os.mkfifo(d / "pipe")
    r = run("inspect", str(d), "--json")
    assert r.returncode == 0, r.stderr
    codes = {f["code"] for f in json.loads(r.stdout)["findings"]}
    assert "special-file" in codes


def test_default_command_is_open(tmp_path):
    torch.save({"w": torch.ones(2)}, tmp_path / "model.pt")
    res = CliRunner().invoke(main_group, [str(tmp_path)])
    assert res.exit_code == 0, res.output
    assert "torch.save" in res.output


def test_an_unexpected_base_exception_is_one_line_not_a_traceback(tmp_path):
    # torch's CheckpointException derives from BaseException, not Exception, and its text holds every rank's
    # traceback: the CLI still says one line and exits 1 (a subprocess, so main's own handler runs)
    code = (
        "import sys\n"
        "from torch.distributed.checkpoint.api import CheckpointException, _wrap_exception\n"
        "import ckpt_tui.core.report as rep\n"
        "def boom(*a, **k):\n"
        "    raise CheckpointException('read', {0: _wrap_exception(ValueError('inner'))})\n"
        "rep.inspect = boom\n"
        "from ckpt_tui.cli import main\n"
        f"main(['inspect', {str(tmp_path)!r}])\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 1, r.stderr
    assert "Traceback" not in r.stderr + r.stdout, r.stderr
    assert r.stderr.startswith("ckpt-tui: internal error: CheckpointException:"), r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr
