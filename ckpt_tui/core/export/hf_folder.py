"""The rest of a ``--to hf`` folder: the tokenizer and ``generation_config.json``, copied beside the weights and
``config.json`` through the plan's copies (the staged output writes them: temp folder, fsync, one rename).

Where from, first found wins: ``--tokenizer DIR``; ``--config``'s folder (the folder given, or the one holding the
file given: the HF model folder the run started from); the tokenizer folder the run recorded (torchtitan's
``hf_assets_path``, Megatron-LM's ``--tokenizer-model`` where it is a local folder); beside the checkpoint and in
its run folder above it. The tokenizer is one folder's files, never a mix of two folders'.

A file is copied only where it is a regular file whose real path lies inside its folder (a Hugging Face cache
snapshot: inside its repository's cache folder, whose ``blobs/`` its links point into): a symbolic link out of
the folder (to someone's private file) is never followed. Such a file in ``--tokenizer``'s folder refuses the
export; in a folder found on the way the tokenizer is left out whole (half a tokenizer would load as another
one) and the export says why.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Optional

from ..fsutil import real_path, regular_inside
from ..storage import Location, is_url
from .errors import ExportError
from .plan import TOKENIZER_FILES, ExportPlan, side_file_problem

# a tokenizer's named chat templates (transformers' CHAT_TEMPLATE_DIR: <name>.jinja each)
CHAT_TEMPLATE_DIR = "additional_chat_templates"
GENERATION_CONFIG = "generation_config.json"


def _root(folder: Path) -> Path:
    """What ``folder``'s files may link into: the folder, or for a Hugging Face cache snapshot
    (``models--ORG--NAME/snapshots/<hash>/``, whose files link into ``../../blobs/``) its repository's folder."""
    real = real_path(folder)
    return real.parent.parent if real.parent.name == "snapshots" else real


def file_problem(p: Path, folder: Path) -> Optional[str]:
    """Why ``p`` (a tokenizer or generation config file found in ``folder``) is not copied, or None: a regular
    file whose real path lies inside the folder (:func:`_root`) -- every component resolved, not only the last
    -- and, for a ``.json``, JSON."""
    root = _root(folder)
    why = regular_inside(str(p), str(root))
    if why is not None:
        return why
    real = real_path(p)
    if real != root and root not in real.parents:
        return "it is a symbolic link to a file outside its folder"
    return side_file_problem(p, root)


def tokenizer_names(folder: Path) -> list[str]:
    """The tokenizer files in ``folder`` (names in it; the named chat templates as ``additional_chat_templates/X``)."""
    names = [n for n in TOKENIZER_FILES if os.path.lexists(folder / n)]
    sub = folder / CHAT_TEMPLATE_DIR
    try:
        if sub.is_dir():
            names += sorted(f"{CHAT_TEMPLATE_DIR}/{p.name}" for p in sub.iterdir() if p.name.endswith(".jinja"))
    except OSError:
        pass
    return names


def _local(d: Location) -> Optional[Path]:
    return None if is_url(d) else Path(str(d))


def run_tokenizer_dir(args: dict[str, Any]) -> tuple[Optional[Path], Optional[str]]:
    """The tokenizer folder Megatron-LM's args name (``--tokenizer-model`` of a ``HuggingFaceTokenizer`` run)
    where it is a local folder (absolute: the run's working folder is not recorded), and else what to say."""
    name = args.get("tokenizer_model")
    if not isinstance(name, str) or not name:
        return None, None
    p = Path(name)
    if p.is_absolute() and p.is_dir():
        return p, None
    kind = args.get("tokenizer_type")
    return None, (
        f"the run's tokenizer is {name!r} (Megatron-LM's --tokenizer-model"
        + (f", {kind}" if isinstance(kind, str) else "")
        + "): not a tokenizer folder here, and nothing is downloaded; give its Hugging Face tokenizer folder "
        "with --tokenizer DIR"
    )


def torchtitan_assets_dir(job: Path) -> tuple[Optional[Path], Optional[str]]:
    """The ``hf_assets_path`` torchtitan's saved job config ``job`` names (``Trainer.Config.hf_assets_path``; older
    ``JobConfig``s: ``model.hf_assets_path``), resolved as the run resolved it: relative to the run's working
    folder, which is the dump folder (where the job config lies) less ``dump_folder`` as recorded. And else what
    to say."""
    try:
        doc = json.loads(job.read_text())
    except (OSError, ValueError):
        return None, None
    if not isinstance(doc, dict):
        return None, None
    model = doc.get("model")
    model = model if isinstance(model, dict) else {}
    given = doc.get("hf_assets_path") or model.get("hf_assets_path")
    if not isinstance(given, str) or not given:
        return None, None
    p = Path(given)
    if not p.is_absolute():
        dump, cwd = doc.get("dump_folder"), None
        here = job.parent.absolute()
        if isinstance(dump, str) and Path(dump).is_absolute():
            cwd = None  # the working folder is not recorded
        elif isinstance(dump, str):
            parts = Path(os.path.normpath(dump)).parts
            if parts in ((), (".",)):
                cwd = here
            elif here.parts[-len(parts) :] == parts:
                cwd = Path(*here.parts[: -len(parts)])
        if cwd is None:
            return None, (
                f"torchtitan's job config names hf_assets_path {given!r}, relative to the run's working folder, "
                "which it does not record: give the tokenizer's folder with --tokenizer DIR"
            )
        p = cwd / p
    if p.is_dir():
        return p, None
    return None, f"torchtitan's job config names hf_assets_path {given!r}: no such folder here ({p})"


def add_hf_side_files(
    plan: ExportPlan,
    *,
    tokenizer: Optional[Path],
    config_path: Optional[Path],
    recorded: Optional[tuple[Path, str]],
    dirs: Sequence[Location],
    shown: Callable[[Path], str],
    recorded_note: Optional[str] = None,
) -> None:
    """Add to ``plan`` (a ``--to hf`` plan) the copies of the tokenizer and ``generation_config.json`` and say
    them. ``tokenizer``: ``--tokenizer``; ``config_path``: ``--config``; ``recorded``: the tokenizer folder the
    run recorded, and how it is named in the notes (``recorded_note``: why the one it named is not used, said where
    no tokenizer is found); ``dirs``: beside the checkpoint and its run folders."""
    candidates: list[tuple[Path, str]] = []
    if tokenizer is not None:
        if not tokenizer.is_dir():
            raise ExportError(f"--tokenizer {tokenizer}: no such folder")
        candidates.append((tokenizer, "--tokenizer"))
    if config_path is not None:
        candidates.append((config_path if config_path.is_dir() else config_path.parent, "--config's folder"))
    if recorded is not None:
        candidates.append(recorded)
    candidates += [(p, "beside the checkpoint") for d in dirs if (p := _local(d)) is not None]
    seen: set[Path] = set()
    folders = []
    for p, why in candidates:
        key = p.absolute()
        if key not in seen:
            seen.add(key)
            folders.append((p, why))
    copies: list[tuple[Location, str]] = []
    gen = _generation_config(plan, folders)
    if gen is not None:
        copies.append((gen, GENERATION_CONFIG))
        plan.notes.append(f"{GENERATION_CONFIG} copied from {shown(gen.parent)}")
    tok = _tokenizer(plan, folders, explicit=tokenizer, shown=shown)
    if not tok and recorded_note:
        plan.notes.append(recorded_note)
    plan.copies = copies + tok


def _generation_config(plan: ExportPlan, folders: list[tuple[Path, str]]) -> Optional[Path]:
    for d, _ in folders:
        p = d / GENERATION_CONFIG
        if not p.is_file() and not os.path.islink(p):
            continue
        why = file_problem(p, d)
        if why is not None:
            plan.not_copied.append((GENERATION_CONFIG, d, why))
            continue
        return p
    return None


def _tokenizer(
    plan: ExportPlan, folders: list[tuple[Path, str]], *, explicit: Optional[Path], shown: Callable[[Path], str]
) -> list[tuple[Location, str]]:
    """The copies of the first folder's tokenizer (all its files, or none), said."""
    for d, why in folders:
        names = tokenizer_names(d)
        if not names:
            if d is explicit:
                raise ExportError(
                    f"--tokenizer {d}: no tokenizer files there (looked for {', '.join(TOKENIZER_FILES[:8])}, ...)"
                )
            continue
        bad = [(n, w) for n in names if (w := file_problem(d / n, d)) is not None]
        if bad:
            said = "; ".join(f"{n}: {w}" for n, w in bad[:4])
            if d is explicit:
                raise ExportError(f"--tokenizer {d}: {said}. Nothing was written")
            plan.notes.append(
                f"the tokenizer in {shown(d)} ({why}) was not copied, none of its files: {said}. Copy the "
                "tokenizer into the output yourself, or give --tokenizer DIR"
            )
            return []
        plan.notes.append(f"tokenizer copied from {shown(d)} ({why}): {', '.join(names)}")
        return [(d / n, n) for n in names]
    plan.notes.append(
        "no tokenizer found (looked in " + ", ".join(shown(d) for d, _ in folders) + "): the output holds none; give "
        "--tokenizer DIR (the run's Hugging Face tokenizer folder) to copy it in"
    )
    return []
