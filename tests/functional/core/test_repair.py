"""Repairs (`ckpt-tui fix`) on real checkpoints written by the real frameworks, or really corrupted
copies of them: dry run changes nothing, apply fixes and re-inspects, idempotent, backup intact,
refusals leave everything as it was, and a repair killed at any point leaves the old or the new file."""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ckpt_tui.core.repair import repairs_for
from ckpt_tui.core.repair.atomic import backup_path
from ckpt_tui.core.repair.repairs import UCI_KEY, UCI_VALUE
from ckpt_tui.core.report import inspect
from tests.util import as_nobody

ROOT = Path(__file__).resolve().parents[3]
MS = "mp_rank_00_model_states.pt"
# the command as the lead will register it (`ckpt-tui fix`), run directly so this file does not depend on that
FIX = [sys.executable, "-m", "ckpt_tui", "fix"]  # the real entry point
TAGS = {
    "ds-zero1-bf16": "global_step2",
    "ds-zero2-bf16": "global_step2",
    "hf-ds-zero2": "checkpoint-2/global_step2",
    "lightning-ds-zero2": "checkpoints/epoch=0-step=2.ckpt/checkpoint",
}


def _env():
    from ckpt_tui.samples import launch_env

    env = launch_env()
    env["PYTHONPATH"] = str(ROOT)
    return env


def _sums(root: Path) -> dict:
    out = {}
    for p in sorted(root.rglob("*")):
        if p.is_file():
            out[str(p.relative_to(root))] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def _only(root, rid):
    rep = inspect(root)
    return [r for r in repairs_for(rep) if r.id == rid]


# ------------------------------------------------------------------ zip rebuild and constants


def test_zip_rebuild_reproduces_torch_files_byte_for_byte(real_ckpt):
    from ckpt_tui.core.repair.pickle_edit import read_entries, rewrite_zip

    files = []
    for v in ("ds-zero2-bf16", "ds-zero3-bf16", "lightning-ds-zero2", "hf-ds-zero2"):
        files += [p for p in real_ckpt(v).rglob("*") if p.is_file() and p.suffix in (".pt", ".pth", ".bin")]
    assert len(files) >= 10
    for p in files:
        raw = p.read_bytes()
        src = io.BytesIO(raw)
        out = io.BytesIO()
        rewrite_zip(src, read_entries(src, len(raw)), {}, out)
        assert out.getvalue() == raw, p


def test_constants_match_deepspeed():
    from deepspeed.checkpoint import constants as c

    assert UCI_KEY == c.UNIVERSAL_CHECKPOINT_INFO
    assert UCI_VALUE == {c.UNIVERSAL_CHECKPOINT_VERSION_KEY: c.UNIVERSAL_CHECKPOINT_VERSION_VALUE}


# ------------------------------------------------------------------ universal-info


@pytest.mark.parametrize("variant", list(TAGS))
def test_universal_info_in_place(real_ckpt_copy, variant):
    import torch

    root = real_ckpt_copy(variant)
    target = root / TAGS[variant] / MS
    old = target.read_bytes()
    before = _sums(root)
    reps = _only(root, "universal-info")
    assert len(reps) == 1 and reps[0].can_apply
    text = reps[0].plan.describe()
    assert "universal_checkpoint_info" in text and "hard link" in text and "on_fit_start" in text
    assert _sums(root) == before  # planning (the dry run) wrote nothing
    res = reps[0].apply()
    assert res.ok and res.changed and res.finding_gone, res.message
    bak = backup_path(target)
    assert bak.read_bytes() == old and os.stat(bak).st_nlink == 1  # the original, kept as is
    assert not any(f.code == "universal-info-missing" for f in inspect(root).findings)
    # every other key unchanged, tensor by tensor; the new key is DeepSpeed's value
    a = torch.load(bak, map_location="cpu", weights_only=False)
    b = torch.load(target, map_location="cpu", weights_only=False)
    assert b.pop(UCI_KEY) == UCI_VALUE and set(a) == set(b)
    _assert_same(a, b)
    # idempotent
    new = target.read_bytes()
    res2 = _only(root, "universal-info")
    assert res2 == []
    res3 = reps[0].apply()
    assert res3.ok and not res3.changed and target.read_bytes() == new and bak.read_bytes() == old
    # every data record stays aligned (torch's 64-byte record alignment)
    from ckpt_tui.core.repair.pickle_edit import read_entries

    with open(target, "rb") as f:
        ents = read_entries(f, len(new))
    assert all(e.data_offset % 64 == 0 for e in ents)
    torch.load(target, map_location="cpu", weights_only=False, mmap=True)


def _assert_same(a, b, where=""):
    import torch

    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape, where
        assert torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8)), where  # bit-exact
    elif isinstance(a, dict):
        assert list(a) == list(b), where
        for k in a:
            _assert_same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _assert_same(x, y, f"{where}[{i}]")
    else:
        assert type(a) is type(b), where
        if isinstance(a, (int, float, str, bool, bytes, type(None))):
            assert a == b, where
        else:
            assert repr(a) == repr(b) or a.__dict__.keys() == b.__dict__.keys(), where


def test_ds_to_universal_without_inject_succeeds_after_fix(real_ckpt_copy, tmp_path):
    for variant in ("lightning-ds-zero2", "hf-ds-zero2"):
        root = real_ckpt_copy(variant)
        tag = root / TAGS[variant]
        cmd = [
            sys.executable,
            "-m",
            "deepspeed.checkpoint.ds_to_universal",
            "--input_folder",
            str(tag),
            "--output_folder",
            str(tmp_path / variant / "out"),
            "--num_extract_workers",
            "1",
            "--num_merge_workers",
            "1",
        ]
        p = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=300)
        assert p.returncode != 0 and "universal_checkpoint_info" in (p.stdout + p.stderr)
        assert _only(root, "universal-info")[0].apply().ok
        p = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
        assert (tmp_path / variant / "out" / "zero" / "optimizer_state.pt").is_file()


RESUME = textwrap.dedent("""
    import sys, json, torch, deepspeed
    from ckpt_tui.samples._common import TinyLM, init_dist, seed_all
    from ckpt_tui.samples.ds_engine import ds_config
    init_dist(deepspeed=True); deepspeed.init_distributed(dist_backend="gloo")
    out = {}
    for name, stage, fixed, orig in json.loads(sys.argv[1]):
        res = []
        for d in (fixed, orig):
            torch.manual_seed(1234)  # a different init: only a real load can match
            m = TinyLM()
            eng, *_ = deepspeed.initialize(model=m, model_parameters=list(m.parameters()), config=ds_config(stage, True))
            path, client = eng.load_checkpoint(d)
            assert path is not None, d
            sd = {k: v.detach().float().clone() for k, v in eng.module.state_dict().items()}
            fp32 = [t.detach().clone() for g in eng.optimizer.bf16_groups for t in g] if hasattr(eng.optimizer, "bf16_groups") else []
            res.append((eng.global_steps, sd, eng.optimizer.single_partition_of_fp32_groups[0].detach().clone()
                        if hasattr(eng.optimizer, "single_partition_of_fp32_groups") else None))
            eng.destroy()
        (s1, a, f1), (s2, b, f2) = res
        ok = s1 == s2 == 2 and all(torch.equal(a[k], b[k]) for k in a) and (f1 is None or torch.equal(f1, f2))
        out[name] = ok
    # "next time": a module with the attribute gets the key written by DeepSpeed itself
    seed_all(); m = TinyLM()
    m.universal_checkpoint_info = {"universal_checkpoint_version": 0.4}
    eng, *_ = deepspeed.initialize(model=m, model_parameters=list(m.parameters()), config=ds_config(2, True))
    ids = torch.randint(0, 256, (2, 16))
    loss = eng(ids).float().mean(); eng.backward(loss); eng.step()
    eng.save_checkpoint(sys.argv[2])
    import torch.distributed as dist
    dist.barrier()
    if dist.get_rank() == 0:
        print("RESULT " + json.dumps(out), flush=True)
    from ckpt_tui.samples._common import finish
    finish()
""")


def test_fixed_checkpoint_resumes_in_deepspeed_and_next_time_advice(real_ckpt_copy, tmp_path):
    jobs = []
    for v, stage in (("ds-zero2-bf16", 2), ("ds-zero1-bf16", 1)):
        root = real_ckpt_copy(v)
        orig = tmp_path / (v + "-orig")
        shutil.copytree(root, orig)
        assert _only(root, "universal-info")[0].apply().ok
        jobs.append((v, stage, str(root), str(orig)))
    script = tmp_path / "resume.py"
    script.write_text(RESUME)
    nxt = tmp_path / "next"
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "2",
        str(script),
        json.dumps(jobs),
        str(nxt),
    ]
    p = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=400, cwd=tmp_path)
    line = [x for x in p.stdout.splitlines() if x.startswith("RESULT ")]
    assert line, p.stdout[-3000:] + p.stderr[-3000:]
    assert json.loads(line[0][7:]) == {"ds-zero2-bf16": True, "ds-zero1-bf16": True}
    rep = inspect(nxt)
    assert rep.inventory.layout != "unknown"
    assert not any(f.code == "universal-info-missing" for f in rep.findings), rep.findings
    import torch

    sd = torch.load(next(nxt.glob("*/" + MS)), map_location="cpu", weights_only=False)
    assert sd[UCI_KEY] == UCI_VALUE


# ------------------------------------------------------------------ latest


def test_latest_dangling_and_missing_point_at_newest_complete_tag(real_ckpt_copy):
    root = real_ckpt_copy("ds-zero2-bf16")
    # a newer tag that is incomplete (a rank's optimizer file truncated): must be skipped
    bad = root / "global_step9"
    shutil.copytree(root / "global_step2", bad)
    f = next(bad.glob("*optim_states.pt"))
    f.write_bytes(f.read_bytes()[:1000])
    (root / "latest").write_text("global_step7")
    before = _sums(root)
    reps = _only(root, "latest")
    assert len(reps) == 1 and "global_step2" in reps[0].plan.describe()
    assert _sums(root) == before
    res = reps[0].apply()
    assert res.ok and res.finding_gone, res.message
    assert (root / "latest").read_text() == "global_step2"
    assert backup_path(root / "latest").read_text() == "global_step7"
    assert not any(f.code == "latest-dangling" for f in inspect(root).findings)
    assert reps[0].apply().changed is False
    # missing
    os.unlink(root / "latest")
    os.unlink(backup_path(root / "latest"))
    reps = _only(root, "latest")
    assert reps and reps[0].code == "latest-missing"
    assert reps[0].apply().ok and (root / "latest").read_text() == "global_step2"


def test_latest_megatron_iteration_file(real_ckpt_copy):
    root = real_ckpt_copy("megatron-legacy")
    (root / "latest_checkpointed_iteration.txt").write_text("30")
    reps = _only(root, "latest")
    assert reps, inspect(root).findings
    assert reps[0].apply().ok
    assert (root / "latest_checkpointed_iteration.txt").read_text() == "10"


# ------------------------------------------------------------------ dcp-metadata


def test_dcp_metadata_rebuilt_from_interrupted_rename(real_ckpt_copy):
    root = real_ckpt_copy("fsdp1-dcp")
    meta = (root / ".metadata").read_bytes()
    os.rename(root / ".metadata", root / ".metadata.tmp")  # FileSystemWriter.finish's last step, not done
    before = _sums(root)
    reps = _only(root, "dcp-metadata")
    assert len(reps) == 1 and reps[0].can_apply
    assert _sums(root) == before
    res = reps[0].apply()
    assert res.ok and res.finding_gone, res.message
    assert (root / ".metadata").read_bytes() == meta and (root / ".metadata.tmp").read_bytes() == meta
    assert not inspect(root).has_errors
    from torch.distributed.checkpoint import FileSystemReader

    md = FileSystemReader(str(root)).read_metadata()
    assert md.state_dict_metadata


def test_dcp_metadata_refused_when_a_shard_is_short(real_ckpt_copy):
    root = real_ckpt_copy("fsdp1-dcp")
    os.rename(root / ".metadata", root / ".metadata.tmp")
    shard = next(root.glob("*.distcp"))
    shard.write_bytes(shard.read_bytes()[:100])
    before = _sums(root)
    reps = _only(root, "dcp-metadata")
    assert reps and not reps[0].can_apply
    assert "cannot be rebuilt" in reps[0].plan.describe() and "truncated" in reps[0].plan.describe()
    res = reps[0].apply()
    assert not res.ok and _sums(root) == before


def test_dcp_components_is_advice_only(real_ckpt_copy):
    root = real_ckpt_copy("hf-fsdp1")
    reps = [r for r in repairs_for(inspect(root)) if r.code == "dcp-components"]
    assert reps and not reps[0].writes and "ckpt-tui export" in reps[0].plan.describe()
    assert "pytorch_model_fsdp_0" in reps[0].plan.describe()


# ------------------------------------------------------------------ safety


def test_existing_backup_refused_nothing_changed(real_ckpt_copy):
    root = real_ckpt_copy("ds-zero2-bf16")
    target = root / "global_step2" / MS
    backup_path(target).write_bytes(b"an older backup")
    before = _sums(root)
    res = _only(root, "universal-info")[0].apply()
    assert not res.ok and "already exists" in res.message
    assert _sums(root) == before and not list((root / "global_step2").glob(".*tmp*"))


def test_source_changing_during_repair_aborts(real_ckpt_copy):
    root = real_ckpt_copy("ds-zero2-bf16")
    target = root / "global_step2" / MS
    old = target.read_bytes()
    r = _only(root, "universal-info")[0]

    def grow(p):  # a "live job" appending while we copy
        if p.unit == "bytes" and p.done and not getattr(grow, "done", False):
            grow.done = True
            with open(target, "ab") as f:
                f.write(b"x")

    res = r.apply(on_progress=grow)
    assert not res.ok and "the source changed during the repair" in res.message
    assert target.read_bytes() == old + b"x" and not backup_path(target).exists()
    assert not [p for p in target.parent.iterdir() if "ckpt-tui" in p.name]


def test_permission_denied_nothing_changed(real_ckpt, shared_tmp):
    base = shared_tmp  # pytest's tmp_path is not traversable by nobody
    root = base / "ck"
    shutil.copytree(real_ckpt("lightning-ds-zero2"), root)
    for p in [root, *root.rglob("*")]:
        os.chmod(p, 0o755 if p.is_dir() else 0o644)  # readable by anyone, writable by the owner only
    before = _sums(root)

    from click.testing import CliRunner

    from ckpt_tui.cli.fix import fix_cmd

    warm = base / "warm"  # nobody cannot read the interpreter's files: import everything lazy first, as root
    shutil.copytree(root, warm)
    assert _only(warm, "universal-info")[0].apply().ok
    CliRunner().invoke(fix_cmd, [str(warm), "--yes"])

    def child():
        res = _only(root, "universal-info")[0].apply()
        p = CliRunner().invoke(fix_cmd, [str(root), "--yes"])
        return [res.ok, res.message, p.exit_code, p.output]

    ok, msg, rc, text = as_nobody(child)
    assert not ok and ("permission denied" in msg or "read-only" in msg), msg
    assert rc == 1 and "permission denied" in text and "Traceback" not in text, text
    assert _sums(root) == before


# ------------------------------------------------------------------ kill -9 at several points

KILLER = textwrap.dedent("""
    import sys, time
    from ckpt_tui.core.report import inspect
    from ckpt_tui.core.repair import repairs_for
    root, rid = sys.argv[1], sys.argv[2]
    r = [r for r in repairs_for(inspect(root)) if r.id == rid][0]
    def on_progress(p):
        print("EVENT", p.label, p.done, flush=True)
        time.sleep(0.3)
    res = r.apply(on_progress=on_progress)
    print("DONE", res.ok, flush=True)
""")


@pytest.mark.parametrize(
    "variant,rid,rel",
    [("ds-zero2-bf16", "universal-info", "global_step2/" + MS), ("ds-zero2-bf16", "latest", "latest")],
)
def test_kill_minus_9_leaves_old_or_new(real_ckpt_copy, tmp_path, variant, rid, rel):
    script = tmp_path / "killer.py"
    script.write_text(KILLER)
    # the new version, made once without interruption
    ref = real_ckpt_copy(variant)
    if rid == "latest":
        (ref / "latest").write_text("nope")
    old = (ref / rel).read_bytes()
    assert _only(ref, rid)[0].apply().ok
    new = (ref / rel).read_bytes()
    assert new != old
    seen_events = 0
    for n in range(0, 8):
        root = tmp_path / f"k{n}"
        shutil.rmtree(root, ignore_errors=True)
        shutil.copytree(ref, root)
        (root / rel).unlink()
        (root / rel).write_bytes(old)
        b = backup_path(root / rel)
        if b.exists():
            b.unlink()
        proc = subprocess.Popen(
            [sys.executable, str(script), str(root), rid],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env=_env(),
            text=True,
        )
        events = 0
        killed = False
        for line in proc.stdout:
            if line.startswith("EVENT"):
                events += 1
                if events > n:
                    proc.send_signal(signal.SIGKILL)
                    killed = True
                    break
        proc.wait()
        seen_events = max(seen_events, events)
        got = (root / rel).read_bytes()
        assert got in (old, new), n
        if b.exists():
            assert b.read_bytes() == old
        # the next run cleans up (or reuses the backup link) and finishes the job
        r2 = _only(root, rid)
        if got == old:
            assert r2 and r2[0].apply().ok
        assert (root / rel).read_bytes() == new
        assert b.read_bytes() == old
        assert not [p for p in (root / rel).parent.iterdir() if ".ckpt-tui-tmp-" in p.name]
        if not killed:
            break
    assert seen_events >= 3  # killed after the temp write, after the backup link, after the replace


# ------------------------------------------------------------------ CLI


def _cli(*args, stdin=subprocess.DEVNULL):
    return subprocess.run(
        [*FIX, *args],
        capture_output=True,
        text=True,
        stdin=stdin,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=120,
    )


def test_cli_fix_contract(real_ckpt_copy, tmp_path):
    root = real_ckpt_copy("hf-ds-zero2")
    before = _sums(root)
    p = _cli(str(root), "--dry-run", "--json")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["schema_version"] == 1 and doc["dry_run"] and doc["repairs"][0]["id"] == "universal-info"
    assert _sums(root) == before
    p = _cli(str(root))
    assert p.returncode == 2 and "--yes" in p.stderr and _sums(root) == before
    p = _cli(str(tmp_path / "nope"), "--yes")
    assert p.returncode == 2 and "Traceback" not in p.stderr
    p = _cli(str(root), "--only", "bogus")
    assert p.returncode == 2
    p = _cli(str(root), "--only", "universal-info", "--yes", "--json")
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert doc["results"][0]["ok"] and doc["results"][0]["finding_gone"]
    p = _cli(str(root), "--yes")
    assert p.returncode == 0 and "nothing to repair" in p.stderr
