"""One screen for the bytes a reference loader will read.

Before torch.load, torch's DCP ``FileSystemReader``, DeepSpeed's ``zero_to_fp32`` / ``ds_to_universal`` or
verl's loader touches a file, that exact file passes the allowlist screen as that loader will parse it:

- a torch zip: the record torch.load picks (``P/data.pkl``, ``P`` the first entry's folder), in an archive where
  no other reader could pick another one (:func:`torchfile.loader_record`: no second ``data.pkl``, no duplicate
  name, nothing outside ``P/``), read by the restricted unpickler;
- a DCP ``.metadata``: the whole file as written, read by the restricted unpickler (:func:`dcp.screen_metadata`);
  the fast reader (:mod:`.dcp.stream`) gathers facts only and is never the screen.

:func:`require` is what each loader call site asks first: every file it will read, each screened once per
process while unchanged (its stat identity), refused with one clear message (:class:`ScreenError`) when a file is
unreadable as that loader reads it, or names code outside the allowlist (unless the user trusts it).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, BinaryIO, Iterable, Optional, Union

from ..storage import LocationLike
from . import FormatError

_Identity = tuple[str, int, int, int, int, int]  # a file's path and stat identity (dev, inode, size, mtime, ctime)
_SCREENED: dict[
    _Identity, frozenset[str]
] = {}  # (path, stat identity) -> the globals outside the allowlist its pickle names


class ScreenError(FormatError):
    """A file a reference loader would read did not pass the screen: nothing was handed to the loader."""


def local_path(p: LocationLike) -> Path:
    """``p`` as ``Path(p)``: the loaders screened here read local files only, so a remote object is the TypeError
    ``Path`` raises for it."""
    if isinstance(p, (str, os.PathLike)):
        return Path(p)
    raise TypeError(f"expected str, bytes or os.PathLike object, not {type(p).__name__}")


def _identity(path: Path) -> _Identity:
    st = os.stat(path)
    return (os.fspath(path), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def is_metadata(path: Path) -> bool:
    from .dcp.reader import RANK_META_RE

    return path.name == ".metadata" or bool(RANK_META_RE.match(path.name))


def screen_file(where: LocationLike) -> frozenset[str]:
    """The globals outside the allowlist that ``path``'s pickle names, read as its loader reads it (a DCP
    ``.metadata`` or a torch file). Raises FormatError where it cannot be read that way, OSError."""
    path = local_path(where)
    key = _identity(path)
    hit = _SCREENED.get(key)
    if hit is not None:
        return hit
    if is_metadata(path):
        from .dcp.reader import screen_metadata

        unsafe = frozenset(screen_metadata(path))
    else:
        from .torch_save import torchfile

        unsafe = frozenset(torchfile.read(path).unsafe)
    if _identity(path) == key:  # unchanged while it was read
        _SCREENED[key] = unsafe
    return unsafe


def require(
    paths: Iterable[LocationLike], *, trust_pickles: bool = False, loader: str = "the reference loader"
) -> None:
    """Screen every file ``loader`` will read; raise :class:`ScreenError` naming each one that fails."""
    problems = []
    for where in paths:
        p = local_path(where)
        try:
            unsafe = screen_file(p)
        except FormatError as e:
            problems.append(f"{p}: {e}")
            continue
        except OSError as e:
            problems.append(f"{p}: cannot read: {e.strerror or e}")
            continue
        if unsafe and not trust_pickles:
            problems.append(
                f"{p}: unsafe-pickle: names code outside ckpt-tui's allowlist "
                f"({', '.join(sorted(unsafe)[:6])}); pass --trust-pickles only if you trust its source"
            )
    if problems:
        raise ScreenError(
            f"refusing to hand these files to {loader}, which would unpickle them:\n  " + "\n  ".join(problems)
        )


def tag_files(where: LocationLike) -> list[Path]:
    """Every torch file of a DeepSpeed tag folder (zero_to_fp32 and ds_to_universal read each of them)."""
    tag_dir = local_path(where)
    return sorted(p for p in tag_dir.iterdir() if p.name.endswith(".pt") and p.is_file())


def dcp_metadata_files(folder: LocationLike) -> list[Path]:
    from .dcp.reader import metadata_files

    glob_meta, ranks = metadata_files(local_path(folder))
    return [local_path(glob_meta)] if glob_meta else [local_path(p) for p in ranks]  # the local folder's Paths


def dcp_reader(where: LocationLike, *, trust_pickles: bool = False, rank: Optional[int] = None) -> Any:
    """torch's ``FileSystemReader`` for ``folder``, once its metadata files passed the screen, handed the
    ``Metadata`` ckpt-tui unpickled itself (torch's own classes, through the allowlist) instead of letting it
    ``pickle.load`` the file. With ``trust_pickles``: torch's reader as it is. ``rank``: every read of the
    metadata reads that rank's ``__{rank}.metadata`` (its chunks alone)."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import StorageMeta

    folder = local_path(where)
    require(dcp_metadata_files(folder), trust_pickles=trust_pickles, loader="torch's DCP reader")
    if trust_pickles and rank is None:
        return FileSystemReader(str(folder))

    # torch is not followed by mypy (pyproject.toml): FileSystemReader is Any, a class mypy cannot check against
    class ScreenedReader(FileSystemReader):  # type: ignore[misc]
        def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
            from .dcp.reader import RANK_META_RE
            from .unpickle import torch_metadata

            asked = rank if rank is not None else kwargs.get("rank")
            name = f"__{asked}.metadata" if asked is not None else ".metadata"
            path = folder / name
            if rank is None and (not path.is_file() or (asked is not None and not RANK_META_RE.match(name))):
                path = folder / ".metadata"
            with open(path, "rb") as f:  # these bytes, read by the allowlist unpickler, are what torch gets
                data = f.read()
            try:
                meta = torch_metadata(data)
            except FormatError as e:
                raise ScreenError(f"refusing to hand {path} to torch's DCP reader: {e}") from None
            if getattr(meta, "storage_meta", None) is None:
                meta.storage_meta = StorageMeta()
            meta.storage_meta.load_id = self.load_id
            self.screened_metadata = meta
            return meta

    reader = ScreenedReader(str(folder))
    if hasattr(reader, "transforms"):  # torch >= 2.7: extensions (zstd) inflate under a bound per item
        from .dcp.extensions import BoundedTransforms

        reader.transforms = BoundedTransforms(reader.transforms, lambda item: _item_bound(reader, item))
    return reader


def _item_bound(reader: Any, item: Any) -> int:
    """The most bytes an extension may inflate one read item of ``reader``'s folder to: a tensor chunk's bytes
    (as .metadata declares the chunk) and a zip's slack; a BytesIO object, the hyper-parameter bound."""
    from .dcp.extensions import MAX_OBJECT, ZIP_SLACK

    meta = getattr(reader, "screened_metadata", None)
    index = getattr(item, "storage_index", None)
    md: Any = getattr(meta, "state_dict_metadata", {}).get(getattr(index, "fqn", None))
    chunks = getattr(md, "chunks", None)
    if md is None or not chunks:
        return MAX_OBJECT
    try:
        item_size = getattr(md.properties, "dtype").itemsize
        offset = tuple(getattr(index, "offset", None) or ())
        sizes = next((c.sizes for c in chunks if tuple(c.offsets) == offset), md.size)
        n = 1
        for d in sizes:
            n *= int(d)
        return n * int(item_size) + ZIP_SLACK
    except (AttributeError, TypeError, ValueError):
        return MAX_OBJECT


def _admits(q: str) -> bool:
    """Does ckpt-tui's own allowlist read the global ``q`` (as a stand-in or one of its safe functions)?"""
    from .unpickle import FUNCTIONS, RECORD_GLOBALS, STUB_GLOBALS, TUPLE_GLOBALS

    return q in STUB_GLOBALS or q in RECORD_GLOBALS or q in TUPLE_GLOBALS or q in FUNCTIONS


def _classes(names: Iterable[str]) -> list[type]:
    """The classes among ``names`` that can be imported here, for torch's ``safe_globals`` (functions stay out of
    torch's unpickler: it then cannot read the file, which is read unrestricted below, screened twice)."""
    import importlib

    classes = []
    for q in names:
        module, _, name = q.rpartition(".")
        try:
            obj = getattr(importlib.import_module(module), name)
        except Exception:  # noqa: BLE001 - a framework that is not installed here, or moved the class
            continue
        if isinstance(obj, type):
            classes.append(obj)
    return classes


def torch_load(path: Union[LocationLike, BinaryIO], **kwargs: Any) -> Any:
    """``torch.load`` of a file that passed the screen, with torch's own reader as a second, independent screen:
    torch's ``weights_only`` unpickler reads it where it can — as it is (a plain state dict), else admitting the
    framework classes ckpt-tui's allowlist admits (``torch.serialization.safe_globals``). Where torch lists a global
    that ckpt-tui's allowlist does not admit, the two screens disagree: :class:`ScreenError`, nothing is loaded.
    Only a file torch's restricted unpickler cannot read at all (numpy arrays, ShardedTensor), whose globals both
    screens admit, is read unrestricted."""
    import pickle

    import torch

    kwargs.pop("weights_only", None)
    try:
        return torch.load(path, weights_only=True, **kwargs)
    except pickle.UnpicklingError:
        pass
    try:
        names = list(torch.serialization.get_unsafe_globals_in_checkpoint(path))
    except Exception as e:  # noqa: BLE001 - torch cannot even list them: nothing to cross-check, so nothing loads
        raise ScreenError(f"refusing to load {path}: torch's own reader cannot list its globals ({e})") from None
    outside = sorted(q for q in names if not _admits(q))
    if outside:
        raise ScreenError(
            f"refusing to load {path}: torch's own reader finds globals outside ckpt-tui's allowlist "
            f"({', '.join(outside[:6])}): unsafe-pickle"
        ) from None
    classes = _classes(names)
    if classes:
        try:
            with torch.serialization.safe_globals(classes):
                return torch.load(path, weights_only=True, **kwargs)
        except pickle.UnpicklingError:
            pass
    return torch.load(path, weights_only=False, **kwargs)


class _TorchWithScreenedLoad:
    """torch, as a module that reads its files through :func:`torch_load`: given to DeepSpeed's ``zero_to_fp32``
    as its ``torch`` (it calls ``torch.load(..., weights_only=False)`` on every file of a tag)."""

    def __init__(self, torch: Any) -> None:
        self._torch = torch

    def __getattr__(self, name: str) -> Any:
        return getattr(self._torch, name)

    def load(self, f: Any, map_location: Any = None, *args: Any, **kwargs: Any) -> Any:
        return torch_load(f, map_location=map_location, **kwargs)


def zero_to_fp32() -> Any:
    """DeepSpeed's ``zero_to_fp32`` module with its ``torch.load`` calls going through :func:`torch_load` (the files
    it reads must have passed :func:`require` first)."""
    import torch
    from deepspeed.utils import zero_to_fp32 as z

    if not isinstance(z.torch, _TorchWithScreenedLoad):
        z.torch = _TorchWithScreenedLoad(torch)
    # its tqdm bars ("Loading checkpoint shards", "Gathering sharded weights") would land in ckpt-tui's own
    # output (verify's, the TUI's terminal): ckpt-tui reports progress itself
    z.tqdm = _no_bar
    return z


def _no_bar(iterable: Any = None, *args: Any, **kwargs: Any) -> Any:
    """tqdm's call, without a bar: the iterable itself."""
    return iterable
