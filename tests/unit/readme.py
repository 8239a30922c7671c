"""The vocabularies the README documents, read from the README itself, so a table here that misses
a layout or a finding code the README promises fails."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"


def layouts() -> list[str]:
    """The `layout` values listed in the JSON schema section ("one of `hf-trainer-fsdp`, ...")."""
    text = README.read_text()
    start = text.index("one of `hf-trainer-fsdp`")
    end = text.index("- `components`", start)
    return re.findall(r"`([a-z0-9-]+)`", text[start:end])


def finding_codes() -> dict[str, set[str]]:
    """code -> severities, from the "Finding codes" table. A row naming two codes with two severities
    (`latest-dangling` / `latest-missing` | error / warning) pairs them in order."""
    text = README.read_text()
    section = text[text.index("### Finding codes") :]
    out: dict[str, set[str]] = {}
    for line in section.splitlines()[1:]:
        if line.startswith("#"):
            break
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 3 or not cells[0].startswith("`"):
            continue
        codes = re.findall(r"`([a-z-]+)`", cells[0])
        paired = [s.strip() for s in cells[1].split(" / ")]
        if len(codes) > 1 and len(paired) == len(codes):
            for code, sev in zip(codes, paired):
                out[code] = {sev}
        else:
            for code in codes:
                out[code] = {s.strip() for s in cells[1].split("/")}
    return out


def facts_keys() -> dict[str, set[str]]:
    """format -> the `facts` keys the JSON schema's facts list names for it ("*": every node), from
    its sub-bullets "  - `fmt`, `fmt2` (note): `key`, `key` ..." (continuation lines indented more)."""
    text = README.read_text()
    start = text.index("- `facts`: ")
    end = text.index("\n- `findings[]`", start)
    items: list[str] = []
    for line in text[start:end].splitlines()[1:]:
        if line.startswith("  - "):
            items.append(line[4:])
        elif line.startswith("    ") and items:
            items[-1] += " " + line.strip()
    out: dict[str, set[str]] = {}
    for item in items:
        head, _, rest = item.partition(": ")
        keys = set(re.findall(r"`([a-z0-9_]+)`", rest))
        for fmt in ["*"] if head == "every node" else re.findall(r"`([a-z0-9-]+)`", head):
            out[fmt] = keys
    return out
