"""Nothing from a file reaches the terminal as code (issue 20, point 3).

Real checkpoints whose file names, tensor names (a safetensors header, a DCP .metadata re-pickled from torch's own
Metadata objects) and ``latest`` hold terminal sequences -- OSC 0 (window title), OSC 52 (clipboard), ESC[2J,
OSC 8 links, C1 CSI (U+009B), BEL, CR, backspace, a bidi override -- and Rich/Textual markup (``[red]``,
``[link=…]``, ``[@click=app.screenshot(…)]``). Every face is fed them: the CLI's text (inspect, tensors, stats,
diff, export, verify, fix --dry-run, universal), ``--json``, the TUI through Textual's Pilot (what it would write
to the terminal, its spans' links and actions, a click where CLICKME is drawn) and in a real tmux (the pane title,
tmux's clipboard buffer, the bytes the pane received)."""

import json
import os
import pickle
import re
import shutil
import struct
import subprocess
import sys
import time

import pytest

from ckpt_tui.core.safetext import visible

ESC, BEL = "\x1b", "\x07"
SEQUENCES = {
    "osc0": f"{ESC}]0;PWNED-TITLE{BEL}",
    "osc52": f"{ESC}]52;c;cHduZWQ={BEL}",  # "pwned" into the clipboard
    "clear": f"{ESC}[2J",
    "osc8": f"{ESC}]8;;https://evil.example/{ESC}\\LINK{ESC}]8;;{ESC}\\",
    "c1": "\x9b2J",
    "bidi": "\u202e",
    "edit": "\r\b\x7f",
}
SEQ = "".join(SEQUENCES.values())
CLICK = "[@click=app.screenshot('victim.txt','.')]CLICKME[/]"
MARKUP = "[red]RED[/red][link=file:///etc/passwd]LINK[/link]"
FILE_SEQ = SEQ.replace("/", "")  # no `/` in a file name
FILE_NAME = f"notes{FILE_SEQ}[red]RED[bold]B.txt"
S3_NAME = f"notes{FILE_SEQ}[red]RED[@click=app.bell]B.json"  # an object key
TENSOR_A = f"model.evil{SEQ}.weight"
TENSOR_B = f"model.{MARKUP}{CLICK}.weight"
DCP_STORED = (TENSOR_A, TENSOR_B)  # the keys of the DCP's `model` entry, as its .metadata stores them
DCP_EXPORTED = tuple(n.removeprefix("model.") for n in DCP_STORED)  # as export writes (and tensors lists) them

# what may reach a terminal from a face: printable text and newlines (plus, in a terminal, our own SGR styles)
RAW = re.compile("[\x00-\x09\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def rewrite_safetensors(path, renames):
    """Rename tensors in a real safetensors file's header (the data bytes stay where they are)."""
    raw = path.read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + n])
    header = {renames.get(k, k): v for k, v in header.items()}
    text = json.dumps(header, ensure_ascii=False).encode()
    text += b" " * (-len(text) % 8)
    path.write_bytes(struct.pack("<Q", len(text)) + text + raw[8 + n :])


def rewrite_dcp_keys(meta_path, renames):
    """Rename keys of a real DCP .metadata with torch's own Metadata objects (every place a key is named)."""
    from torch.distributed.checkpoint.metadata import MetadataIndex

    meta = pickle.loads(meta_path.read_bytes())  # our own fixture, before the change
    meta.state_dict_metadata = {renames.get(k, k): v for k, v in meta.state_dict_metadata.items()}
    meta.storage_data = {
        MetadataIndex(renames.get(i.fqn, i.fqn), i.offset, i.index): v for i, v in meta.storage_data.items()
    }
    if isinstance(meta.planner_data, dict):
        meta.planner_data = {
            renames.get(k, k): (v[:-1] + (renames[k].split(".", 1)[1],) if k in renames else v)
            for k, v in meta.planner_data.items()
        }
    meta_path.write_bytes(pickle.dumps(meta))


@pytest.fixture(scope="module")
def hostile(tmp_path_factory, real_ckpt):
    tmp = tmp_path_factory.mktemp("hostile")
    ck = tmp / "checkpoint-2"  # HF Trainer + DeepSpeed ZeRO-2: `latest`, a tag, model.safetensors
    shutil.copytree(real_ckpt("hf-ds-zero2") / "checkpoint-2", ck)
    (ck / "latest").write_text(CLICK + SEQ)
    shutil.copy(ck / "trainer_state.json", ck / FILE_NAME)
    crash = tmp / "crash" / "checkpoint-2"  # `latest` holding a lone closing tag: MarkupError where parsed
    shutil.copytree(real_ckpt("hf-ds-zero2") / "checkpoint-2", crash)
    (crash / "latest").write_text("[/]")
    st = tmp / f"st{FILE_SEQ}"  # the export wizard's default output folder is named after it
    st.mkdir()
    shutil.copy(ck / "model.safetensors", st / "model.safetensors")
    rewrite_safetensors(st / "model.safetensors", {"lm_head.weight": TENSOR_A, "model.norm.weight": TENSOR_B})
    dcp = tmp / "dcp"
    shutil.copytree(real_ckpt("fsdp2-dcp"), dcp)
    rewrite_dcp_keys(
        dcp / ".metadata",
        {"model.position_scale": TENSOR_A.replace("model.", "model.", 1), "model.layers.0.norm.bias": TENSOR_B},
    )
    return {"tmp": tmp, "ck": ck, "crash": crash, "st": st, "dcp": dcp, "orig": real_ckpt("hf-ds-zero2")}


class Ran:
    def __init__(self, returncode, stdout: bytes, stderr: bytes):
        self.returncode, self.stdout, self.stderr = returncode, stdout, stderr


def cli(*args):
    """The command in this process (click's runner: the bytes it writes to stdout and stderr, its exit code);
    wide, so a name is never folded across lines. An exception is raised, never hidden."""
    from click.testing import CliRunner

    from ckpt_tui.cli import main_group

    r = CliRunner(env={"COLUMNS": "400", "NO_COLOR": "1"}).invoke(
        main_group, [str(a) for a in args], catch_exceptions=False
    )
    return Ran(r.exit_code, r.stdout_bytes, r.stderr_bytes)


def cli_process(*args):
    """The command as its own process, as a user runs it."""
    env = dict(os.environ, COLUMNS="400", NO_COLOR="1")
    return subprocess.run(
        [sys.executable, "-m", "ckpt_tui", *map(str, args)], capture_output=True, timeout=300, env=env
    )


def assert_clean(out: bytes, what: str) -> str:
    text = out.decode("utf-8")  # a lone surrogate or a raw undecodable byte would fail here
    bad = sorted({repr(c) for c in RAW.findall(text)})
    assert not bad, f"{what}: raw control characters {bad} reach the terminal:\n{text[-3000:]}"
    assert "Traceback" not in text, f"{what}: {text[-3000:]}"
    return text


def test_sanitiser_shows_every_control_visibly():
    s = visible(SEQ + "ok")
    assert not RAW.search(s) and s.endswith("ok")
    assert "\\x1b]0;PWNED-TITLE\\x07" in s and "\\x9b2J" in s and "\\u202e" in s and "\\x0d\\x08\\x7f" in s
    assert visible("a\nb\tc", lines=True) == "a\nb\tc" and visible("a\nb") == "a\\x0ab"
    assert visible("\udc9b") == "\\x9b"  # an undecodable byte of a file name (surrogateescape)
    assert visible("plain.name [x]") == "plain.name [x]"


def test_cli_text_shows_names_visibly_and_never_as_markup(hostile):
    ck, st, dcp, tmp = hostile["ck"], hostile["st"], hostile["dcp"], hostile["tmp"]
    r = cli_process("inspect", ck)  # as its own process once: what a user's terminal gets
    out = assert_clean(r.stdout + r.stderr, "inspect")
    assert visible(FILE_NAME) in out  # the file name, shown with its escapes, its brackets literal
    assert "CLICKME[/]" in out and "[@click=" in out
    r = cli("inspect", "--all", dcp)
    assert_clean(r.stdout + r.stderr, "inspect dcp")
    # a DCP is listed as export writes it (its single `model` container unwrapped); --stored as stored
    for path, opts, (a, b) in (
        (st, (), (TENSOR_A, TENSOR_B)),
        (dcp, (), DCP_EXPORTED),
        (dcp, ("--stored",), DCP_STORED),
    ):
        r = cli("tensors", *opts, path)
        out = assert_clean(r.stdout + r.stderr, f"tensors {' '.join(opts)} {path.name}")
        assert visible(a) in out and b in out  # markup shown as written, not applied
    r = cli("stats", st)
    out = assert_clean(r.stdout + r.stderr, "stats")
    assert visible(TENSOR_A) in out and TENSOR_B in out
    r = cli("diff", st, hostile["orig"] / "checkpoint-2" / "model.safetensors")
    out = assert_clean(r.stdout + r.stderr, "diff")
    assert visible(TENSOR_A) in out and TENSOR_B in out
    out_dir = tmp / f"out{FILE_SEQ}[red]R"
    r = cli("export", st, "--out", out_dir, "--dry-run")
    assert_clean(r.stdout + r.stderr, "export --dry-run")
    r = cli("export", st, "--out", out_dir)
    assert r.returncode == 0, r.stderr
    assert_clean(r.stdout + r.stderr, "export")
    r = cli("verify", out_dir, "--against", st)
    assert_clean(r.stdout + r.stderr, "verify")
    r = cli("export", dcp, "--out", tmp / "out-dcp")
    assert_clean(r.stdout + r.stderr, "export dcp")
    r = cli("fix", ck, "--dry-run")
    out = assert_clean(r.stdout + r.stderr, "fix --dry-run")
    r = cli("universal", ck, "--dry-run")
    assert_clean(r.stdout + r.stderr, "universal --dry-run")
    r = cli("universal", ck, "--tag", f"global_step2{SEQ}", "--dry-run")
    assert_clean(r.stdout + r.stderr, "universal --tag")
    r = cli("inspect", hostile["crash"])
    out = assert_clean(r.stdout + r.stderr, "inspect [/]")
    assert "[/]" in out


def test_cli_in_a_terminal_writes_only_its_own_styles(hostile):
    """On a terminal (a pty) Rich styles the report: every escape sequence in it is one of those (SGR), none
    came from the checkpoint."""
    import pty

    main, sub = pty.openpty()
    env = dict(os.environ, COLUMNS="400", TERM="xterm-256color")
    env.pop("NO_COLOR", None)
    p = subprocess.Popen(
        [sys.executable, "-m", "ckpt_tui", "inspect", str(hostile["ck"])], stdin=sub, stdout=sub, stderr=sub, env=env
    )
    os.close(sub)
    out = b""
    while True:
        try:
            chunk = os.read(main, 65536)
        except OSError:  # the pty closed: the command ended
            break
        if not chunk:
            break
        out += chunk
    os.close(main)
    assert p.wait(60) == 1  # latest-dangling is an error
    text = out.decode("utf-8")
    assert "\x1b[" in text  # styled: it knew it was on a terminal
    rest = re.sub(r"\x1b\[[0-9;]*m", "", text).replace("\r\n", "\n")
    bad = sorted({repr(c) for c in RAW.findall(rest)})
    assert not bad, f"raw control characters {bad} reach the terminal:\n{rest[-3000:]}"
    assert visible(FILE_NAME) in rest


def test_cli_error_messages_quoting_a_path_are_visible(hostile):
    r = cli_process("inspect", hostile["tmp"] / f"missing{FILE_SEQ}[red]R")
    out = assert_clean(r.stdout + r.stderr, "a missing path")
    assert r.returncode == 2 and "[red]R" in out


def test_json_escapes_c0_c1_and_bidi(hostile):
    for args in (
        ("inspect", "--json", hostile["ck"]),
        ("inspect", "--json", hostile["dcp"]),
        ("tensors", "--json", hostile["st"]),
        ("tensors", "--json", hostile["dcp"]),
        ("tensors", "--json", "--stored", hostile["dcp"]),
        ("fix", "--dry-run", "--json", hostile["ck"]),
        ("stats", "--json", hostile["st"]),
    ):
        r = cli(*args)
        text = assert_clean(r.stdout, " ".join(map(str, args[:2])))
        strings = set(strings_of(json.loads(text)))  # the escapes decode to the same strings
        if args[0] in ("tensors", "stats"):
            want = DCP_EXPORTED if args[-1] == hostile["dcp"] and "--stored" not in args else (TENSOR_A, TENSOR_B)
            assert set(want) <= strings, args
        if args[:2] == ("inspect", "--json") and args[2] == hostile["ck"]:
            assert FILE_NAME in strings and any(s.startswith(CLICK + SEQUENCES["osc0"]) for s in strings)


def strings_of(v):
    if isinstance(v, str):
        yield v
    elif isinstance(v, dict):
        for k, x in v.items():
            yield k
            yield from strings_of(x)
    elif isinstance(v, list):
        for x in v:
            yield from strings_of(x)


# ------------------------------------------------------------------ the TUI through Pilot


def terminal_output(app) -> str:
    """What the app would write to the terminal for the whole screen now (its cursor moves and SGR styles)."""
    from rich.console import Console

    return app.screen._compositor.render_full_update().render_segments(Console(force_terminal=True))


OUR_SEQUENCES = re.compile(r"\x1b\[[0-9;]*[mH]")  # colours and cursor moves: what Textual itself writes


def assert_screen_clean(app, what: str) -> str:
    raw = terminal_output(app)
    rest = OUR_SEQUENCES.sub("", raw)
    bad = sorted({repr(c) for c in RAW.findall(rest.replace("\n", ""))})
    assert not bad, f"{what}: raw control characters {bad} reach the terminal:\n{rest[-3000:]}"
    for strip in app.screen._compositor.render_strips():
        for seg in strip:
            style = seg.style
            if style is None:
                continue
            assert not style.link, f"{what}: a link from data: {seg.text!r} -> {style.link}"
            meta = style.meta or {}
            assert "@click" not in meta, f"{what}: an action from data: {seg.text!r} -> {meta['@click']}"
    return rest


def screen_lines(app) -> list[str]:
    return ["".join(seg.text for seg in strip) for strip in app.screen._compositor.render_strips()]


async def wait_for(pilot, cond, timeout=60.0):
    t0 = time.monotonic()
    while not cond():
        assert time.monotonic() - t0 < timeout, "timed out waiting"
        await pilot.pause(0.05)


async def test_tui_never_parses_data_as_markup(hostile, tmp_path, monkeypatch):
    from ckpt_tui.ui.app import make_app
    from ckpt_tui.ui.screens.findings import FindingsScreen

    monkeypatch.chdir(tmp_path)  # where app.screenshot('victim.txt', '.') would write
    app = make_app(hostile["ck"])
    async with app.run_test(size=(160, 50)) as pilot:
        await wait_for(pilot, lambda: app.report is not None and app.selected is not None)
        await pilot.pause(0.1)
        text = assert_screen_clean(app, "main screen")
        assert "latest-dangling" in text
        await pilot.press("f")
        await wait_for(pilot, lambda: isinstance(app.screen, FindingsScreen))
        await pilot.pause(0.1)
        text = assert_screen_clean(app, "findings")
        assert "CLICKME[/]" in text and "[@click=" in text  # the message's brackets are literal text
        for y, line in enumerate(screen_lines(app)):  # a click where CLICKME is drawn changes nothing
            if "CLICKME" in line:
                await pilot.click(offset=(len(line[: line.index("CLICKME")]) + 2, y))
        await pilot.pause(0.2)
        assert not (tmp_path / "victim.txt").exists()
        assert app.crash is None
        await pilot.press("escape")
        await wait_for(pilot, lambda: not isinstance(app.screen, FindingsScreen))
        await pilot.press("x")  # the latest repair's wizard: its plan quotes the file
        await wait_for(pilot, lambda: type(app.screen).__name__ == "RepairWizard")
        await pilot.pause(0.1)
        assert_screen_clean(app, "repair wizard")
    assert app.crash is None
    assert not (tmp_path / "victim.txt").exists()


async def test_tui_latest_holding_a_closing_tag_does_not_crash_findings(hostile):
    from ckpt_tui.ui.app import make_app
    from ckpt_tui.ui.screens.findings import FindingsScreen

    app = make_app(hostile["crash"])
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_for(pilot, lambda: app.report is not None)
        await pilot.press("f")
        await wait_for(pilot, lambda: isinstance(app.screen, FindingsScreen) or app.crash is not None)
        await pilot.pause(0.1)
        assert app.crash is None
        assert "[/]" in assert_screen_clean(app, "findings")
    assert app.crash is None and not app.return_code


@pytest.mark.parametrize("which", ["st", "dcp"])
async def test_tui_tensor_names_and_export_wizard(hostile, which):
    from ckpt_tui.ui.app import make_app
    from ckpt_tui.ui.widgets.details import TensorTable

    app = make_app(hostile[which])
    async with app.run_test(size=(200, 50)) as pilot:
        await wait_for(pilot, lambda: app.report is not None)
        table = app.query_one(TensorTable)
        await wait_for(pilot, lambda: len(table.rows) > 0 and table.is_drawn())
        await pilot.pause(0.1)
        text = assert_screen_clean(app, "tensor table")
        assert "CLICKME" in text
        await pilot.press("e")
        await wait_for(pilot, lambda: type(app.screen).__name__ == "ExportWizard")
        await pilot.pause(0.1)
        assert_screen_clean(app, "export wizard")
        wizard = app.screen
        await wait_for(pilot, lambda: app.focused is not None and app.focused.id == "source-list")
        await pilot.press("enter")  # the output step: an input holding the folder named after the checkpoint
        await wait_for(pilot, lambda: wizard.step == 1 and app.focused is not None and app.focused.id == "out")
        await pilot.pause(0.1)
        text = assert_screen_clean(app, "export wizard, output step")
        assert "safetensors" in text
    assert app.crash is None


# ------------------------------------------------------------------ a real terminal


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
def test_tmux_pane_title_clipboard_and_bytes_unchanged(hostile, tmp_path):
    """In tmux with set-clipboard on: the pane's title, tmux's paste buffers and the raw bytes the pane received
    show no sequence from the checkpoint."""
    from tests.tmux import Tmux

    log = tmp_path / "pane.log"
    go = tmp_path / "go"
    # the app starts once the pane is logged and the options set: nothing it writes is missed
    cmd = f"sh -c 'while [ ! -e {go} ]; do sleep 0.05; done; exec {sys.executable} -m ckpt_tui {hostile['ck']}'"
    with Tmux(cmd, {"TERM": "xterm-256color"}, cwd=tmp_path) as t:
        t._tmux("set-option", "-g", "set-clipboard", "on")
        t._tmux("set-option", "-g", "allow-rename", "on")
        t._tmux("pipe-pane", "-t", t.name, f"cat >> {log}")
        title = t._tmux("display-message", "-p", "-t", t.name, "#{pane_title}").strip()
        go.touch()
        t.wait_for("latest-dangling")
        t.wait_for("PWNED-TITLE")  # the sequence is on the screen as text
        t.keys("f")
        t.wait_for_all("Findings (", "[@click=", "CLICKME[/]")
        t.keys("Escape")
        t.wait_gone("Findings (")
        t.keys("q")
        assert t.exit_code() == 0
        assert t._tmux("display-message", "-p", "-t", t.name, "#{pane_title}").strip() == title
        assert "PWNED" not in t._tmux("display-message", "-p", "-t", t.name, "#{window_name}")
        assert t._tmux("list-buffers").strip() == ""  # OSC 52 would have made a buffer
    raw = log.read_bytes().decode("utf-8", "replace")
    assert "PWNED-TITLE" in raw  # the log holds what the app drew ...
    for seq in ("\x1b]0;PWNED", "\x1b]52;", "\x1b]8;;https://evil", "\x9b", "\u202e", "\x1b[2J\x1b]8"):
        assert seq not in raw, f"{seq!r} reached the pane"  # ... and none of the sequences raw


# ------------------------------------------------------------------ object storage


def test_s3_keys_are_shown_visibly(real_ckpt, tmp_path):
    """A key in a bucket is a name like any other: inspect (text and --json) of the URL shows it visibly."""
    pytest.importorskip("s3fs", reason="the s3 extra is not installed (pip install 'ckpt-tui[s3]')")
    pytest.importorskip("boto3", reason="boto3 is not installed (the test extra)")
    from tests.functional.storage.conftest import MotoServer

    server = MotoServer(tmp_path / "moto_server.log")
    try:
        s3 = server.client()
        s3.create_bucket(Bucket="hostile")
        server.upload("hostile", real_ckpt("fsdp2-dcp"), "run")
        key = f"run/{S3_NAME}"
        s3.put_object(Bucket="hostile", Key=key, Body=b"{}")
        env = dict(server.env, COLUMNS="400", NO_COLOR="1")
        for args in (("inspect", "s3://hostile/run"), ("inspect", "--json", "s3://hostile/run")):
            r = subprocess.run([sys.executable, "-m", "ckpt_tui", *args], capture_output=True, timeout=120, env=env)
            out = assert_clean(r.stdout + r.stderr, " ".join(args))
            if "--json" in args:
                assert S3_NAME in set(strings_of(json.loads(r.stdout)))
            else:
                assert visible(S3_NAME) in out
    finally:
        server.stop()
