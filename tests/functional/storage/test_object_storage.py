"""Checkpoints in object storage: every read path takes an s3:// URL beside a local path (core/storage.py).

Against a real S3 protocol server (moto_server, a subprocess on 127.0.0.1: see conftest.py) holding real
checkpoints: the inspection of a URL is the local one, fetching no more than a local inspection reads; an
export from a URL is bit-identical to the local export; the TUI opens a URL; what cannot work (a wrong bucket,
no credentials, access denied, an endpoint that refuses or never answers) is one line and exit code 2 within
30 s."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.fixtures import fixture_path
from tests.tmux import HAVE_TMUX, Tmux

from .conftest import BUCKET, MotoServer, base_env, free_port

ROOT = Path(__file__).resolve().parents[3]  # the checkout: the TUI runs from another folder

LOCAL_INSPECT = """
import json, sys
from ckpt_tui.core.report import inspect

def rchar():
    with open("/proc/self/io") as f:
        return next(int(x.split()[1]) for x in f if x.startswith("rchar"))

inspect(sys.argv[1])  # the modules it imports are read once, before the count
a = rchar()
rep = inspect(sys.argv[1])
b = rchar()
print(json.dumps({"doc": rep.to_json(), "rchar": b - a}))
"""


def cli(args, env, timeout=120):
    t0 = time.monotonic()
    r = subprocess.run(
        [sys.executable, "-m", "ckpt_tui", *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )
    return r, time.monotonic() - t0


def same_form(doc: dict, root: str) -> str:
    """The document with its paths aside: no top-level path, no finding commands, ``root`` spelt ROOT, no
    hard-link counts (a local fact: the fixture cache shares files between checkpoints), no run checkpoint's
    ``written`` time, and no repair ids
    (a checkpoint in object storage offers none: see test_findings_of_a_url_offer_only_what_works)."""
    doc = dict(doc)
    doc.pop("path")
    doc.pop("bytes_fetched", None)
    doc["findings"] = [
        {k: v for k, v in f.items() if k != "command"} | {"fix": f["fix"] if f["fix"] == "export" else None}
        for f in doc["findings"]
    ]
    for n in doc["nodes"]:
        n["facts"] = {k: v for k, v in n["facts"].items() if k != "hard_links"}
    # when a run's checkpoint was written: the file's mtime here, the object's upload time there
    doc["checkpoints"] = [{k: v for k, v in c.items() if k != "written"} for c in doc.get("checkpoints", [])]
    return json.dumps(doc, indent=1, sort_keys=True).replace(root.rstrip("/"), "ROOT")


@pytest.mark.parametrize("name", ["fsdp2-dcp", "hf-ds-zero2", "hf-fsdp2", "hf-model-sharded"])
def test_inspect_of_a_url_is_the_local_inspection(s3, name):
    local = str(fixture_path(name))
    r = subprocess.run([sys.executable, "-c", LOCAL_INSPECT, local], capture_output=True, text=True, check=True)
    got = json.loads(r.stdout)
    url = f"s3://{BUCKET}/{name}"
    rr, _ = cli(["inspect", "--json", url], s3.env)
    assert rr.returncode in (0, 1), rr.stderr
    remote = json.loads(rr.stdout)
    assert same_form(remote, url) == same_form(got["doc"], local)
    # only what a local inspection reads is fetched: .metadata, headers, zip directories and data.pkl
    assert 0 < remote["bytes_fetched"] <= 1.01 * got["rchar"], (remote["bytes_fetched"], got["rchar"])
    assert "bytes_fetched" not in got["doc"]  # a local document keeps its released shape


@pytest.mark.parametrize(
    "name,component",
    [
        ("fsdp2-dcp", "model"),
        ("fsdp2-dcp", "optimizer"),
        ("hf-ds-zero2", "model"),
        ("hf-ds-zero2", "optimizer"),
        ("hf-model-sharded", "model"),
    ],
)
def test_export_from_a_url_is_bit_identical(s3, tmp_path, name, component):
    local_out, remote_out = tmp_path / "local", tmp_path / "remote"
    r, _ = cli(["export", str(fixture_path(name)), "--component", component, "--out", str(local_out)], s3.env)
    assert r.returncode == 0, r.stderr
    r, _ = cli(["export", f"s3://{BUCKET}/{name}", "--component", component, "--out", str(remote_out)], s3.env)
    assert r.returncode == 0, r.stderr
    files = sorted(p.relative_to(local_out) for p in local_out.rglob("*") if p.is_file())
    assert files and files == sorted(p.relative_to(remote_out) for p in remote_out.rglob("*") if p.is_file())
    for f in files:
        assert (remote_out / f).read_bytes() == (local_out / f).read_bytes(), f


def test_tensors_of_a_url_are_the_local_list(s3):
    local, _ = cli(["tensors", "--json", str(fixture_path("hf-ds-zero2"))], s3.env)
    remote, _ = cli(["tensors", "--json", f"s3://{BUCKET}/hf-ds-zero2"], s3.env)
    assert remote.returncode == 0, remote.stderr
    assert json.loads(remote.stdout)["tensors"] == json.loads(local.stdout)["tensors"]


def _one_line_exit_2(r, took, url):
    assert r.returncode == 2, (r.stdout, r.stderr)
    assert took < 30
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"ckpt-tui: {url}: "), r.stderr
    assert "Traceback" not in r.stderr and not r.stdout
    return lines[0]


def test_wrong_bucket_is_one_line(s3):
    r, took = cli(["inspect", "s3://no-such-bucket/run/checkpoint-2000"], s3.env, timeout=60)
    assert "no such bucket" in _one_line_exit_2(r, took, "s3://no-such-bucket/run/checkpoint-2000")


def test_no_credentials_is_one_line(s3):
    env = {k: v for k, v in s3.env.items() if k not in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")}
    r, took = cli(["inspect", f"s3://{BUCKET}/fsdp2-dcp"], env, timeout=60)
    assert "no credentials" in _one_line_exit_2(r, took, f"s3://{BUCKET}/fsdp2-dcp")


def test_refused_endpoint_is_one_line():
    pytest.importorskip("s3fs", reason="the s3 extra is not installed (pip install 'ckpt-tui[s3]')")
    endpoint = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    r, took = cli(["inspect", "s3://ckpts/run"], base_env(endpoint), timeout=60)
    assert "cannot reach the object-storage endpoint" in _one_line_exit_2(r, took, "s3://ckpts/run")


def test_silent_endpoint_is_one_line_not_a_hang():
    """An endpoint that accepts connections and never answers (a firewall, a hung proxy)."""
    pytest.importorskip("s3fs", reason="the s3 extra is not installed (pip install 'ckpt-tui[s3]')")
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(64)
    held = []
    stop = threading.Event()

    def accept():
        srv.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(srv.accept()[0])
            except OSError:
                pass

    th = threading.Thread(target=accept, daemon=True)
    th.start()
    try:
        env = base_env(f"http://127.0.0.1:{srv.getsockname()[1]}")
        r, took = cli(["inspect", "s3://ckpts/run"], env, timeout=60)
        assert "cannot reach the object-storage endpoint" in _one_line_exit_2(r, took, "s3://ckpts/run")
    finally:
        stop.set()
        th.join()
        for c in held:
            c.close()
        srv.close()


def test_access_denied_is_one_line(tmp_path):
    """moto enforces IAM after INITIAL_NO_AUTH_ACTION_COUNT requests: a user and its key, a bucket and an
    object are made before, then that user (no policy) is denied."""
    pytest.importorskip("s3fs", reason="the s3 extra is not installed (pip install 'ckpt-tui[s3]')")
    pytest.importorskip("boto3", reason="boto3 is not installed (the test extra)")
    server = MotoServer(tmp_path / "moto_server.log", {"INITIAL_NO_AUTH_ACTION_COUNT": "4"})
    try:
        iam = server.client("iam")
        iam.create_user(UserName="reader")
        key = iam.create_access_key(UserName="reader")["AccessKey"]
        s3c = server.client()
        s3c.create_bucket(Bucket="locked")
        s3c.put_object(Bucket="locked", Key="run/checkpoint-2000/config.json", Body=b"{}")
        env = server.env | {"AWS_ACCESS_KEY_ID": key["AccessKeyId"], "AWS_SECRET_ACCESS_KEY": key["SecretAccessKey"]}
        r, took = cli(["inspect", "s3://locked/run/checkpoint-2000"], env, timeout=60)
        assert "access denied" in _one_line_exit_2(r, took, "s3://locked/run/checkpoint-2000")
    finally:
        server.stop()


def test_without_the_extra_says_how_to_install(tmp_path):
    code = (
        "import sys; sys.modules['s3fs'] = None; sys.modules['fsspec'] = None\n"
        "from ckpt_tui.cli import main; sys.exit(main(['inspect', 's3://bucket/run/checkpoint-2000']))"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 2
    assert r.stderr.strip() == (
        "ckpt-tui: s3:// paths need the optional object-storage support: pip install 'ckpt-tui[s3]'"
    )


@pytest.mark.skipif(not HAVE_TMUX, reason="tmux is not installed")
def test_the_tui_opens_a_url_in_tmux_and_exports_it_to_a_local_folder(s3, tmp_path):
    url = f"s3://{BUCKET}/hf-ds-zero2/checkpoint-2"
    with Tmux(
        f"{sys.executable} -m ckpt_tui {url}",
        s3.env | {"TERM": "xterm-256color", "PYTHONPATH": str(ROOT)},
        cwd=tmp_path,
    ) as t:
        t.wait_for("model and optimizer in")
        # the tree's line, waited for too: the scan's end paints the summary and the whole tree in one frame, and a
        # capture can land while that frame is still being written to the terminal
        t.wait_for("MODEL+OPTIM global_step2/")
        s = t.export_with_defaults(timeout=120)
        assert "verified" in s
        # a checkpoint in object storage exports into the current folder
        assert (tmp_path / "checkpoint-2-safetensors" / "model.safetensors").is_file()
        assert t.close_dialog_and_quit("Export finished") == 0


def test_stats_diff_and_verify_read_a_url(s3, tmp_path):
    url, local = f"s3://{BUCKET}/hf-ds-zero2", str(fixture_path("hf-ds-zero2"))
    remote_stats, _ = cli(["stats", "--json", url], s3.env)
    local_stats, _ = cli(["stats", "--json", local], s3.env)
    assert remote_stats.returncode == 0, remote_stats.stderr
    assert json.loads(remote_stats.stdout) == json.loads(local_stats.stdout)
    d, _ = cli(["diff", url, local], s3.env)
    assert d.returncode == 0 and "21 identical, 0 differ" in d.stdout, d.stdout + d.stderr
    out = tmp_path / "out"
    r, _ = cli(["export", url, "--out", str(out)], s3.env)
    assert r.returncode == 0, r.stderr
    # the reference loader (DeepSpeed's zero_to_fp32) reads local files: verify fetches a temp copy
    v, _ = cli(["verify", str(out), "--against", url], s3.env)
    assert v.returncode == 0, v.stdout + v.stderr
    assert "21 tensors compared with DeepSpeed zero_to_fp32: 0 mismatched" in v.stdout


def test_ranged_reads_come_in_order_and_give_back_their_memory(s3, monkeypatch):
    """read_chunks, what export and verify read a URL with: many small concurrent GETs, reassembled in order;
    every permit of the memory budget returned, also by a reader abandoned halfway."""
    from ckpt_tui.core import storage

    for k, v in s3.env.items():
        if k.startswith("AWS_"):
            monkeypatch.setenv(k, v)
    monkeypatch.setattr(storage, "_fs_cache", {})
    local = fixture_path("fsdp2-dcp") / "__0_0.distcp"
    url = f"s3://{BUCKET}/fsdp2-dcp/__0_0.distcp"
    data = local.read_bytes()
    before = storage.bytes_fetched()
    got = b"".join(storage.read_chunks(url, 1000, len(data) - 1000, chunk=4099))
    assert got == data[1000:]
    assert storage.bytes_fetched() - before == len(data) - 1000
    half = storage.read_chunks(url, 0, len(data), chunk=1024)
    next(half)
    half.close()
    assert storage._budget._value == storage.FETCH_BUDGET


@pytest.mark.parametrize(
    "args",
    [
        ["fix", "s3://bucket/run/checkpoint-2000", "--dry-run"],
        ["universal", "s3://bucket/run/checkpoint-2000", "--dry-run"],
        ["convert", "s3://bucket/run/checkpoint-2000", "--to", "torch-dcp", "--out", "x"],
    ],
)
def test_commands_that_write_beside_a_checkpoint_say_it_must_be_local(args):
    r, _ = cli(args, None)
    assert r.returncode == 2
    assert r.stderr.strip() == (
        f"ckpt-tui: s3://bucket/run/checkpoint-2000: `ckpt-tui {args[0]}` works on a "
        "checkpoint on local disk (it writes beside it); copy it to a local folder first"
    )


def test_findings_of_a_url_offer_only_what_works(s3, tmp_path):
    """A repair, `universal` and `convert` write beside the checkpoint and refuse a URL: a finding on a checkpoint
    in object storage offers none of them; its export command stays, and runs as printed."""
    r, _ = cli(["inspect", "--json", f"s3://{BUCKET}/hf-ds-zero2"], s3.env)
    findings = json.loads(r.stdout)["findings"]
    assert [f["code"] for f in findings] == ["universal-info-missing"]
    assert findings[0]["fix"] is None and findings[0]["command"] is None
    r, _ = cli(["inspect", "--json", f"s3://{BUCKET}/hf-fsdp2"], s3.env)
    (f,) = json.loads(r.stdout)["findings"]
    assert f["code"] == "dcp-components" and f["fix"] == "export"
    assert f["command"] == f"ckpt-tui export s3://{BUCKET}/hf-fsdp2/checkpoint-2 --out DIR"
    r, _ = cli(f["command"].replace("--out DIR", f"--out {tmp_path / 'out'}").split()[1:], s3.env)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "out" / "model.safetensors").is_file()


def test_an_overwritten_object_is_seen_afresh(s3, monkeypatch):
    """What export's change check asks of each source object (fsutil.stamp): its size and mtime now, not what a
    listing or fsspec's cache saw; and a rescan lists afresh too."""
    from ckpt_tui.core import fsutil, storage

    for k, v in s3.env.items():
        if k.startswith("AWS_"):
            monkeypatch.setenv(k, v)
    monkeypatch.setattr(storage, "_fs_cache", {})
    client = s3.client()
    client.put_object(Bucket=BUCKET, Key="scratch/ck/a.json", Body=b"{}")
    url = f"s3://{BUCKET}/scratch/ck"
    storage.check(url)
    a = storage.RemotePath(url) / "a.json"
    assert [p.name for p in storage.RemotePath(url).iterdir()] == ["a.json"]
    before = fsutil.stamp(a)
    client.put_object(Bucket=BUCKET, Key="scratch/ck/a.json", Body=b'{"step": 2}')
    client.put_object(Bucket=BUCKET, Key="scratch/ck/b.json", Body=b"{}")
    assert fsutil.stamp(a) != before and fsutil.stamp(a).size == len(b'{"step": 2}')
    storage.check(url)
    assert sorted(p.name for p in storage.RemotePath(url).iterdir()) == ["a.json", "b.json"]


async def test_the_tui_offers_no_action_that_writes_beside_a_url(s3, monkeypatch):
    """Repairs, `universal` and the resume wizard write beside the checkpoint: dimmed, with the reason, for a
    checkpoint in object storage; export stays."""
    from ckpt_tui.core import storage
    from ckpt_tui.ui.app import make_app

    for k, v in s3.env.items():
        if k.startswith("AWS_"):
            monkeypatch.setenv(k, v)
    monkeypatch.setattr(storage, "_fs_cache", {})
    app = make_app(f"s3://{BUCKET}/hf-ds-zero2/checkpoint-2")
    async with app.run_test() as pilot:
        deadline = time.monotonic() + 120  # bounds a failure only
        while app.report is None and time.monotonic() < deadline:  # the scan is done: a state, not seconds
            await pilot.pause(0.05)
        why = "the checkpoint is in object storage: this writes beside it (export reads it)"
        assert [app.main.why_not(a) for a in ("fix", "universal", "resume_fsdp2")] == [why] * 3
        assert app.main.why_not("export") is None


NEEDS = """
import sys
from ckpt_tui.core.export.api import export_needs
from ckpt_tui.core.report import inspect

rep = inspect(sys.argv[1])
print(export_needs(rep, rep.inventory.model_node(), dtype="keep"))
"""


@pytest.mark.parametrize("name", ["fsdp2-dcp", "hf-model-sharded"])
def test_the_export_wizards_space_check_of_a_url_is_the_local_one(s3, name):
    # the TUI's export wizard asks export_needs for its free-space line: for a checkpoint in object storage it
    # raised TypeError (a RemotePath is no os.PathLike), which the wizard showed as the reason
    remote = subprocess.run(
        [sys.executable, "-c", NEEDS, f"s3://{BUCKET}/{name}"], capture_output=True, text=True, env=s3.env, timeout=120
    )
    local = subprocess.run([sys.executable, "-c", NEEDS, str(fixture_path(name))], capture_output=True, text=True)
    assert remote.returncode == 0 and local.returncode == 0, remote.stderr + local.stderr
    assert int(remote.stdout) == int(local.stdout) > 0
