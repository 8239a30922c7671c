"""Cached virtual environments for sample producers that cannot live beside the test pins.

Some frameworks pull their own transformers, ray or triton (verl, torchtitan, megatron-core): their
generator runs in a venv of its own, made once per set of pins under ``<cache>/venvs/<name>-<hash>``,
with torch 2.13.0 (the CPU build on this machine's disk) installed first so that no pin can replace it.
Made in a temp folder and renamed into place under a lock: a crash leaves no half-made venv.

    python_for("frameworks")  ->  Path to that venv's python (created on first use)
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from ..core.userdirs import cache_home

TORCH = "torch==2.13.0"

# name -> pins (pip requirement strings), installed after TORCH with it held as a constraint
VENVS: dict[str, tuple[str, ...]] = {
    # verl 0.9.1 resolves with torch 2.13.0 held; it pulls ray and a newer transformers than the test pins, and its
    # requirements are loose: the ones that decide what a checkpoint holds (or could move under it) are pinned
    "verl": (
        "verl==0.9.1",
        "transformers==5.10.4",
        "tokenizers==0.22.2",
        "accelerate==1.15.0",
        "ray==2.60.0",
        "tensordict==0.10.0",
        "omegaconf==2.3.1",
        "numpy==2.4.6",
        "safetensors==0.8.0",
        "peft==0.21.2",
        "datasets==5.2.0",
    ),
    # megatron-core 0.16 is the last on Python 3.11 (0.19 needs 3.12); torchtitan 0.3.0 imports triton
    "megatron-torchtitan": ("megatron-core==0.16.*", "psutil", "torchtitan==0.3.0", "triton"),
    # megatron-core 0.19 declares Python >= 3.12, yet its cp311 wheel runs here: its own requirements first, then the
    # wheel without them (what follows NO_DEPS is installed with --no-deps --ignore-requires-python)
    "megatron-019": ("numpy<2.5", "packaging", "psutil", "triton", "--no-deps", "megatron-core==0.19.2"),
}
NO_DEPS = "--no-deps"


def venv_dir(name: str) -> Path:
    pins = VENVS[name]
    key = hashlib.sha256(repr((sys.version.split()[0], TORCH, pins)).encode()).hexdigest()[:12]
    return cache_home() / "venvs" / f"{name}-{key}"


def python_for(name: str, on_line: Callable[[str], None] | None = None) -> Path:
    """The python of venv ``name``, creating it if absent (pip's output goes to ``on_line``)."""
    final = venv_dir(name)
    py = final / "bin" / "python"
    if py.is_file():
        return py
    final.parent.mkdir(parents=True, exist_ok=True)
    with open(final.parent / f".{final.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if py.is_file():
            return py
        # a venv's scripts name its own path: build it under the final name's sibling and rename the
        # folder only after a complete install, then fix nothing (the interpreter is found via bin/python)
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))
        try:
            _build(tmp, VENVS[name], on_line)
            os.replace(tmp, final)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return py


def _run(cmd: list[str], on_line) -> None:
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace")
    tail: list[str] = []
    assert proc.stdout is not None
    for line in proc.stdout:
        tail = (tail + [line.rstrip()])[-40:]
        if on_line is not None:
            on_line(line.rstrip())
    if proc.wait() != 0:
        raise RuntimeError(f"{' '.join(cmd[:4])} … failed:\n" + "\n".join(tail))


def _build(where: Path, pins: tuple[str, ...], on_line) -> None:
    shutil.rmtree(where)
    _run([sys.executable, "-m", "venv", str(where)], on_line)
    pip = [str(where / "bin" / "python"), "-m", "pip", "install", "--disable-pip-version-check", "-q"]
    _run(pip + [TORCH], on_line)
    constraint = where / "torch-pin.txt"
    constraint.write_text(TORCH + "\n")
    pins, later = (pins[: pins.index(NO_DEPS)], pins[pins.index(NO_DEPS) + 1 :]) if NO_DEPS in pins else (pins, ())
    _run(pip + ["-c", str(constraint), *pins], on_line)
    if later:
        _run(pip + ["--no-deps", "--ignore-requires-python", *later], on_line)
