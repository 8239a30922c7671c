"""The base model of an adapter found where a user has it: the recorded path against the current folder, the
checkpoint, its run and the run's parent; a Hub id in the local Hugging Face cache only, laid out by hand here
the way huggingface_hub lays it out (its own ``try_to_load_from_cache`` reads the same tree: the oracle), with
the hostile forms of such a cache refused."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from ckpt_tui.core.adapters.base import find_base, hub_cache, model_folder_problem

COMMIT = "0123456789abcdef0123456789abcdef01234567"
OTHER = "89abcdef0123456789abcdef0123456789abcdef"


def _model(folder: Path, weights: str = "model.safetensors") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text('{"model_type": "llama"}')
    (folder / weights).write_bytes(b"x" * 16)
    return folder


def _run(tmp_path: Path) -> tuple[Path, Path]:
    """tmp/work/run/checkpoint-2 and a cwd elsewhere (tmp/here)."""
    ck = tmp_path / "work" / "run" / "checkpoint-2"
    ck.mkdir(parents=True)
    here = tmp_path / "here"
    here.mkdir()
    return ck, here


def _cache(root: Path, repo_id: str, commit: str = COMMIT, ref: str = "main") -> Path:
    """models--ORG--NAME as huggingface_hub writes it: blobs, refs/<ref>, snapshots/<commit>/ of links."""
    repo = root / ("models--" + repo_id.replace("/", "--"))
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / ref).parent.mkdir(parents=True, exist_ok=True)
    (repo / "refs" / ref).write_text(commit)
    snap = repo / "snapshots" / commit
    snap.mkdir(parents=True, exist_ok=True)
    for name, blob, data in (("config.json", "c" * 40, b"{}"), ("model.safetensors", "d" * 64, b"x" * 16)):
        (repo / "blobs" / blob).write_bytes(data)
        link = snap / name
        if not link.is_symlink():
            link.symlink_to(Path("..") / ".." / "blobs" / blob)
    return snap


def _env(cache: Path) -> dict[str, str]:
    return {"HF_HUB_CACHE": str(cache), "HOME": "/nonexistent-home"}


# ---- local paths ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("where", ["cwd", "checkpoint", "run", "run_parent"])
def test_a_relative_path_is_found_in_each_place(tmp_path, where):
    ck, here = _run(tmp_path)
    folder = {"cwd": here, "checkpoint": ck, "run": ck.parent, "run_parent": ck.parent.parent}[where]
    _model(folder / "base-model")
    got = find_base("base-model", checkpoint=ck, cwd=here, environ=_env(tmp_path / "hub"))
    assert got.found == folder / "base-model"
    order = [here, ck, ck.parent, ck.parent.parent]
    assert len(got.looked) == order.index(folder) + 1  # stopped at the first match, having looked before it
    assert not got.hub_id


def test_the_current_folder_comes_first_and_the_run_may_be_given(tmp_path):
    ck, here = _run(tmp_path)
    _model(here / "models" / "base")
    _model(ck.parent / "models" / "base")
    assert find_base("models/base", checkpoint=ck, cwd=here, environ={}).found == here / "models" / "base"
    elsewhere = tmp_path / "elsewhere"
    _model(elsewhere.parent / "models" / "x")
    (elsewhere).mkdir()
    got = find_base("models/x", checkpoint=ck, run=elsewhere, cwd=here, environ={})
    assert got.found == elsewhere.parent / "models" / "x"


def test_an_absolute_path_is_taken_as_is(tmp_path):
    ck, here = _run(tmp_path)
    base = _model(tmp_path / "abs" / "base", weights="pytorch_model.bin")
    got = find_base(str(base), checkpoint=ck, cwd=here, environ={})
    assert got.found == base and got.looked == [str(base)] and not got.hub_id
    gone = find_base(str(tmp_path / "gone"), checkpoint=ck, cwd=here, environ=_env(tmp_path / "hub"))
    assert gone.found is None and gone.looked == [str(tmp_path / "gone")] and not gone.hub_id


def test_a_missing_base_lists_every_place_looked(tmp_path, monkeypatch):
    ck, here = _run(tmp_path)
    (ck / "base-model").mkdir()  # there, but no model in it: said so
    (ck / "base-model" / "config.json").write_text("{}")
    monkeypatch.chdir(here)
    got = find_base("base-model", checkpoint=ck, environ=_env(tmp_path / "hub"))
    assert got.found is None and got.hub_id
    rel = lambda p: os.path.relpath(p, here)  # noqa: E731
    assert got.looked == [
        "./base-model",
        f"{rel(ck / 'base-model')} (holds config.json but no weights (model.safetensors, model.safetensors.index.json, pytorch_model.bin))",
        rel(ck.parent / "base-model"),
        rel(ck.parent.parent / "base-model"),
        f"the Hugging Face cache: {tmp_path / 'hub' / 'models--base-model'} (not there)",
    ]
    assert got.message().startswith("base `base-model` not found; looked in: ./base-model, ../work/run/checkpoint-2/")


def test_not_recorded_looks_nowhere(tmp_path):
    ck, here = _run(tmp_path)
    for rec in (None, ""):
        got = find_base(rec, checkpoint=ck, cwd=here, environ={})
        assert got.recorded is None and got.found is None and got.looked == [] and not got.hub_id


@pytest.mark.parametrize("rec", ["base\x00model", "base\x1b]0;pwned\x07", "a\nb", "x" * 5000])
def test_a_recorded_value_with_control_characters_is_never_joined(tmp_path, rec):
    ck, here = _run(tmp_path)
    got = find_base(rec, checkpoint=ck, cwd=here, environ=_env(tmp_path / "hub"))
    assert got.found is None and len(got.looked) == 1 and got.looked[0].endswith(": not a path")
    assert not any(c in got.looked[0] for c in "\x00\x1b\x07\n")


def test_a_linked_local_folder_is_followed_and_said_to_be_a_link(tmp_path):
    ck, here = _run(tmp_path)
    real = _model(tmp_path / "store" / "llama")
    (here / "base-model").symlink_to(real)
    got = find_base("base-model", checkpoint=ck, cwd=here, environ={})
    assert got.found == here / "base-model"
    assert got.looked == [f"./base-model (a link to {real})"]


# ---- the Hugging Face cache -------------------------------------------------------------------------------


def test_a_hub_id_is_found_in_the_cache_the_way_huggingface_hub_finds_it(tmp_path):
    hf = pytest.importorskip("huggingface_hub")
    ck, here = _run(tmp_path)
    cache = tmp_path / "hub"
    snap = _cache(cache, "org/name")
    got = find_base("org/name", checkpoint=ck, cwd=here, environ=_env(cache))
    assert got.found == snap and got.hub_id
    assert got.looked[-1] == f"the Hugging Face cache: {snap}"
    assert len(got.looked) == 5  # the four local places first
    oracle = hf.try_to_load_from_cache("org/name", "config.json", cache_dir=str(cache))
    assert Path(oracle).parent == snap
    assert model_folder_problem(snap) is None  # its files are links into ../../blobs: followed


def test_a_revision_reads_its_ref_and_a_hash_revision_its_snapshot(tmp_path):
    hf = pytest.importorskip("huggingface_hub")
    ck, here = _run(tmp_path)
    cache = tmp_path / "hub"
    main = _cache(cache, "gpt2")
    v1 = _cache(cache, "gpt2", commit=OTHER, ref="v1")
    env = _env(cache)
    assert find_base("gpt2", checkpoint=ck, cwd=here, environ=env).found == main
    assert find_base("gpt2", checkpoint=ck, cwd=here, revision="v1", environ=env).found == v1
    assert find_base("gpt2", checkpoint=ck, cwd=here, revision=OTHER, environ=env).found == v1
    oracle = hf.try_to_load_from_cache("gpt2", "config.json", cache_dir=str(cache), revision="v1")
    assert Path(oracle).parent == v1
    missing = find_base("gpt2", checkpoint=ck, cwd=here, revision="v2", environ=env)
    assert missing.found is None and missing.looked[-1].endswith("refs/v2 (not there)")


@pytest.mark.parametrize(
    "junk, says",
    [(b"0" * 2000, "2000 bytes"), (b"not a hash\n", "not a commit hash"), (b"../../../../etc\n", "not a commit hash")],
)
def test_a_refs_file_with_junk_is_ignored_and_said(tmp_path, junk, says):
    ck, here = _run(tmp_path)
    cache = tmp_path / "hub"
    _cache(cache, "org/name")
    (cache / "models--org--name" / "refs" / "main").write_bytes(junk)
    got = find_base("org/name", checkpoint=ck, cwd=here, environ=_env(cache))
    assert got.found is None and says in got.looked[-1] and "refs/main" in got.looked[-1]


@pytest.mark.parametrize("revision", ["../../../elsewhere", "/abs", "a/../../b", "x\x1b[2J"])
def test_a_revision_that_is_no_ref_name_is_not_joined(tmp_path, revision):
    ck, here = _run(tmp_path)
    cache = tmp_path / "hub"
    _cache(cache, "org/name")
    got = find_base("org/name", checkpoint=ck, cwd=here, revision=revision, environ=_env(cache))
    assert got.found is None and "is not a branch, tag or hash" in got.looked[-1] and "\x1b" not in got.looked[-1]


def test_a_snapshot_link_leading_outside_its_repo_is_refused(tmp_path):
    ck, here = _run(tmp_path)
    cache = tmp_path / "hub"
    snap = _cache(cache, "org/name")
    secret = tmp_path / "secret.bin"
    secret.write_bytes(b"private" * 4)
    (snap / "model.safetensors").unlink()
    (snap / "model.safetensors").symlink_to(secret)
    got = find_base("org/name", checkpoint=ck, cwd=here, environ=_env(cache))
    assert got.found is None
    assert "`model.safetensors` leads outside models--org--name/: refused" in got.looked[-1]

    # a link into another repo of the same cache is outside its own folder too
    other = _cache(cache, "org/other", commit=OTHER)
    (snap / "model.safetensors").unlink()
    (snap / "model.safetensors").symlink_to(other / "model.safetensors")
    assert find_base("org/name", checkpoint=ck, cwd=here, environ=_env(cache)).found is None


def test_a_snapshot_folder_or_refs_file_that_is_a_link_out_is_refused(tmp_path):
    ck, here = _run(tmp_path)
    cache = tmp_path / "hub"
    snap = _cache(cache, "org/name")
    elsewhere = _model(tmp_path / "elsewhere")
    os.rename(snap, tmp_path / "moved")
    snap.symlink_to(elsewhere)
    got = find_base("org/name", checkpoint=ck, cwd=here, environ=_env(cache))
    assert got.found is None and "refused" in got.looked[-1]

    ref = cache / "models--org--name" / "refs" / "main"
    target = tmp_path / "ref-elsewhere"
    target.write_text(OTHER)
    ref.unlink()
    ref.symlink_to(target)
    got = find_base("org/name", checkpoint=ck, cwd=here, environ=_env(cache))
    assert got.found is None and "refs/main (a link leading outside its cache folder: refused)" in got.looked[-1]


def test_the_cache_folder_as_huggingface_hub_finds_it(tmp_path):
    hf_constants = pytest.importorskip("huggingface_hub.constants")
    assert hub_cache({"HF_HUB_CACHE": "/a/hub", "HF_HOME": "/b"}) == Path("/a/hub")
    assert hub_cache({"HUGGINGFACE_HUB_CACHE": "/legacy", "HF_HOME": "/b"}) == Path("/legacy")
    assert hub_cache({"HF_HOME": "/b"}) == Path("/b/hub")
    assert hub_cache({"XDG_CACHE_HOME": "/x", "HOME": "/h"}) == Path("/x/huggingface/hub")
    assert hub_cache({"HOME": "/h"}) == Path("/h/.cache/huggingface/hub")
    assert hub_cache({"HF_HOME": "~/hf", "HOME": "/h"}) == Path("/h/hf/hub")
    # this process's own environment gives what huggingface_hub computed from it
    assert hub_cache() == Path(hf_constants.HF_HUB_CACHE)

    ck, here = _run(tmp_path)
    snap = _cache(tmp_path / "hfhome" / "hub", "org/name")
    got = find_base("org/name", checkpoint=ck, cwd=here, environ={"HF_HOME": str(tmp_path / "hfhome")})
    assert got.found == snap


def test_a_path_that_is_no_hub_id_is_not_looked_up_in_the_cache(tmp_path):
    ck, here = _run(tmp_path)
    for rec in ("models/org/name", "./base", "../base", "org--name", "a..b"):
        got = find_base(rec, checkpoint=ck, cwd=here, environ=_env(tmp_path / "hub"))
        assert not got.hub_id and not any("Hugging Face cache" in x for x in got.looked), rec


# ---- what a model folder is -------------------------------------------------------------------------------


def test_model_folder_problem_says_what_is_missing(tmp_path):
    assert model_folder_problem(tmp_path / "none") == "it does not exist"
    f = tmp_path / "file"
    f.write_text("x")
    assert model_folder_problem(f) == "it is not a folder"
    d = tmp_path / "d"
    d.mkdir()
    assert model_folder_problem(d) == "it holds no config.json"
    (d / "config.json").write_text("{}")
    assert "no weights" in (model_folder_problem(d) or "")
    (d / "model.safetensors").write_bytes(b"")
    assert model_folder_problem(d) == "its model.safetensors is empty"
    (d / "model.safetensors").unlink()
    (d / "model.safetensors.index.json").write_text("{}")
    assert model_folder_problem(d) is None
    assert model_folder_problem(Path("a\x00b")) == "it is not a path"
