"""A short smoke of the fuzzer in every CI run, and every crash it ever found, replayed."""

import json
import shutil
import signal
from pathlib import Path

import pytest

from tests.functional.hardening import fuzz_inspect


def test_fuzz_smoke(real_ckpt, tmp_path, monkeypatch):
    monkeypatch.setattr(fuzz_inspect, "NEW_CRASHES", tmp_path)  # a crash found here is shown, not kept in the tree
    stats = fuzz_inspect.run(cases=300)
    assert stats["cases"] >= 300


CRASHES = sorted(Path(fuzz_inspect.CRASHES).glob("*.bin"))


@pytest.mark.parametrize("case", CRASHES, ids=[c.stem for c in CRASHES])
def test_saved_crash_inputs_stay_fixed(case, real_ckpt, tmp_path):
    meta = json.loads(case.with_suffix(".json").read_text())
    fx, sub, rel = meta["seed"]
    dst = tmp_path / "ck"
    shutil.copytree(real_ckpt(fx), dst, symlinks=True)
    ck = dst / sub if sub else dst
    signal.signal(signal.SIGALRM, fuzz_inspect._alarm)
    fuzz_inspect.check(ck, ck / rel, case.read_bytes(), -1)
