"""Wrong mappings a `--to hf` logits test must see (issue 27): copies of an exported Hugging Face folder with two
tensors swapped, as a mapping that took gate for up or one norm for the other would write them. Each test measures
its framework's logits on them; the gap must be >= 100x the tolerance."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Callable, Optional

from safetensors.torch import load_file, save_file

# what -> the two tensors of the exported folder it swaps
SWAPS = {
    "gate/up swapped": ("model.layers.0.mlp.gate_proj.weight", "model.layers.0.mlp.up_proj.weight"),
    "norms swapped": ("model.layers.1.input_layernorm.weight", "model.layers.1.post_attention_layernorm.weight"),
}


def swapped_copies(out: Path, under: Path, swaps: dict[str, tuple[str, str]] = SWAPS) -> dict[str, Path]:
    """what -> a copy of the export ``out`` under ``under`` with swaps[what]'s two tensors exchanged."""
    made = {}
    for what, (a, b) in swaps.items():
        d = under / what.replace(" ", "-").replace("/", "-")
        shutil.copytree(out, d)
        sd = load_file(d / "model.safetensors")
        sd[a], sd[b] = sd[b].clone(), sd[a].clone()
        save_file(sd, d / "model.safetensors", metadata={"format": "pt"})
        made[what] = d
    return made


def run_worked_example(
    heading: str,
    fixture: Path,
    tmp_path: Path,
    prepare: Optional[Callable[[Path], object]] = None,
    doc_file: str = "docs/export.md",
) -> Path:
    """``doc_file``'s `--to hf` worked example under ``heading`` (docs/export.md's, or the README's), run as written in a copy of ``fixture``
    (``prepare``: called on the copy first, to lay out what the example has beside it): every output line it shows
    is printed (the seconds may differ), and the load code is ``from_pretrained('hf')``. The run folder, its
    ``hf/`` the written model (the caller compares its logits)."""
    import re
    import shlex

    from tests.snippets import snippet_after
    from tests.util import ckpt_tui

    doc = (Path(__file__).resolve().parents[3] / doc_file).read_text()
    block = doc.split(heading, 1)[1].split("```text\n", 1)[1].split("```", 1)[0]
    lines = block.splitlines()
    assert lines[0].startswith("$ ")
    cmd, shown = shlex.split(lines[0][2:]), lines[1:]
    v = tmp_path / "run"
    shutil.copytree(fixture, v)
    if prepare is not None:
        prepare(v)
    r = ckpt_tui(*cmd[1:], cwd=v, env={"COLUMNS": "104"})
    assert r.returncode == 0, r.stderr
    printed = r.stdout.splitlines()
    for line in shown:
        pat = re.sub(r"[0-9]+\\\.[0-9]+\\ s\b", r"[0-9.]+ s", re.escape(line))
        assert any(re.fullmatch(pat, p) for p in printed), (line, printed)
    code = snippet_after(r.stdout)
    assert code == "from transformers import AutoModelForCausalLM\nmodel = AutoModelForCausalLM.from_pretrained('hf')\n"
    return v
