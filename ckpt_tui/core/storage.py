"""Where a checkpoint's bytes live: a local path (``pathlib.Path``, read exactly as before) or an object in
object storage named by an fsspec URL (``s3://bucket/run/checkpoint-2000``; ``gs://``, ``az://`` through the
same code where their fsspec backend is installed).

:class:`Location` is what the readers may ask of either kind: the few ``Path`` questions (``/``, ``name``,
``parent``, ``iterdir``, ``is_file``, ``is_dir``, ``exists``, ``stat``, ``read_bytes``, ``glob``), which
:class:`RemotePath` answers from one listing of the prefix; a function that takes either is annotated with
it, one that needs a local file (``os.open``, ``mmap``, a rename) with ``Path``. :func:`open_read` opens
either kind for reading. A remote file reads by ranged GETs of exactly
the bytes asked for (no read-ahead blocks beyond a local ``open``'s 8 KiB buffer), and every byte
fetched is counted (:func:`bytes_fetched`). fsspec and its backends are imported here only inside
functions: they are an optional extra (``pip install 'ckpt-tui[s3]'``).
"""

from __future__ import annotations

import fnmatch
import io
import os
import re
import threading
from collections.abc import Iterator, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, Literal, Optional, Protocol, Union

URL_RE = re.compile(r"^([a-z][a-z0-9+.-]*)://(.*)$")
EXTRA_HINT = "pip install 'ckpt-tui[s3]'"
# the timeouts and retries of every remote call: a wrong endpoint or a dead network is one clear line well
# within 30 s, never a hang
CONNECT_TIMEOUT = 5
READ_TIMEOUT = 6
ATTEMPTS = 2  # s3fs's retries of a timed-out or dropped request (botocore's own are off)
READ_BUFFER = 4096  # what a local open(path, "rb") buffers (st_blksize): remote reads fetch what local reads read

_lock = threading.Lock()
_fetched = [0]
_fs_cache: dict[str, Any] = {}  # protocol -> its fsspec filesystem (fsspec is not type-checked: Any)
_info: dict[str, dict[str, Any]] = {}  # "protocol://key" -> fsspec info of a listed object or folder
_children: dict[str, list[str]] = {}  # "protocol://key" of a folder -> its entries' names


class StorageError(Exception):
    """A remote location cannot be used (no backend, no credentials, no bucket, access denied,
    unreachable endpoint). The message is one line that says what to do."""


class StatLike(Protocol):
    """What :meth:`Location.stat` answers: ``os.stat_result``'s size and modification time."""

    @property
    def st_size(self) -> int: ...
    @property
    def st_mtime(self) -> float: ...
    @property
    def st_mtime_ns(self) -> int: ...


class Location(Protocol):
    """A file or folder that is either local (``pathlib.Path``) or in object storage (:class:`RemotePath`): the
    part of ``Path`` that both answer and the readers use. It is not ``os.PathLike``: ``open``, ``os.stat`` and
    friends take a Location only through :func:`open_read`, :func:`size`, :func:`read_range` and
    :func:`listdir`, which read either kind."""

    @property
    def name(self) -> str: ...
    @property
    def suffix(self) -> str: ...
    @property
    def parent(self) -> Location: ...
    def __truediv__(self, name: str) -> Location: ...
    def joinpath(self, *names: str) -> Location: ...
    def resolve(self) -> Location: ...
    def absolute(self) -> Location: ...
    def is_absolute(self) -> bool: ...
    def stat(self) -> StatLike: ...
    def exists(self) -> bool: ...
    def is_dir(self) -> bool: ...
    def is_file(self) -> bool: ...
    def iterdir(self) -> Iterator[Location]: ...
    def glob(self, pattern: str) -> Iterator[Location]: ...
    def open(self, mode: Literal["rb"]) -> BinaryIO: ...
    def read_bytes(self) -> bytes: ...


# what the functions below take for "a file or folder": a Location, or a str or os.PathLike naming one
# (a str may be a URL)
LocationLike = Union[str, "os.PathLike[str]", Location]


def is_url(p: object) -> bool:
    return isinstance(p, RemotePath) or (isinstance(p, str) and URL_RE.match(p) is not None)


def bytes_fetched() -> int:
    """Bytes read from object storage by this process so far."""
    return _fetched[0]


def _count(n: int) -> None:
    with _lock:
        _fetched[0] += n


def filesystem(protocol: str) -> Any:
    """The fsspec filesystem for ``protocol`` (one per process), with short timeouts and few retries."""
    fs = _fs_cache.get(protocol)
    if fs is not None:
        return fs
    try:
        import fsspec
    except ImportError:
        raise StorageError(f"{protocol}:// paths need the optional object-storage support: {EXTRA_HINT}") from None
    opts: dict[str, Any] = {}
    if protocol in ("s3", "s3a"):
        try:
            import s3fs  # noqa: F401
        except ImportError:
            raise StorageError(f"{protocol}:// paths need the optional object-storage support: {EXTRA_HINT}") from None
        # credentials and endpoint come from the standard AWS environment and config (AWS_ENDPOINT_URL,
        # AWS_PROFILE, ~/.aws); botocore's own timeouts and retries are kept low so errors come fast
        opts = {
            "config_kwargs": {
                "connect_timeout": CONNECT_TIMEOUT,
                "read_timeout": READ_TIMEOUT,
                "retries": {"max_attempts": 1, "mode": "standard"},
            }
        }
    try:
        # a new instance (fsspec's own cache is keyed by these options only: an instance made for an earlier
        # AWS_ENDPOINT_URL in this process would be handed back, talking to that endpoint); one per process is ours
        fs = fsspec.filesystem(protocol, skip_instance_cache=True, **opts)
    except (ImportError, ValueError) as e:
        raise StorageError(f"{protocol}:// paths need an fsspec backend that is not installed ({e})") from None
    if hasattr(fs, "retries"):
        fs.retries = ATTEMPTS
    _fs_cache[protocol] = fs
    return fs


def explain(url: str, e: BaseException) -> str:
    """One line that says why ``url`` cannot be used."""
    name = type(e).__name__
    text = " ".join(str(e).split())
    endpoint = os.environ.get("AWS_ENDPOINT_URL") or os.environ.get("AWS_ENDPOINT_URL_S3")
    if (
        name in ("NoCredentialsError", "PartialCredentialsError", "CredentialRetrievalError")
        or "Unable to locate credentials" in text
    ):
        return (
            f"{url}: no credentials for object storage (set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, "
            f"or AWS_PROFILE)"
        )
    if (
        isinstance(e, PermissionError)
        or "AccessDenied" in text
        or "InvalidAccessKeyId" in text
        or "SignatureDoesNotMatch" in text
        or "Forbidden" in text
    ):
        return f"{url}: access denied ({text or name})"
    if isinstance(e, FileNotFoundError) or "NoSuchBucket" in text:
        return f"{url}: no such bucket, file or folder"
    if name in (
        "EndpointConnectionError",
        "ConnectTimeoutError",
        "ReadTimeoutError",
        "ConnectionClosedError",
        "ClientConnectorError",
        "ServerTimeoutError",
        "FSTimeoutError",
        "TimeoutError",
    ) or isinstance(e, (ConnectionError, TimeoutError)):
        where = f" {endpoint}" if endpoint else ""
        return f"{url}: cannot reach the object-storage endpoint{where} ({text or name})"
    return f"{url}: cannot be read ({name}: {text})" if text else f"{url}: cannot be read ({name})"


class RemoteStat:
    def __init__(self, size: int, mtime: float, is_dir: bool) -> None:
        self.st_size = size
        self.st_mtime = mtime
        self.st_mtime_ns = int(mtime * 1e9)
        self.is_dir = is_dir


def _mtime(info: Mapping[str, Any]) -> float:
    for k in ("LastModified", "mtime", "last_modified", "updated", "created"):
        v = info.get(k)
        if v is None:
            continue
        if hasattr(v, "timestamp"):
            return float(v.timestamp())
        try:
            return float(v)
        except (TypeError, ValueError):
            continue
    return 0.0


class RemotePath:
    """An object or a folder (a key prefix) in object storage, with the subset of ``Path`` the readers use."""

    __slots__ = ("protocol", "key")

    def __init__(self, url: str, key: Optional[str] = None) -> None:
        if key is None:
            m = URL_RE.match(url)
            if m is None:
                raise ValueError(f"not a URL: {url}")
            url, key = m.group(1), m.group(2)
        self.protocol = url
        self.key = key.strip("/")

    # ---- names
    def __str__(self) -> str:
        return f"{self.protocol}://{self.key}"

    def __repr__(self) -> str:
        return f"RemotePath({str(self)!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, RemotePath) and (self.protocol, self.key) == (other.protocol, other.key)

    def __hash__(self) -> int:
        return hash((self.protocol, self.key))

    def __lt__(self, other: object) -> bool:
        return str(self) < str(other)

    def __truediv__(self, name: str) -> RemotePath:
        name = str(name).strip("/")
        return RemotePath(self.protocol, f"{self.key}/{name}" if name else self.key)

    def joinpath(self, *names: str) -> RemotePath:
        p = self
        for n in names:
            p = p / n
        return p

    @property
    def name(self) -> str:
        return self.key.rsplit("/", 1)[-1]

    @property
    def suffix(self) -> str:
        n = self.name
        i = n.rfind(".")
        return n[i:] if 0 < i < len(n) - 1 else ""

    @property
    def parent(self) -> RemotePath:
        return RemotePath(self.protocol, self.key.rsplit("/", 1)[0] if "/" in self.key else self.key)

    def resolve(self) -> RemotePath:
        return self

    def absolute(self) -> RemotePath:
        return self

    def is_absolute(self) -> bool:
        return True

    # ---- what is there
    @property
    def fs(self) -> Any:
        return filesystem(self.protocol)

    def info(self) -> dict[str, Any]:
        got = _info.get(str(self))
        if got is None:
            got = dict(self.fs.info(self.key))
            _info[str(self)] = got
        return got

    def stat(self) -> RemoteStat:
        i = self.info()
        return RemoteStat(int(i.get("size") or 0), _mtime(i), i.get("type") == "directory")

    def exists(self) -> bool:
        try:
            self.info()
            return True
        except FileNotFoundError:
            return False

    def is_dir(self) -> bool:
        try:
            return self.info().get("type") == "directory"
        except FileNotFoundError:
            return False

    def is_file(self) -> bool:
        try:
            return self.info().get("type") != "directory"
        except FileNotFoundError:
            return False

    def iterdir(self) -> Iterator[RemotePath]:
        names = _children.get(str(self))
        if names is None:
            entries = self.fs.ls(self.key, detail=True)
            found: list[str] = []
            for e in entries:
                full = e["name"].rstrip("/")
                if full == self.key:
                    continue
                if not full.startswith(self.key + "/"):
                    raise StorageError(f"{self}: the listing returned {full!r}, which is not below it")
                child = self / key_parts(self, full[len(self.key) + 1 :])[-1]
                if child.key == self.key:
                    continue
                _info[str(child)] = dict(e)
                found.append(child.name)
            _children[str(self)] = names = found
        return iter([self / n for n in names])

    def glob(self, pattern: str) -> Iterator[RemotePath]:
        return iter([p for p in self.iterdir() if fnmatch.fnmatchcase(p.name, pattern)])

    # ---- bytes
    def open(self, mode: str = "rb") -> io.BufferedReader:
        if mode != "rb":
            raise PermissionError(f"{self}: object storage is read-only here")
        return io.BufferedReader(RangedFile(self), buffer_size=READ_BUFFER)

    def read_bytes(self) -> bytes:
        with self.open() as f:
            return f.read()


def key_parts(root: RemotePath, rel: str) -> list[str]:
    """The segments of the key ``rel`` below ``root``, or StorageError where it would leave the prefix or fold
    a folder into itself: an empty segment (``ckpt//x``, a leading ``/``), ``.`` or ``..``. Such a key, a file
    placed there by anyone who can write the bucket, is refused for the listing and for a download alike."""
    parts = rel.split("/")
    bad = next((p for p in parts if p in ("", ".", "..")), None)
    if bad is not None:
        what = "an empty segment" if bad == "" else f"a `{bad}` segment"
        raise StorageError(
            f"{root}: the object key {(root.key + '/' + rel)!r} has {what}: ckpt-tui refuses keys that "
            "would leave the prefix or nest a folder into itself; remove or rename that object"
        )
    return parts


def listing(root: RemotePath) -> None:
    """List everything below ``root`` with one recursive listing and keep it for ``iterdir``/``stat``.
    The first contact: tried once, so a wrong endpoint or a dead network is one line within seconds."""
    fs = root.fs
    retries = getattr(fs, "retries", None)
    if retries is not None:
        fs.retries = 1
    try:
        fs.invalidate_cache(root.key)  # a rescan lists afresh, not from fsspec's listing cache
        found: dict[str, dict[str, Any]] = fs.find(root.key, detail=True, withdirs=True)
    finally:
        if retries is not None:
            fs.retries = retries
    base = str(root)
    for cache in (_info, _children):  # a rescan forgets what an earlier listing saw (deleted objects)
        for k in [k for k in cache if k == base or k.startswith(base + "/")]:
            del cache[k]
    mine = found.get(root.key) or found.get(root.key + "/")
    if mine is not None and mine.get("type") != "directory":
        _info[str(root)] = mine  # a single object
        return
    if not found:
        root.info()  # FileNotFoundError for a missing bucket or prefix
    kids: dict[str, dict[str, None]] = {str(root): {}}
    _info.setdefault(str(root), {"name": root.key, "type": "directory", "size": 0})
    for name, info in found.items():
        key = name.rstrip("/")
        if not key.startswith(root.key + "/"):
            continue
        parts = key_parts(root, key[len(root.key) + 1 :])
        folder = root
        for i, part in enumerate(parts):
            kids.setdefault(str(folder), {})[part] = None
            folder = folder / part
            if i < len(parts) - 1:
                _info.setdefault(str(folder), {"name": folder.key, "type": "directory", "size": 0})
        _info[str(folder)] = info
    for where, names in kids.items():
        _children[where] = list(names)


def check(url: str) -> None:
    """List ``url`` (the first contact with its endpoint); StorageError with one line if it cannot be used."""
    try:
        listing(RemotePath(str(url)))
    except StorageError:
        raise
    except Exception as e:  # no credentials, access denied, no bucket, endpoint unreachable
        raise StorageError(explain(str(url), e)) from None


class RangedFile(io.RawIOBase):
    """A read-only, seekable raw file over one object: each read is one ranged GET of the bytes asked for."""

    def __init__(self, path: RemotePath) -> None:
        super().__init__()
        self.path = path
        self.fs = path.fs
        self.size = path.stat().st_size
        self.pos = 0
        self.name = str(path)

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = 0) -> int:
        base = {0: 0, 1: self.pos, 2: self.size}[whence]
        self.pos = max(0, base + offset)
        return self.pos

    def _get(self, start: int, n: int) -> bytes:
        n = min(n, self.size - start)
        if n <= 0:
            return b""
        data: bytes = self.fs.cat_file(self.path.key, start=start, end=start + n)
        _count(len(data))
        return data

    def readinto(self, b: Any) -> int:  # a writable buffer (collections.abc.Buffer from Python 3.12)
        data = self._get(self.pos, len(b))
        b[: len(data)] = data
        self.pos += len(data)
        return len(data)

    def readall(self) -> bytes:
        data = self._get(self.pos, self.size - self.pos)
        self.pos += len(data)
        return data


if TYPE_CHECKING:  # both kinds are Locations (checked by mypy, nothing at run time)
    _LOCAL_PATH: Location = Path()
    _REMOTE_PATH: Location = RemotePath("s3://bucket")


def as_path(p: LocationLike) -> Location:
    """``p`` (a str, a Path or a RemotePath) as a Path or, for a URL, a RemotePath."""
    if isinstance(p, RemotePath):
        return p
    s = _local(p)
    s = os.fspath(s) if not isinstance(s, str) else s
    return RemotePath(s) if URL_RE.match(s) else Path(s)


def _remote(p: object) -> Optional[RemotePath]:
    """``p`` as a RemotePath where it names one (:func:`is_url`), else None."""
    if isinstance(p, RemotePath):
        return p
    return RemotePath(p) if isinstance(p, str) and URL_RE.match(p) else None


def _as_remote(p: LocationLike) -> RemotePath:
    """``p``, which names an object in object storage, as a RemotePath."""
    rp = _remote(p)
    if rp is None:
        raise ValueError(f"not a URL: {p}")
    return rp


def _local(p: LocationLike) -> Union[str, os.PathLike[str]]:
    """``p``, which is not a URL, as what ``open`` and ``os`` take (a TypeError for anything else, as theirs)."""
    if isinstance(p, (str, os.PathLike)):
        return p
    raise TypeError(f"expected a str or os.PathLike, not {type(p).__name__}")


def open_read(p: LocationLike, *, whole: bool = False) -> BinaryIO:
    """Open ``p`` for binary reading: ``open(p, "rb")`` for a local path, ranged GETs for a URL. ``whole``: the
    caller reads all of it (a ``.metadata`` pickle, after its size was checked): remotely one GET, not one per
    4 KiB buffer."""
    rp = _remote(p)
    if rp is not None:
        if whole:
            return io.BytesIO(rp.read_bytes())
        return rp.open("rb")
    return open(_local(p), "rb")


def size(p: LocationLike) -> int:
    rp = _remote(p)
    if rp is not None:
        return rp.stat().st_size
    return os.stat(_local(p)).st_size


def file_size(f: BinaryIO) -> int:
    """The size of the open file ``f`` (from :func:`open_read`)."""
    raw = getattr(f, "raw", None)
    if isinstance(raw, RangedFile):
        return raw.size
    return os.fstat(f.fileno()).st_size


def read_range(p: LocationLike, offset: int, length: int) -> bytes:
    """``length`` bytes of ``p`` from ``offset`` (fewer where the file ends early): one ranged GET remotely."""
    rp = _remote(p)
    if rp is not None:
        data: bytes = rp.fs.cat_file(rp.key, start=offset, end=offset + length) if length > 0 else b""
        _count(len(data))
        return data
    with open(_local(p), "rb") as f:
        return os.pread(f.fileno(), length, offset)


FETCH_CHUNK = 16 * 1024 * 1024  # one ranged GET of an export
FETCH_AHEAD = 4  # GETs in flight ahead of one reader (one file being written)
# chunks fetched and not yet written, over every reader of the process (export --jobs): 16 x 16 MB = 256 MB,
# inside the export's 400 MB ceiling whatever --jobs is
FETCH_BUDGET = 16
_budget = threading.Semaphore(FETCH_BUDGET)
_pool: Optional[ThreadPoolExecutor] = None


def _executor() -> ThreadPoolExecutor:
    global _pool
    with _lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(max_workers=FETCH_AHEAD * 2, thread_name_prefix="ckpt-tui-get")
        return _pool


def read_chunks(
    p: LocationLike, offset: int, length: int, chunk: int = FETCH_CHUNK, cancel: Optional[threading.Event] = None
) -> Iterator[bytes]:
    """The bytes of ``p`` from ``offset`` to ``offset + length`` in order, in pieces of at most ``chunk`` bytes,
    fetched by up to FETCH_AHEAD concurrent ranged GETs ahead of the reader. Memory is bounded: a chunk holds
    one of FETCH_BUDGET permits from its GET until the reader asks for the next one; a reader with nothing in
    flight waits for a permit, one with chunks in flight never does (no reader waits while holding, so none
    starves). OSError where the object ends early."""
    from collections import deque

    from .progress import check_cancel

    pool = _executor()
    inflight: deque[tuple[int, Future[bytes]]] = deque()
    end = offset + length
    nxt = offset
    held = 0  # permits: the chunks in flight and the one the reader holds

    def submit(wait: bool) -> bool:
        nonlocal nxt, held
        if nxt >= end or not _budget.acquire(blocking=wait):
            return False
        held += 1
        n = min(chunk, end - nxt)
        inflight.append((n, pool.submit(read_range, p, nxt, n)))
        nxt += n
        return True

    try:
        while inflight or submit(wait=True):
            while len(inflight) < FETCH_AHEAD and submit(wait=False):
                pass
            check_cancel(cancel)
            n, fut = inflight.popleft()
            data = fut.result()
            if len(data) != n:
                raise OSError(f"{p}: expected {n} bytes, got {len(data)}: the object is shorter than its index says")
            yield data
            del data
            held -= 1
            _budget.release()
    finally:
        for _, fut in inflight:
            fut.cancel()
        for _ in range(held):
            _budget.release()


def stamp(p: LocationLike) -> Optional[tuple[int, int]]:
    """(size, mtime in ns) of a remote object, asked afresh (not from the listing); None if it is gone."""
    rp = _as_remote(p)
    rp.fs.invalidate_cache(rp.key)  # fsspec's own listing cache would answer with what it saw before
    try:
        info = rp.fs.info(rp.key)
    except FileNotFoundError:
        return None
    return int(info.get("size") or 0), int(_mtime(info) * 1e9)


def listdir(p: LocationLike) -> list[str]:
    """The names in folder ``p`` (``os.listdir`` locally; from the listing of the prefix remotely)."""
    rp = _remote(p)
    if rp is not None:
        return [c.name for c in rp.iterdir()]
    return os.listdir(_local(p))


def download(url: LocationLike, dest: Union[str, os.PathLike[str]], cancel: Optional[threading.Event] = None) -> Path:
    """Copy everything below ``url`` into the local folder ``dest`` (created), by the same bounded ranged GETs
    as an export: for the reference loaders (torch's DCP reader, DeepSpeed's zero_to_fp32) that only read
    local files. Returns the local path of ``url``."""
    from .progress import check_cancel

    root = _as_remote(url)
    check(str(root))
    files = [root] if root.is_file() else []
    stack = [] if files else [root]
    while stack:
        d = stack.pop()
        for c in d.iterdir():
            (stack if c.is_dir() else files).append(c)
    name = root.name
    if name in ("", ".", "..") or "/" in name:
        raise StorageError(f"{root}: not a name a local folder can have")
    target = Path(dest) / name
    base = Path(os.path.realpath(dest))
    for f in files:
        check_cancel(cancel)
        if f == root:
            local = target
        elif not f.key.startswith(root.key + "/"):
            raise StorageError(f"{f}: not below {root}")
        else:
            local = target.joinpath(*key_parts(root, f.key[len(root.key) + 1 :]))
        local.parent.mkdir(parents=True, exist_ok=True)
        if base not in Path(os.path.realpath(local.parent)).parents and Path(os.path.realpath(local.parent)) != base:
            raise StorageError(f"{f}: would be written outside {dest}")
        # a new file (O_EXCL|O_NOFOLLOW): never through a link, never a file written twice
        fd = os.open(local, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
        with os.fdopen(fd, "wb") as out:
            for chunk in read_chunks(f, 0, f.stat().st_size, cancel=cancel):
                out.write(chunk)
    return target
