"""torch's TCPStore wire protocol in pure Python: a client and a small server, so that the ranks of a
split export (distributed.py) reach the launcher's store without importing torch (1.6 s and ~220 MB per
rank). Both speak what torch 2.x's ``c10d::TCPStore`` speaks (torch/csrc/distributed/c10d/TCPStore.cpp,
TCPStoreBackend.hpp, TCPStoreLibUvBackend.cpp, Utils.hpp), so either side may be torch's:

- every request is one byte of query type, then its arguments; a string or byte payload is a uint64 length
  and the bytes, a key count a uint64, a number its native fixed-size encoding (all native byte order);
- a client's first request is ``VALIDATE`` with the uint32 magic 0x3C85F7CE (no reply), then ``PING``
  with a uint32 nonce that the server echoes: the handshake;
- ``SET key value`` (no reply); ``CHECK n keys…`` -> one byte, 0 ready / 1 not ready; ``GET key`` ->
  length + bytes, after ``WAIT n keys…`` -> one byte 0 (stop waiting), which torch's client sends first
  and cancels with ``CANCEL_WAIT`` -> 1 when its timeout passes; ``COMPARE_SET key expected desired`` ->
  the value the key holds afterwards (when the key is missing: desired if expected is empty, else expected);
- torch's client puts "/" before every key, and a ``PrefixStore(prefix)`` puts ``prefix + "/"`` before
  that: :class:`PrefixStore` here does the same, so keys on the wire match torch's byte for byte.

Every socket operation has a deadline: a store that vanishes or stops answering raises :class:`StoreError`
within the client's timeout, never hangs.
"""

from __future__ import annotations

import errno
import os
import selectors
import socket
import struct
import threading
import time
from typing import Optional, Protocol, Union

# QueryType (TCPStoreBackend.hpp), in order
(
    VALIDATE,
    SET,
    COMPARE_SET,
    GET,
    ADD,
    CHECK,
    WAIT,
    GETNUMKEYS,
    DELETE_KEY,
    APPEND,
    MULTI_GET,
    MULTI_SET,
    CANCEL_WAIT,
    PING,
) = range(14)
MAGIC = 0x3C85F7CE  # validationMagicNumber
READY, NOT_READY = 0, 1  # CheckResponseType
STOP_WAITING, WAIT_CANCELED = 0, 1  # WaitResponseType
MAX_KEY = 8 * 1024  # the libuv backend's limits: a server refuses more
MAX_PAYLOAD = 8 * 1024 * 1024
MAX_KEYS = 128 * 1024

U32, U64, I64 = struct.Struct("=I"), struct.Struct("=Q"), struct.Struct("=q")
Value = Union[str, bytes]


class _Silent(Exception):
    """No reply within the timeout, nothing read: the connection is still in step."""


class StoreError(Exception):
    """The store failed: unreachable, gone (connection closed or reset), silent past the timeout, or it
    answered something the protocol does not allow."""


class HandshakeError(StoreError):
    """Connected, but what answers is not a TCPStore this client can talk to (no or a wrong PING echo)."""


def _bytes(v: Value) -> bytes:
    return v.encode() if isinstance(v, str) else bytes(v)


def _blob(v: Value) -> bytes:
    b = _bytes(v)
    return U64.pack(len(b)) + b


class TCPStoreClient:
    """One connection to a TCPStore (torch's or :class:`TCPStoreServer`), with torch's client API for
    what the export uses: ``set``, ``check``, ``get``, ``compare_set``. Thread-safe (one lock around each
    request and its reply). After any failure the connection is dropped and every later call raises the
    same error: a reply half read can never be taken for the next one's."""

    def __init__(self, host: str, port: int, timeout: float = 20.0):
        self.host, self.port, self.timeout = host, port, timeout
        self._lock = threading.Lock()
        self._broken: Optional[str] = None
        self._sock = self._connect()
        try:
            self._handshake()
        except StoreError:
            self.close()
            raise

    def _connect(self) -> socket.socket:
        """Connect, retrying a refused connection until the timeout (the store may not be up yet: torch's
        client does the same, with a backoff)."""
        deadline = time.monotonic() + self.timeout
        delay = 0.05
        while True:
            left = deadline - time.monotonic()
            try:
                sock = socket.create_connection((self.host, self.port), timeout=max(left, 0.001))
            except socket.gaierror as e:
                raise StoreError(f"cannot resolve {self.host}: {e.strerror or e}") from None
            except OSError as e:
                left = deadline - time.monotonic()
                if left <= 0:
                    why = "timed out" if isinstance(e, TimeoutError) else (e.strerror or str(e))
                    raise StoreError(
                        f"no store answered at {self.host}:{self.port} within {self.timeout:g} s ({why})"
                    ) from None
                time.sleep(min(delay, left))
                delay = min(delay * 2, 1.0)
                continue
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            return sock

    def _handshake(self) -> None:
        nonce = os.getpid() & 0xFFFFFFFF
        try:
            self._send(bytes([VALIDATE]) + U32.pack(MAGIC) + bytes([PING]) + U32.pack(nonce))
            (echo,) = U32.unpack(self._recv(4))
        except StoreError as e:
            raise HandshakeError(f"the handshake failed: {e}") from None
        if echo != nonce:
            self._fail(f"PING answered {echo}, not {nonce}")
            raise HandshakeError(f"the handshake failed: PING answered {echo}, not {nonce}")

    # -- the connection --------------------------------------------------------------------------------

    def close(self) -> None:
        if self._broken is None:
            self._broken = "the client was closed"
        try:
            self._sock.close()
        except OSError:
            pass

    def _fail(self, why: str) -> StoreError:
        if self._broken is None:
            self._broken = why
        try:
            self._sock.close()
        except OSError:
            pass
        return StoreError(self._broken)

    def _send(self, data: bytes) -> None:
        if self._broken is not None:
            raise StoreError(self._broken)
        try:
            self._sock.settimeout(self.timeout)
            self._sock.sendall(data)
        except TimeoutError:
            raise self._fail(f"the store took no data for {self.timeout:g} s") from None
        except OSError as e:
            raise self._fail(_why(e)) from None

    def _recv(self, n: int, soft: bool = False) -> bytes:
        """Exactly n bytes within the client's timeout for all of them together. ``soft``: a timeout before
        the first byte raises :class:`_Silent` and keeps the connection (a WAIT that can be cancelled)."""
        if self._broken is not None:
            raise StoreError(self._broken)
        deadline = time.monotonic() + self.timeout
        buf = bytearray()
        while len(buf) < n:
            left = deadline - time.monotonic()
            try:
                if left <= 0:
                    raise TimeoutError
                self._sock.settimeout(left)
                chunk = self._sock.recv(n - len(buf))
            except TimeoutError:
                if soft and not buf:
                    raise _Silent from None
                raise self._fail(f"no answer from the store within {self.timeout:g} s") from None
            except OSError as e:
                raise self._fail(_why(e)) from None
            if not chunk:
                raise self._fail("the store closed the connection")
            buf += chunk
        return bytes(buf)

    def _recv_blob(self) -> bytes:
        (n,) = U64.unpack(self._recv(8))
        if n > MAX_PAYLOAD:
            raise self._fail(f"the store sent a {n}-byte value (protocol mismatch?)")
        return self._recv(n)

    # -- torch's Store API (keys get torch's "/" prefix) ---------------------------------------------

    def set(self, key: str, value: Value) -> None:
        with self._lock:
            self._send(bytes([SET]) + _blob("/" + key) + _blob(value))

    def check(self, keys: list[str]) -> bool:
        with self._lock:
            self._send(bytes([CHECK]) + U64.pack(len(keys)) + b"".join(_blob("/" + k) for k in keys))
            r = self._recv(1)[0]
            if r not in (READY, NOT_READY):
                raise self._fail(f"CHECK answered {r} (protocol mismatch?)")
            return r == READY

    def get(self, key: str) -> bytes:
        """The key's value, waiting (up to the timeout) until it is set, as torch's ``get`` does."""
        k = _blob("/" + key)
        with self._lock:
            self._send(bytes([WAIT]) + U64.pack(1) + k)
            try:
                r = self._recv(1, soft=True)[0]
            except _Silent:  # cancel the wait, as torch's client does; the store answers at once, or is gone
                self._send(bytes([CANCEL_WAIT]))
                r = self._recv(1)[0]
                if r == STOP_WAITING:  # set just before the cancel arrived
                    r = self._recv(1)[0]
                if r != WAIT_CANCELED:
                    raise self._fail(f"CANCEL_WAIT answered {r} (protocol mismatch?)") from None
                raise StoreError(f"timed out after {self.timeout:g} s waiting for {key!r}") from None
            if r != STOP_WAITING:
                raise self._fail(f"WAIT answered {r} (protocol mismatch?)")
            self._send(bytes([GET]) + k)
            return self._recv_blob()

    def compare_set(self, key: str, expected: Value, desired: Value) -> bytes:
        """Set ``key`` to ``desired`` if it holds ``expected`` (or is missing and ``expected`` is empty);
        the value it holds afterwards."""
        with self._lock:
            self._send(bytes([COMPARE_SET]) + _blob("/" + key) + _blob(expected) + _blob(desired))
            return self._recv_blob()


def _why(e: OSError) -> str:
    if isinstance(e, ConnectionResetError):
        return "the store reset the connection"
    if isinstance(e, BrokenPipeError):
        return "the store closed the connection"
    return e.strerror or errno.errorcode.get(e.errno or 0, "") or type(e).__name__


class Store(Protocol):
    """What :class:`PrefixStore` asks of the store below it: a :class:`TCPStoreClient`, another PrefixStore."""

    def set(self, key: str, value: Value) -> None: ...
    def check(self, keys: list[str]) -> bool: ...
    def get(self, key: str) -> bytes: ...
    def compare_set(self, key: str, expected: Value, desired: Value) -> bytes: ...


class PrefixStore:
    """torch's ``PrefixStore``: every key becomes ``prefix + "/" + key`` on the store below."""

    def __init__(self, prefix: str, store: Store) -> None:
        self.prefix, self.store = prefix, store

    def _k(self, key: str) -> str:
        return f"{self.prefix}/{key}"

    def set(self, key: str, value: Value) -> None:
        self.store.set(self._k(key), value)

    def check(self, keys: list[str]) -> bool:
        return self.store.check([self._k(k) for k in keys])

    def get(self, key: str) -> bytes:
        return self.store.get(self._k(key))

    def compare_set(self, key: str, expected: Value, desired: Value) -> bytes:
        return self.store.compare_set(self._k(key), expected, desired)


class _Incomplete(Exception):
    pass


class _Conn:
    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.inbuf = bytearray()
        self.pos = 0
        self.out = bytearray()
        self.writing = False

    def take(self, n: int) -> bytes:
        if len(self.inbuf) - self.pos < n:
            raise _Incomplete
        b = bytes(self.inbuf[self.pos : self.pos + n])
        self.pos += n
        return b

    def u32(self) -> int:
        n: int = U32.unpack(self.take(4))[0]
        return n

    def u64(self) -> int:
        n: int = U64.unpack(self.take(8))[0]
        return n

    def blob(self, limit: int) -> bytes:
        n = self.u64()
        if n > limit:
            raise ValueError(f"a {n}-byte argument")
        return self.take(n)


class TCPStoreServer:
    """A TCPStore server in a daemon thread (one selector loop, like torch's libuv backend): what rank 0
    hosts on MASTER_PORT when no launcher agent does. Speaks to this module's client and to torch's.
    ``port`` 0 picks a free port (see ``.port``)."""

    def __init__(self, port: int = 0):
        if socket.has_dualstack_ipv6():
            try:
                self._listen = socket.create_server(
                    ("", port), family=socket.AF_INET6, dualstack_ipv6=True, backlog=1024
                )
            except OSError:
                self._listen = socket.create_server(("", port), backlog=1024)
        else:
            self._listen = socket.create_server(("", port), backlog=1024)
        self._listen.setblocking(False)
        self.port: int = self._listen.getsockname()[1]
        self.data: dict[bytes, bytes] = {}
        self._waiting: dict[bytes, list[_Conn]] = {}  # key -> connections waiting for it
        self._awaited: dict[_Conn, int] = {}  # connection -> keys it still waits for
        self._sel = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._stopping = False
        self._sel.register(self._listen, selectors.EVENT_READ, "listen")
        self._sel.register(self._wake_r, selectors.EVENT_READ, "wake")
        self._thread = threading.Thread(target=self._run, name="ckpt-tui-store", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Stop serving and close every connection (the clients see the store gone)."""
        self._stopping = True
        try:
            self._wake_w.send(b"x")
        except OSError:
            pass
        self._thread.join(timeout=5)

    def __enter__(self) -> "TCPStoreServer":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _run(self) -> None:
        try:
            while not self._stopping:
                for key, mask in self._sel.select():
                    if key.data == "listen":
                        self._accept()
                    elif key.data == "wake":
                        try:
                            self._wake_r.recv(64)
                        except OSError:
                            pass
                    else:
                        conn = key.data
                        if mask & selectors.EVENT_READ:
                            self._read(conn)
                        if mask & selectors.EVENT_WRITE and conn.sock.fileno() != -1:
                            self._flush(conn)
        finally:
            for key in list(self._sel.get_map().values()):
                try:
                    if isinstance(key.fileobj, socket.socket):  # all of them are: _listen, _wake_r, each conn.sock
                        key.fileobj.close()
                except OSError:
                    pass
            self._sel.close()
            self._wake_w.close()

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self._listen.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                return
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            conn = _Conn(sock)
            self._sel.register(sock, selectors.EVENT_READ, conn)

    def _drop(self, conn: _Conn) -> None:
        if conn.sock.fileno() == -1:
            return
        self._clear_wait(conn)
        try:
            self._sel.unregister(conn.sock)
        except (KeyError, ValueError):
            pass
        conn.sock.close()

    def _read(self, conn: _Conn) -> None:
        try:
            chunk = conn.sock.recv(65536)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            chunk = b""
        if not chunk:
            self._drop(conn)
            return
        conn.inbuf += chunk
        try:
            while conn.pos < len(conn.inbuf):
                start = conn.pos
                try:
                    self._query(conn)
                except _Incomplete:
                    conn.pos = start
                    break
        except ValueError:  # a request the protocol does not allow: drop that client
            self._drop(conn)
            return
        del conn.inbuf[: conn.pos]
        conn.pos = 0
        if conn.out:
            self._flush(conn)

    def _reply(self, conn: _Conn, data: bytes) -> None:
        conn.out += data

    def _flush(self, conn: _Conn) -> None:
        if conn.sock.fileno() == -1:
            return
        try:
            while conn.out:
                n = conn.sock.send(conn.out)
                del conn.out[:n]
        except (BlockingIOError, InterruptedError):
            pass
        except OSError:
            self._drop(conn)
            return
        want = bool(conn.out)
        if want != conn.writing:
            conn.writing = want
            self._sel.modify(conn.sock, selectors.EVENT_READ | (selectors.EVENT_WRITE if want else 0), conn)

    def _wake(self, key: bytes) -> None:
        for conn in self._waiting.pop(key, ()):
            left = self._awaited.get(conn, 0) - 1
            if left <= 0:
                self._awaited.pop(conn, None)
                self._reply(conn, bytes([STOP_WAITING]))
                if conn.sock.fileno() != -1:
                    self._flush(conn)
            else:
                self._awaited[conn] = left

    def _clear_wait(self, conn: _Conn) -> None:
        if self._awaited.pop(conn, None) is None:
            return
        for key in [k for k, v in self._waiting.items() if conn in v]:
            self._waiting[key] = [c for c in self._waiting[key] if c is not conn]
            if not self._waiting[key]:
                del self._waiting[key]

    def _keys(self, conn: _Conn) -> list[bytes]:
        n = conn.u64()
        if n > MAX_KEYS:
            raise ValueError(f"{n} keys")
        return [conn.blob(MAX_KEY) for _ in range(n)]

    def _query(self, conn: _Conn) -> None:
        """Parse and serve one request (raise _Incomplete, consuming nothing that counts, until it is all in)."""
        qt = conn.take(1)[0]
        d = self.data
        if qt == VALIDATE:
            if conn.u32() != MAGIC:
                raise ValueError("wrong VALIDATE magic")
        elif qt == PING:
            self._reply(conn, U32.pack(conn.u32()))
        elif qt == SET:
            key, value = conn.blob(MAX_KEY), conn.blob(MAX_PAYLOAD)
            d[key] = value
            self._wake(key)
        elif qt == COMPARE_SET:
            key, expected, desired = conn.blob(MAX_KEY), conn.blob(MAX_PAYLOAD), conn.blob(MAX_PAYLOAD)
            if key not in d:
                if expected:
                    now = expected  # torch's answer for a missing key with an expectation (it "lies" too)
                else:
                    d[key] = now = desired
            else:
                if d[key] == expected:
                    d[key] = desired
                now = d[key]
            self._wake(key)
            self._reply(conn, _blob(now))
        elif qt == GET:
            self._reply(conn, _blob(d.get(conn.blob(MAX_KEY), b"")))
        elif qt == ADD:
            key, delta = conn.blob(MAX_KEY), I64.unpack(conn.take(8))[0]
            value = delta + (int(d[key]) if key in d else 0)
            d[key] = str(value).encode()
            self._reply(conn, I64.pack(value))
            self._wake(key)
        elif qt == CHECK:
            keys = self._keys(conn)
            self._reply(conn, bytes([READY if all(k in d for k in keys) else NOT_READY]))
        elif qt == WAIT:
            keys = self._keys(conn)
            missing = [k for k in keys if k not in d]
            if not missing:
                self._reply(conn, bytes([STOP_WAITING]))
            else:
                for k in missing:
                    self._waiting.setdefault(k, []).append(conn)
                self._awaited[conn] = len(missing)
        elif qt == GETNUMKEYS:
            self._reply(conn, I64.pack(len(d)))
        elif qt == DELETE_KEY:
            self._reply(conn, I64.pack(1 if d.pop(conn.blob(MAX_KEY), None) is not None else 0))
        elif qt == APPEND:
            key, value = conn.blob(MAX_KEY), conn.blob(MAX_PAYLOAD)
            d[key] = d.get(key, b"") + value
            self._wake(key)
        elif qt == MULTI_GET:
            self._reply(conn, b"".join(_blob(d.get(k, b"")) for k in self._keys(conn)))
        elif qt == MULTI_SET:
            n = conn.u64()
            if n > MAX_KEYS:
                raise ValueError(f"{n} keys")
            pairs = [(conn.blob(MAX_KEY), conn.blob(MAX_PAYLOAD)) for _ in range(n)]
            for key, value in pairs:
                d[key] = value
                self._wake(key)
        elif qt == CANCEL_WAIT:
            self._clear_wait(conn)
            self._reply(conn, bytes([WAIT_CANCELED]))
        else:  # queues, LIST_KEYS, BARRIER …: not served (the libuv backend also drops an unknown query)
            raise ValueError(f"query type {qt} not served")
