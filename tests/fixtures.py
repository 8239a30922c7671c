"""Real checkpoints for tests, generated once per environment and cached.

    fixture_path("ds-zero3-bf16") -> Path     # generates the whole group on first use
    python -m tests.fixtures --all            # pre-generate everything, print timing per group
    python -m tests.fixtures --list

Cache: $CKPT_TUI_FIXTURE_CACHE, else ~/.cache/ckpt-tui/fixtures/<key> ($XDG_CACHE_HOME is honoured), where <key> hashes the versions of
torch/deepspeed/transformers/accelerate/lightning and Python; each group lives in <group>-<hash> there, the hash
covering its generator's code (samples.group_hash), so a new or changed group regenerates only itself.
Each group is generated into a temp folder and os.replace'd into place under a file lock.
The cached folders are shared: copy before modifying (real_ckpt_copy).
"""

from __future__ import annotations

import argparse
import fcntl
import hashlib
import os
import shutil
import sys
import tempfile
import time
from importlib import metadata
from pathlib import Path

_ROOT = Path(__file__).resolve().parents[1]
if str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))

from ckpt_tui import samples  # noqa: E402
from ckpt_tui.core.userdirs import cache_home  # noqa: E402

FRAMEWORKS = ("torch", "deepspeed", "transformers", "accelerate", "lightning")

# variant -> (group, nproc)
REGISTRY: dict[str, tuple[str, int]] = {v: (g, samples.GROUPS[g].nproc) for v, g in samples.VARIANTS.items()}
SKIPPED: dict[str, str] = dict(samples.SKIPPED)


def cache_key() -> str:
    h = hashlib.sha256()
    for dist in FRAMEWORKS:
        try:
            h.update(f"{dist}={metadata.version(dist)}\n".encode())
        except metadata.PackageNotFoundError:
            h.update(f"{dist}=missing\n".encode())
    h.update(sys.version.split()[0].encode())
    return h.hexdigest()[:16]


def cache_dir() -> Path:
    env = os.environ.get("CKPT_TUI_FIXTURE_CACHE")
    if env:
        return Path(env)
    return cache_home() / "fixtures" / cache_key()


def group_dir(group: str) -> Path:
    return cache_dir() / f"{group}-{samples.group_hash(group)}"


def group_path(group: str, on_line=None) -> Path:
    """The cached folder of a whole group, generating it if absent."""
    base = cache_dir()
    final = group_dir(group)
    if final.is_dir():
        return final
    base.mkdir(parents=True, exist_ok=True)
    with open(base / f".{group}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another session may be generating it
        if final.is_dir():
            return final
        tmp = Path(tempfile.mkdtemp(prefix=f".{group}.tmp-", dir=base))
        try:
            samples.generate(group, tmp, on_line=on_line)
            os.replace(tmp, final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return final


def fixture_path(name: str) -> Path:
    if name in SKIPPED:
        raise LookupError(f"fixture {name!r} is not produced: {SKIPPED[name]}")
    group, _ = REGISTRY[name]
    return group_path(group) / name


def copy_fixture(name: str, dest: Path) -> Path:
    """Copy a cached fixture to dest/<name> (tests that modify files must use a copy)."""
    target = Path(dest) / name
    shutil.copytree(fixture_path(name), target, symlinks=True)
    return target


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m tests.fixtures")
    ap.add_argument("--all", action="store_true", help="generate every group")
    ap.add_argument("--list", action="store_true", help="list variants and where they are cached")
    ap.add_argument("--force", action="store_true", help="regenerate groups that are already cached")
    ap.add_argument("-v", "--verbose", action="store_true", help="stream generator output")
    ap.add_argument("groups", nargs="*", help=f"groups to generate: {', '.join(samples.GROUPS)}")
    args = ap.parse_args(argv)
    print(f"cache: {cache_dir()}")
    if args.list:
        for v, (g, n) in REGISTRY.items():
            state = "cached" if (group_dir(g) / v).is_dir() else "-"
            print(f"{v:26} {g:18} nproc={n} {state}")
        for v, why in SKIPPED.items():
            print(f"{v:26} SKIPPED: {why}")
        return 0
    groups = list(samples.GROUPS) if args.all else args.groups
    if not groups:
        ap.error("give --all or group names")
    on_line = print if args.verbose else None
    total = 0.0
    for g in groups:
        if args.force:
            shutil.rmtree(group_dir(g), ignore_errors=True)
        t0 = time.perf_counter()
        cached = group_dir(g).is_dir()
        group_path(g, on_line=on_line)
        dt = time.perf_counter() - t0
        total += dt
        print(
            f"{g:18} {len(samples.GROUPS[g].variants):2} variants  {dt:6.1f} s{'  (cached)' if cached else ''}",
            flush=True,
        )
    print(f"{'total':18} {'':12} {total:6.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
