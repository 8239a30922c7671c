"""Bounded cost on hostile or careless input (issue 20, point 5): wall time, CPU time and peak RSS of
``ckpt-tui inspect`` (text and ``--json``), each measured with ``/usr/bin/time -v``, as a Markdown table.

    python bench/cost_bench.py [--work DIR] [--sizes 20000,200000] [--cases flat,beside,keys,pickles]
                               [--pythonpath TREE] [--timeout 900] [--modes text,json] [--repeat 1]

Cases (built once under ``--work``, default ``$TMPDIR/ckpt-tui-cost-bench``):
- ``flat``: a folder of N empty ``.bin`` files (each one ``file-truncated`` finding), for each N of ``--sizes``;
  the target is 200,000 files within 10x the time of 20,000, text and ``--json``.
- ``beside``: ``checkpoint-1/`` with N/10 empty ``.bin`` files beside ``checkpoint-2/`` with as many intact
  ``config.json`` copies (each broken file's finding names the newest intact checkpoint beside it), N/10 of 20,000
  and 200,000.
- ``keys``: the real HF ``pytorch_model.bin`` fixture re-saved with 12 tuple keys repeating one 1,000-character
  string 20,000 times (the pickle stores the string once: a 751 kB file) and 200,000 extra keys.
- ``pickles``: the allowlisted-callable and object-graph pickles of issue 20 inside a copy of that file's zip
  (``bytearray(2**31)``, ``set(range(10**8))``, ``torch.Size(range(3*10**8))``, 60 levels of dicts sharing two
  children), each run with a 4 GB address-space limit (so a case that is not bounded fails instead of swapping) and
  at most 120 s.

``--pythonpath TREE`` runs another checkout's ``ckpt_tui`` (e.g. ``git archive <rev> ckpt_tui | tar -x -C TREE``)
for before/after figures. CPU seconds (user + sys) are the figure to compare on a shared machine: wall time
includes waiting for the CPU. Writes the table to stdout and ``bench/out/cost.md``.
"""

from __future__ import annotations

import argparse
import io
import os
import pickletools
import platform
import re
import resource
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
OUT = HERE / "out"
AS_LIMIT = 4 << 30  # bytes of address space for the pickle cases


def _real_torch_file() -> Path:
    sys.path.insert(0, str(ROOT))
    from tests.fixtures import fixture_path

    return fixture_path("hf-model-bin") / "pytorch_model.bin"


def _empty_files(folder: Path, names) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        (folder / name).touch()


def build_flat(work: Path, n: int) -> Path:
    d = work / f"flat-{n}"
    if not (d / ".done").exists():
        _empty_files(d, (f"part_{i:06d}.bin" for i in range(n)))
        (d / ".done").touch()
    return d


def build_beside(work: Path, n: int) -> Path:
    d = work / f"beside-{n}"
    if not (d / ".done").exists():
        _empty_files(d / "checkpoint-1", (f"part_{i:06d}.bin" for i in range(n // 10)))
        cfg = (_real_torch_file().parent / "config.json").read_bytes()
        ok = d / "checkpoint-2"
        ok.mkdir(parents=True, exist_ok=True)
        for i in range(n // 10):
            (ok / f"config_{i:06d}.json").write_bytes(cfg)
        (d / ".done").touch()
    return d


def build_keys(work: Path) -> Path:
    import torch

    f = work / "keys" / "pytorch_model.bin"
    if not f.exists():
        sd = torch.load(_real_torch_file(), weights_only=True)
        s = "k" * 1000
        big = {(i,) + (s,) * 20000: i for i in range(12)}
        big.update(sd)
        big.update({f"extra_{i}": i for i in range(200_000)})
        f.parent.mkdir(parents=True, exist_ok=True)
        torch.save(big, f)
    return f


def _global(module: str, name: str) -> bytes:
    return b"c" + module.encode() + b"\n" + name.encode() + b"\n"


def _int(v: int) -> bytes:
    return b"\x8a" + bytes([(v.bit_length() + 8) // 8]) + v.to_bytes((v.bit_length() + 8) // 8, "little", signed=True)


def _call(module: str, name: str, *args: bytes) -> bytes:
    return _global(module, name) + b"(" + b"".join(args) + b"tR"


def _range(n: int) -> bytes:
    return _call("builtins", "range", _int(n))


def _memo(op_short: bytes, op_long: bytes, i: int) -> bytes:
    return op_short + bytes([i]) if i < 256 else op_long + i.to_bytes(4, "little")


def _shared_dag(levels: int) -> bytes:
    """``levels`` dicts, each holding the one below under two keys: 2**levels paths to the bottom in ~30 bytes a
    level (each level's dict is put in the memo, popped, and fetched twice by the next)."""
    out = b"}" + _memo(b"q", b"r", 0) + b"0"
    for i in range(1, levels + 1):
        prev = _memo(b"h", b"j", i - 1)
        out += b"}(X\x01\x00\x00\x00a" + prev + b"X\x01\x00\x00\x00b" + prev + b"u" + _memo(b"q", b"r", i) + b"0"
    return out + _memo(b"h", b"j", levels)


PICKLES = {
    "bytearray(2**31)": lambda: _call("builtins", "bytearray", _int(2**31)),
    "set(range(10**8))": lambda: _call("builtins", "set", _range(10**8)),
    "torch.Size(range(3*10**8))": lambda: _call("torch", "Size", _range(3 * 10**8)),
    "60 levels of shared dicts": lambda: _shared_dag(60),
}


def build_pickle(work: Path, label: str) -> Path:
    """The real torch file's zip with its data.pkl replaced by ``{"x": <payload>}`` (protocol 2)."""
    slug = re.sub(r"[^a-z0-9]+", "-", label.lower()).strip("-")
    f = work / "pickles" / slug / "pytorch_model.bin"
    if f.exists():
        return f
    body = b"\x80\x02}X\x01\x00\x00\x00x" + PICKLES[label]() + b"s."
    pickletools.dis(body, out=io.StringIO())  # a well-formed stream (read, never run)
    src = zipfile.ZipFile(_real_torch_file())
    f.parent.mkdir(parents=True, exist_ok=True)
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as z:
        for info in src.infolist():
            data = body if info.filename.endswith("/data.pkl") else src.read(info)
            if info.filename.endswith("/data.pkl") or "/data/" not in info.filename:
                z.writestr(info.filename, data)
    f.write_bytes(buf.getvalue())
    return f


def _limit_as() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (AS_LIMIT, AS_LIMIT))


def measure(path: Path, as_json: bool, env: dict, timeout: int, limit_as: bool = False) -> dict:
    """One ``/usr/bin/time -v ckpt-tui inspect`` run: wall and CPU seconds, peak RSS, exit code, output bytes."""
    cmd = [
        "/usr/bin/time",
        "-v",
        sys.executable,
        "-m",
        "ckpt_tui",
        "inspect",
        str(path),
        *(["--json"] if as_json else []),
    ]
    with tempfile.TemporaryFile() as out:
        try:
            # run from --pythonpath's tree: `python -m` puts the working folder first on sys.path, before PYTHONPATH
            p = subprocess.run(
                cmd,
                stdout=out,
                stderr=subprocess.PIPE,
                text=True,
                env=env,
                timeout=timeout,
                preexec_fn=_limit_as if limit_as else None,
                cwd=env.get("PYTHONPATH"),
            )
        except subprocess.TimeoutExpired:
            return {"timeout": timeout}
        size = out.tell()
    err = p.stderr

    def field(name: str) -> str:
        m = re.search(rf"^\s*{re.escape(name)}: (.*)$", err, re.M)
        return m.group(1).strip() if m else ""

    h, _, rest = field("Elapsed (wall clock) time (h:mm:ss or m:ss)").rpartition(":")
    wall = float(rest) + sum(float(x) * 60 ** (i + 1) for i, x in enumerate(reversed(h.split(":"))) if x)
    tail = [
        ln for ln in err.splitlines() if not ln.startswith("\t") and ln.strip() and not ln.startswith("Command exited")
    ]
    return {
        "wall": wall,
        "cpu": float(field("User time (seconds)") or 0) + float(field("System time (seconds)") or 0),
        "rss_mb": int(field("Maximum resident set size (kbytes)") or 0) / 1024,
        "rc": int(field("Exit status") or -1),
        "out_bytes": size,
        "said": tail[-1][:120] if tail else "",
    }


def _row(case: str, mode: str, r: dict) -> str:
    if "timeout" in r:
        return f"| {case} | {mode} | not done in {r['timeout']} s | | | | |"
    return (
        f"| {case} | {mode} | {r['wall']:.2f} | {r['cpu']:.2f} | {r['rss_mb']:.0f} | {r['rc']} | "
        f"{_size(r['out_bytes'])}{' — ' + r['said'] if r['said'] else ''} |"
    )


def _size(n: int) -> str:
    return f"{n / 1e6:.1f} MB" if n >= 1e6 else f"{n / 1e3:.1f} kB"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", type=Path, default=Path(tempfile.gettempdir()) / "ckpt-tui-cost-bench")
    ap.add_argument("--sizes", default="20000,200000")
    ap.add_argument("--cases", default="flat,beside,keys,pickles")
    ap.add_argument("--pythonpath", type=Path, help="run this tree's ckpt_tui instead of the installed one")
    ap.add_argument("--timeout", type=int, default=900)
    ap.add_argument("--modes", default="text,json", help="text, json or both (flat only: the other cases are --json)")
    ap.add_argument("--repeat", type=int, default=1, help="run each measurement this many times (a row each)")
    args = ap.parse_args(argv)
    if not Path("/usr/bin/time").exists():
        print("needs GNU time at /usr/bin/time (apt-get install time)", file=sys.stderr)
        return 2
    env = dict(os.environ)
    if args.pythonpath:
        env["PYTHONPATH"] = str(args.pythonpath.resolve())
    args.work.mkdir(parents=True, exist_ok=True)
    sizes = [int(s) for s in args.sizes.split(",")]
    cases = args.cases.split(",")
    lines = [
        f"ckpt_tui from {args.pythonpath or 'this checkout'}; {platform.python_version()}, "
        f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f} at start",
        "",
        "| case | inspect | wall s | CPU s | peak RSS MB | exit | output |",
        "|---|---|---|---|---|---|---|",
    ]
    print("\n".join(lines), flush=True)

    flat_modes = tuple(m == "json" for m in args.modes.split(","))

    def run(case: str, path: Path, modes=(True,), limit_as: bool = False, timeout: int = args.timeout) -> None:
        for as_json in modes:
            for _ in range(args.repeat):
                row = _row(
                    case,
                    "--json" if as_json else "text",
                    measure(path, as_json, env, min(timeout, args.timeout), limit_as),
                )
                lines.append(row)
                print(row, flush=True)

    if "flat" in cases:
        for n in sizes:
            run(f"{n:,} empty .bin files", build_flat(args.work, n), modes=flat_modes)
    if "beside" in cases:
        for n in sizes:
            run(f"{n // 10:,} broken beside {n // 10:,} intact", build_beside(args.work, n))
    if "keys" in cases:
        run("torch file: 12 huge + 200,000 keys", build_keys(args.work))
    if "pickles" in cases:
        for label in PICKLES:
            run(f"data.pkl: {label}", build_pickle(args.work, label), limit_as=True, timeout=120)
    OUT.mkdir(exist_ok=True)
    (OUT / "cost.md").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
