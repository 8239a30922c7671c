"""Helpers shared by the tests."""

import json
import os
import subprocess
import sys


def sparse_safetensors(path, gib: int) -> None:
    """A valid safetensors file whose GiBs of zeros are a hole: instant to make, but exporting it
    with a dtype cast takes seconds — long enough to cancel it, kill it or race it for certain."""
    n = gib * (1 << 30) // 4
    header = json.dumps({"__metadata__": {"format": "pt"},
                         "big.weight": {"dtype": "F32", "shape": [n], "data_offsets": [0, n * 4]}}).encode()
    header += b" " * (-len(header) % 8)
    with open(path, "wb") as f:
        f.write(len(header).to_bytes(8, "little") + header)
        f.truncate(8 + len(header) + n * 4)


def torchrun(script, *args, nproc: int = 2, cwd=None, timeout: int = 400) -> list[dict]:
    """Run a script on ``nproc`` CPU ranks the way the fixtures are made; return the JSON of its
    ``RESULT {...}`` lines (asserting it succeeded)."""
    from ckpt_tui.samples import launch_env

    r = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc),
                        str(script), *map(str, args)], capture_output=True, text=True, env=launch_env(),
                       timeout=timeout, cwd=cwd)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return [json.loads(ln[7:]) for ln in r.stdout.splitlines() if ln.startswith("RESULT ")]


def as_nobody(fn):
    """Run fn() in a forked child that dropped root (CI runs as root, which reads everything);
    return its JSON-able result."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        code = 99
        try:
            if os.geteuid() == 0:
                os.setgid(65534)
                os.setuid(65534)
            os.write(w, json.dumps(fn()).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(w)
    data = b""
    while chunk := os.read(r, 65536):
        data += chunk
    os.close(r)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    return json.loads(data)
