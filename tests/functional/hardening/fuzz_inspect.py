"""Fuzz the inspector with mutations of real fixture files (property-based, hypothesis).

    python -m tests.functional.hardening.fuzz_inspect --cases 10000     # the full run (minutes)

Each case takes a real checkpoint written by a framework on CPU, mutates one of its files (flip,
overwrite, insert, delete, truncate bytes) and inspects it under a per-case time limit and a
process-wide memory limit (RLIMIT_AS). The property: ``inspect`` returns a report (or raises
``ScanError`` for an unusable path) — never any other exception, never a hang.

Two structured mutations test the screen (issue 20): a torch zip's directory gets a duplicate entry, a second
``data.pkl`` or an entry outside the archive's folder (the property: the file gets an error finding, since a
loader could read another record than the screen); a DCP ``.metadata`` gets a string (bytes or text, of any
length) holding copies of its own chunk or storage records, then a payload that names ``builtins.open`` (the
property: wherever an independent parse of the stream, ``pickletools.genops``, reaches that global, the report
has an ``unsafe-pickle`` or error finding on the metadata — the fast reader may never hide it).

A crashing input is saved outside the source tree, under ``~/.cache/ckpt-tui/fuzz-crashes/`` (``--crashes
DIR`` elsewhere), and the path is printed. Once the bug is fixed, copy the ``.bin`` and ``.json`` pair into
``tests/functional/hardening/crashes/`` (the regression corpus, read-only to the fuzzer):
tests/functional/hardening/test_fuzz.py replays every input there forever after.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import resource
import shutil
import signal
import sys
import tempfile
import time
import traceback
from pathlib import Path

CRASHES = Path(__file__).parent / "crashes"  # the regression corpus: inputs once found, kept by hand
NEW_CRASHES = None  # where run() saves new ones: --crashes, else the user's cache (never the source tree)
SEEDS = [  # (fixture, sub-path of the checkpoint to inspect, file to mutate inside it)
    ("accelerate-save-state", "", "model.safetensors"),
    ("ds-zero2-bf16", "", "global_step2/mp_rank_00_model_states.pt"),
    ("ds-zero2-bf16", "", "global_step2/bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt"),
    ("ds-zero3-bf16", "", "global_step2/zero_pp_rank_0_mp_rank_00_model_states.pt"),
    ("fsdp1-dcp", "", ".metadata"),
    ("fsdp1-dcp", "", "__0_0.distcp"),
    ("hf-model-sharded", "", "model.safetensors.index.json"),
    ("hf-ds-zero2", "checkpoint-2", "training_args.bin"),
    ("hf-ds-zero2", "checkpoint-2", "trainer_state.json"),
    ("ds-zero2-bf16", "", "latest"),
    ("dcp-ranklocal", "", "__0.metadata"),
]


class CaseTimeout(Exception):
    pass


def _alarm(signum, frame):
    raise CaseTimeout()


def mutate(data: bytes, muts) -> bytes:
    b = bytearray(data)
    for op, pos, val in muts:
        if not b and op != "insert":
            continue
        p = pos % (len(b) + 1) if op == "insert" else pos % len(b)
        if op == "flip":
            b[p] ^= (val[0] if val else 0xFF) or 1
        elif op == "set":
            b[p : p + len(val)] = val
        elif op == "insert":
            b[p:p] = val
        elif op == "delete":
            del b[p : p + max(1, len(val))]
        elif op == "truncate":
            del b[p:]
    return bytes(b)


def _zip_entries(data: bytes) -> list:
    import io
    import zipfile

    with zipfile.ZipFile(io.BytesIO(data)) as zf:
        return [(i.filename, zf.read(i)) for i in zf.infolist()]


def zip_mutation(data: bytes, kind: str, k: int) -> bytes:
    """``data`` (a torch zip) rewritten with a duplicate of entry ``k`` (``dup``), a second data.pkl in a sub-folder
    placed first (``shadow``), or a copy of entry ``k`` outside the archive's folder (``stray``)."""
    import io
    import warnings
    import zipfile

    entries = _zip_entries(data)
    prefix = entries[0][0].split("/", 1)[0]
    name, blob = entries[k % len(entries)]
    pkl = dict(entries).get(f"{prefix}/data.pkl", blob)
    if kind == "dup":
        entries.insert(k % (len(entries) + 1), (name, blob))
    elif kind == "shadow":
        entries.insert(0, (f"{prefix}/sub/data.pkl", pkl))
    else:
        entries.append(("other/" + name.split("/", 1)[-1], blob))
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as zf:
            for n, d in entries:
                zf.writestr(zipfile.ZipInfo(n, (1980, 1, 1, 0, 0, 0)), d)
    return buf.getvalue()


PAYLOAD = b"cbuiltins\nopen\nX\x0b\x00\x00\x00/nonexistentX\x01\x00\x00\x00r\x86R0"


def dcp_string_mutation(data: bytes, records: int, pos: int, opcode: str, pad: int) -> bytes:
    """A string (``opcode``: BINBYTES, SHORT_BINBYTES, BINUNICODE or SHORT_BINUNICODE) holding ``records`` copies of
    the stream's first chunk (or storage) record and ``pad`` more bytes, then PAYLOAD, then POP, in a frame of its
    own inserted at the ``pos``-th frame boundary of a framed ``.metadata`` (else at its start)."""
    from ckpt_tui.core.formats.dcp import stream as dcp_stream

    found = dcp_stream.CHUNK_RE.search(data) or dcp_stream.STORAGE_RE.search(data)
    rec = found.group(0) if found else b"h\x00)\x81\x94}\x94(ub"
    body = rec * records + bytes(pad)
    if opcode in ("C", "\x8c") and len(body) > 255:
        body = body[:255]
    head = opcode.encode("latin1") + (
        bytes([len(body)]) if opcode in ("C", "\x8c") else len(body).to_bytes(4, "little")
    )
    mine = head + body + PAYLOAD + b"0"
    spans = dcp_stream.frames(data)
    if not spans:
        return data[:2] + mine + data[2:]
    cut = spans[pos % len(spans)][0] - 9  # a frame's header: an opcode boundary
    return data[:cut] + b"\x95" + len(mine).to_bytes(8, "little") + mine + data[cut:]


def _names_open(data: bytes) -> bool:
    """Does an independent parse of the stream (pickletools) reach the GLOBAL ``builtins open``?"""
    import pickletools

    try:
        for op, arg, _ in pickletools.genops(data):
            if op.name == "GLOBAL" and arg == "builtins open":
                return True
    except Exception:  # the stream breaks later: what came before it stands
        pass
    return False


def check_screen(ck: Path, f: Path, data: bytes, seed: int, kind: str, seconds: float = 10.0) -> None:
    """The screen's property for a structured mutation (see the module's docstring), then the general one."""
    from ckpt_tui.core.report import inspect

    check(ck, f, data, seed, seconds)
    rel = f.relative_to(ck).as_posix()
    if kind == "dcp" and not _names_open(data):
        return
    rep = inspect(ck)
    parent = rel.rsplit("/", 1)[0] if "/" in rel else "."
    hit = [
        x
        for x in rep.findings
        if x.severity == "error"
        and x.path in (rel, parent)
        and (kind != "dcp" or x.code in ("unsafe-pickle", "file-corrupt", "file-truncated"))
    ]
    if not hit:
        e = AssertionError(
            f"{kind} mutation of {rel}: no error finding on it ({sorted((x.code, x.path) for x in rep.findings)})"
        )
        save_crash(seed, data, e)
        raise e


def prepare(workdir: Path):
    """Copy each seed checkpoint once; return [(seed index, checkpoint dir, file path, original bytes)]."""
    from tests.fixtures import fixture_path

    out = []
    for i, (fx, sub, rel) in enumerate(SEEDS):
        dst = workdir / f"seed{i}"
        shutil.copytree(fixture_path(fx), dst, symlinks=True)
        ck = dst / sub if sub else dst
        out.append((i, ck, ck / rel, (ck / rel).read_bytes()))
    return out


def check(ck: Path, f: Path, data: bytes, seed: int, seconds: float = 10.0) -> None:
    """The property. Saves the input and re-raises on a violation."""
    from ckpt_tui.core.report import inspect
    from ckpt_tui.core.scan import ScanError

    f.write_bytes(data)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        rep = inspect(ck)
        json.dumps(rep.to_json())  # the JSON contract holds too
    except ScanError:
        pass
    except BaseException as e:
        save_crash(seed, data, e)
        raise
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)


def save_crash(seed: int, data: bytes, e: BaseException) -> Path:
    from ckpt_tui.core.userdirs import cache_home

    folder = Path(NEW_CRASHES) if NEW_CRASHES else cache_home() / "fuzz-crashes"
    folder.mkdir(parents=True, exist_ok=True)
    h = hashlib.sha256(data).hexdigest()[:16]
    p = folder / f"seed{seed}-{h}.bin"
    p.write_bytes(data)
    (folder / f"seed{seed}-{h}.json").write_text(
        json.dumps(
            {"seed": SEEDS[seed], "error": "".join(traceback.format_exception_only(type(e), e)).strip()}, indent=1
        )
    )
    print(f"fuzz_inspect: crashing input saved as {p}", file=sys.stderr, flush=True)
    return p


def run(cases: int, memory_mb: int = 3072, seed: int | None = None) -> dict:
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    signal.signal(signal.SIGALRM, _alarm)
    work = Path(tempfile.mkdtemp(prefix="ckpt-tui-fuzz-"))
    stats = {"cases": 0}
    soft = hard = resource.getrlimit(resource.RLIMIT_AS)[1]
    try:
        seeds = prepare(work)
        import ckpt_tui.core.report  # noqa: F401  imported before the memory limit

        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        resource.setrlimit(resource.RLIMIT_AS, (memory_mb << 20, hard))  # soft limit: restorable
        op = st.sampled_from(["flip", "set", "insert", "delete", "truncate"])
        mut = st.tuples(op, st.integers(0, 1 << 24), st.binary(min_size=0, max_size=16))

        structured = st.one_of(
            st.tuples(st.just("zip"), st.sampled_from(["dup", "shadow", "stray"]), st.integers(0, 64)),
            st.tuples(
                st.just("dcp"),
                st.integers(0, 12),
                st.integers(0, 64),
                st.sampled_from(["B", "C", "X", "\x8c"]),
                st.integers(0, 64),
            ),
        )

        @settings(
            max_examples=cases,
            deadline=None,
            database=None,
            derandomize=seed is not None,
            suppress_health_check=list(HealthCheck),
            print_blob=True,
        )
        @given(
            which=st.integers(0, len(seeds) - 1),
            muts=st.lists(mut, min_size=1, max_size=6),
            shape=st.one_of(st.none(), st.none(), structured),
        )
        def prop(which, muts, shape):
            i, ck, f, orig = seeds[which]
            stats["cases"] += 1
            try:
                if shape is not None and shape[0] == "zip" and orig[:2] == b"PK":
                    stats["zip"] = stats.get("zip", 0) + 1
                    check_screen(ck, f, zip_mutation(orig, shape[1], shape[2]), i, "zip")
                elif shape is not None and shape[0] == "dcp" and f.name.endswith(".metadata"):
                    stats["dcp"] = stats.get("dcp", 0) + 1
                    check_screen(ck, f, dcp_string_mutation(orig, *shape[1:]), i, "dcp")
                else:
                    check(ck, f, mutate(orig, muts), i)
            finally:
                f.write_bytes(orig)

        t0 = time.monotonic()
        prop()
        stats["seconds"] = round(time.monotonic() - t0, 1)
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))
        shutil.rmtree(work, ignore_errors=True)
    return stats


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.functional.hardening.fuzz_inspect")
    ap.add_argument("--cases", type=int, default=10000)
    ap.add_argument("--memory-mb", type=int, default=3072)
    ap.add_argument(
        "--crashes", default=None, help="save crashing inputs here (default: ~/.cache/ckpt-tui/fuzz-crashes)"
    )
    args = ap.parse_args(argv)
    global NEW_CRASHES
    NEW_CRASHES = args.crashes
    stats = run(args.cases, args.memory_mb)
    print(f"{stats['cases']} cases in {stats.get('seconds')} s: no crash, no hang")
    return 0


if __name__ == "__main__":
    sys.exit(main())
