"""The first things a new user types: --help at 80 columns, `ckpt-tui help [COMMAND]`."""

import os
import subprocess
import sys

import pytest

COMMANDS = [
    "help",
    "open",
    "inspect",
    "tensors",
    "export",
    "verify",
    "diff",
    "stats",
    "universal",
    "convert",
    "fix",
    "prune",
    "demo",
]


def ckpt_tui(*args, columns: int = 80):
    env = dict(os.environ, COLUMNS=str(columns))
    return subprocess.run(
        [sys.executable, "-m", "ckpt_tui", *args], capture_output=True, text=True, env=env, timeout=120
    )


@pytest.mark.parametrize("args", [[], *([c] for c in COMMANDS)], ids=lambda a: " ".join(a) or "ckpt-tui")
def test_help_fits_80_columns_and_cuts_nothing(args):
    r = ckpt_tui(*args, "--help")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("Usage: ckpt-tui")
    too_long = [ln for ln in lines if len(ln) > 80]
    cut = [ln for ln in lines if ln.rstrip().endswith("...")]
    assert not too_long and not cut, too_long + cut


def test_every_command_is_listed_with_its_whole_short_help():
    from ckpt_tui.cli import main_group

    out = ckpt_tui("--help").stdout
    assert "Usage: ckpt-tui [OPTIONS] [PATH | COMMAND [ARGS]]" in out
    listed = {ln.split()[0]: ln.split(None, 1)[1] for ln in out.split("Commands:")[1].splitlines() if ln.strip()}
    assert set(listed) == set(COMMANDS)
    for name, text in listed.items():
        assert text == main_group.commands[name].short_help, name  # whole, not cut


def test_help_command_is_the_same_as_dash_dash_help():
    assert ckpt_tui("help").stdout == ckpt_tui("--help").stdout
    for c in ("export", "demo", "universal", "fix"):
        r = ckpt_tui("help", c)
        assert r.returncode == 0 and r.stdout == ckpt_tui(c, "--help").stdout, c


def test_help_for_an_unknown_command_names_the_commands():
    r = ckpt_tui("help", "exprot")
    assert r.returncode == 2 and "no command 'exprot'" in r.stderr and "export" in r.stderr
    assert "Traceback" not in r.stderr


def test_demo_help_says_where_it_builds_and_how_to_remove_it():
    out = ckpt_tui("demo", "--help").stdout
    assert "~/.cache/ckpt-tui/demo" in out and "ckpt-tui demo --clean" in out
    assert "--rebuild" in out and "--no-open" in out
