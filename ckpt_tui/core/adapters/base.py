"""Where an adapter's base model is on this machine -- never the network.

    lookup = find_base(cfg.base_model_name_or_path, checkpoint=Path("run/checkpoint-2"), revision=cfg.revision)
    lookup.found     # a folder holding config.json and weights, or None
    lookup.looked    # every place looked, in order: what "base not found; looked in: …" lists

``base_model_name_or_path`` is what the training script passed to ``from_pretrained``: a path (often relative to
where training ran) or a Hub id. A path is tried as written when absolute; a relative one against the current
folder, the checkpoint, its run folder and the run's parent. A Hub id (``ORG/NAME`` or ``NAME``) that no local
folder matched is looked up in the local Hugging Face cache only (``$HF_HUB_CACHE``, else ``$HF_HOME/hub``, else
``~/.cache/huggingface/hub``), laid out as huggingface_hub writes it::

    models--ORG--NAME/refs/main                  the commit hash (40 hex digits) of the revision
    models--ORG--NAME/snapshots/<hash>/…         links into ../../blobs/

The cache is someone's folder: a refs file is read only when small and holding a hash, and a snapshot with a link
that leads outside its ``models--ORG--NAME/`` folder is refused, not followed. The recorded value is someone's
text: one with control characters is never joined to a path. Nothing here raises on an OSError.
"""

from __future__ import annotations

import os
import re
import stat as _stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Optional

from ..safetext import UNSAFE, visible

CONFIG = "config.json"
# the weights a Hugging Face model folder holds, in from_pretrained's order of preference
WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")
MAX_REF_BYTES = 1024  # a refs file holds a 40-character hash and a newline
MAX_RECORDED = 4096  # a longer base_model_name_or_path is not a path anyone wrote
MAX_SNAPSHOT_ENTRIES = 10_000  # entries of a snapshot checked for links leading out
MAX_SNAPSHOT_DEPTH = 4
HASH_RE = re.compile(r"^[0-9a-f]{40}$")
# huggingface_hub's validate_repo_id: NAME or NAMESPACE/NAME, [\w.-]{1,96} each, not starting or ending with
# '-' or '.', no '--' or '..'
_PART = r"[A-Za-z0-9_](?:[\w.-]{0,94}[A-Za-z0-9_])?"
HUB_ID_RE = re.compile(rf"^(?:{_PART}/)?{_PART}$", re.ASCII)
REF_RE = re.compile(r"^[\w.-]{1,128}(?:/[\w.-]{1,128}){0,3}$", re.ASCII)  # a branch or tag name (refs/pr/1 too)


@dataclass
class BaseLookup:
    recorded: Optional[str]  # base_model_name_or_path as written (None: not recorded)
    found: Optional[Path]  # a folder holding config.json and weights
    looked: list[str] = field(default_factory=list)  # every place looked, in order, as text for a message
    hub_id: bool = False  # recorded looks like ORG/NAME (or NAME) and no local folder matched
    revision: Optional[str] = None  # the revision looked up in the cache (None: main)

    def message(self) -> str:
        """``base `ORG/NAME` not found; looked in: ./ORG/NAME, ckpt/ORG/NAME, …``, or where it was found."""
        name = f"`{visible(self.recorded)}`" if self.recorded is not None else "not recorded"
        if self.found is not None:
            return f"base {name} found at {visible(str(self.found))}"
        if not self.looked:
            return f"base {name}"
        return f"base {name} not found; looked in: " + ", ".join(self.looked)


def model_folder_problem(path: Path) -> Optional[str]:
    """None when ``path`` is a usable Hugging Face model folder (``config.json`` and ``model.safetensors``, a sharded
    index, or ``pytorch_model.bin``); else why not, as text for a message. Stat calls only, nothing read."""
    try:
        st = os.stat(path)
    except ValueError:
        return "it is not a path"
    except OSError as e:
        return "it does not exist" if isinstance(e, FileNotFoundError) else f"it cannot be read ({e.strerror or e})"
    if not _stat.S_ISDIR(st.st_mode):
        return "it is not a folder"
    if not _regular(path / CONFIG):
        return f"it holds no {CONFIG}"
    for w in WEIGHTS:
        p = path / w
        if _regular(p):
            try:
                if os.stat(p).st_size == 0:
                    return f"its {w} is empty"
            except OSError:
                continue
            return None
    return f"it holds {CONFIG} but no weights ({', '.join(WEIGHTS[:3])})"


def _regular(p: Path) -> bool:
    try:
        return _stat.S_ISREG(os.stat(p).st_mode)
    except (OSError, ValueError):
        return False


def _home(environ: Mapping[str, str]) -> Path:
    h = environ.get("HOME")
    if h:
        return Path(h)
    try:
        return Path.home()
    except (RuntimeError, KeyError, OSError):
        return Path("/")


def _expand(p: str, environ: Mapping[str, str]) -> Path:
    if p == "~" or p.startswith("~/"):
        return _home(environ) / p[2:]
    return Path(p)


def hub_cache(environ: Optional[Mapping[str, str]] = None) -> Path:
    """The Hugging Face hub cache folder, as huggingface_hub finds it: ``$HF_HUB_CACHE``, the legacy
    ``$HUGGINGFACE_HUB_CACHE``, ``$HF_HOME/hub``, ``$XDG_CACHE_HOME/huggingface/hub``, ``~/.cache/huggingface/hub``."""
    env = os.environ if environ is None else environ
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        v = env.get(var)
        if v and not UNSAFE.search(v):
            return _expand(v, env)
    home = env.get("HF_HOME")
    if home and not UNSAFE.search(home):
        return _expand(home, env) / "hub"
    xdg = env.get("XDG_CACHE_HOME")
    base = _expand(xdg, env) if xdg and not UNSAFE.search(xdg) else _home(env) / ".cache"
    return base / "huggingface" / "hub"


def _shown(p: Path, cwd: Path) -> str:
    """A place as a message lists it, relative to the current folder when near (``./base-model``,
    ``ckpt/base-model``, ``../base-model``), else the path; escaped."""
    try:
        rel = os.path.relpath(p, cwd)
    except ValueError:
        return visible(str(p))
    parts = Path(rel).parts
    if os.path.isabs(rel) or parts.count("..") > 3:
        return visible(str(p))
    return visible(rel if len(parts) > 1 or rel in (".", "..") else "./" + rel)


def _inside(p: Path, root: Path) -> bool:
    try:
        real, top = os.path.realpath(p), os.path.realpath(root)
    except (OSError, ValueError):
        return False
    return real == top or real.startswith(top.rstrip(os.sep) + os.sep)


def _escaping_link(folder: Path, root: Path) -> Optional[str]:
    """The first entry under ``folder`` that is a link resolving outside ``root`` (or too many entries), or None."""
    seen = 0
    stack: list[tuple[Path, int]] = [(folder, 0)]
    while stack:
        d, depth = stack.pop()
        try:
            entries = list(os.scandir(d))
        except OSError:
            continue
        for e in entries:
            seen += 1
            if seen > MAX_SNAPSHOT_ENTRIES:
                return f"more than {MAX_SNAPSHOT_ENTRIES} entries"
            p = Path(e.path)
            try:
                link = e.is_symlink()
                is_dir = e.is_dir(follow_symlinks=False)
            except OSError:
                continue
            if link and not _inside(p, root):
                return str(p.relative_to(folder))
            if is_dir and depth < MAX_SNAPSHOT_DEPTH:
                stack.append((p, depth + 1))
    return None


def _read_ref(ref: Path, repo: Path) -> tuple[Optional[str], Optional[str]]:
    """(commit hash, None) from a refs file, or (None, why it is not used)."""
    try:
        if os.path.islink(ref) and not _inside(ref, repo):
            return None, "a link leading outside its cache folder: refused"
        st = os.stat(ref)
        if not _stat.S_ISREG(st.st_mode):
            return None, "not a file"
        if st.st_size > MAX_REF_BYTES:
            return None, f"{st.st_size} bytes, not a commit hash: ignored"
        with open(ref, "rb") as f:
            data = f.read(MAX_REF_BYTES + 1)
    except FileNotFoundError:
        return None, "not there"
    except OSError as e:
        return None, f"cannot be read ({visible(e.strerror or e)})"
    text = data.decode("ascii", "replace").strip()
    if len(data) > MAX_REF_BYTES or not HASH_RE.match(text):
        return None, "not a commit hash: ignored"
    return text, None


def _from_cache(repo_id: str, revision: Optional[str], cache: Path, looked: list[str]) -> Optional[Path]:
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    where = visible(str(repo))
    if not os.path.isdir(repo):
        looked.append(f"the Hugging Face cache: {where} (not there)")
        return None
    if os.path.islink(repo) and not _inside(repo, cache):
        looked.append(f"the Hugging Face cache: {where} (a link leading outside the cache: refused)")
        return None
    rev = revision or "main"
    if HASH_RE.match(rev):
        commit = rev
    elif not REF_RE.match(rev) or ".." in rev.split("/"):
        looked.append(f"the Hugging Face cache: revision `{visible(rev[:80])}` is not a branch, tag or hash")
        return None
    else:
        ref = repo / "refs" / rev
        got, why = _read_ref(ref, repo)
        if got is None:
            looked.append(f"the Hugging Face cache: {visible(str(ref))} ({why})")
            return None
        commit = got
    snap = repo / "snapshots" / commit
    shown = visible(str(snap))
    if not _inside(snap, repo):
        looked.append(f"the Hugging Face cache: {shown} (a link leading outside its cache folder: refused)")
        return None
    problem = model_folder_problem(snap)
    if problem is not None:
        looked.append(f"the Hugging Face cache: {shown} ({problem})")
        return None
    out = _escaping_link(snap, repo)
    if out is not None:
        looked.append(
            f"the Hugging Face cache: {shown} (`{visible(out)}` leads outside "
            f"{visible(repo.name)}/: refused, not followed)"
        )
        return None
    looked.append(f"the Hugging Face cache: {shown}")
    return snap


def find_base(
    recorded: Optional[str],
    *,
    checkpoint: Path,
    run: Optional[Path] = None,
    cwd: Optional[Path] = None,
    revision: Optional[str] = None,
    environ: Optional[Mapping[str, str]] = None,
) -> BaseLookup:
    """Look for the base model ``recorded`` names (adapter_config.json's ``base_model_name_or_path``) on this
    machine, in the order the module docstring gives; ``looked`` lists every place tried."""
    env = os.environ if environ is None else environ
    if recorded is None or recorded == "":
        return BaseLookup(None, None, [], False, revision)
    out = BaseLookup(recorded, None, [], False, revision)
    if "\x00" in recorded or UNSAFE.search(recorded) or len(recorded) > MAX_RECORDED:
        shown = recorded if len(recorded) <= 120 else recorded[:110] + "…"
        out.looked.append(f"`{visible(shown)}`: not a path")
        return out
    if cwd is None:
        try:
            cwd = Path.cwd()
        except OSError:
            cwd = Path("/")
    run = checkpoint.parent if run is None else run
    p = _expand(recorded, env)
    if p.is_absolute():
        places = [p]
    else:
        places = []
        for d in (cwd, checkpoint, run, run.parent):
            c = d / p
            if c not in places:
                places.append(c)
    for c in places:
        text = visible(str(c)) if p.is_absolute() else _shown(c, cwd)  # an absolute path as the user wrote it
        problem = model_folder_problem(c)
        try:
            link = os.path.islink(c)
        except (OSError, ValueError):
            link = False
        if problem is None:
            if link:
                text += f" (a link to {visible(os.path.realpath(c))})"
            out.looked.append(text)
            out.found = c
            return out
        out.looked.append(text if problem == "it does not exist" else f"{text} ({problem.removeprefix('it ')})")
    if HUB_ID_RE.match(recorded) and "--" not in recorded and ".." not in recorded:
        out.hub_id = True
        try:
            cache = hub_cache(env)
            out.found = _from_cache(recorded, revision, cache, out.looked)
        except (OSError, ValueError) as e:
            out.looked.append(f"the Hugging Face cache ({visible(e)})")
    return out
