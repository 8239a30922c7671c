"""The finding-code registry (ckpt_tui/core/codes.py) is the one vocabulary: the generated table of
docs/reference/finding-codes.md (tests/unit/test_docs.py holds it current), diagnose's findings, the CLI's fix ids and the TUI's help screen and fix keys all agree with it."""

from __future__ import annotations

from ckpt_tui.core.codes import CODES, FIXES, fix_key
from ckpt_tui.core.types import SEVERITY_RANK

from . import test_findings


def test_each_code_is_well_formed():
    for c in CODES.values():
        assert c.severities and all(s in SEVERITY_RANK for s in c.severities), c
        assert list(c.severities) == sorted(c.severities, key=SEVERITY_RANK.get), c  # worst first
        assert c.help and "\n" not in c.help and len(c.help) <= 80, c
        assert c.fix is None or c.fix in FIXES, c
        assert c.key == (FIXES[c.fix].key if c.fix else None)


def test_every_fix_is_offered_by_some_code_and_has_a_key():
    assert {c.fix for c in CODES.values() if c.fix} == set(FIXES)
    assert all(fix_key(f) == FIXES[f].key for f in FIXES) and fix_key("unknown") == "x"


def test_diagnose_raises_registered_codes_with_their_fix():
    """Every rule of test_findings: its code is registered, its fix is the code's (or none), its
    severity is documented or one of the deliberate milder ones."""
    for case in test_findings.CASES:
        code = CODES.get(case.code)
        assert code is not None, f"{case.id}: {case.code} is not in core/codes.py"
        assert case.fix in (None, code.fix), case.id
        assert case.severity in code.severities or (case.code, case.severity) in test_findings.UNDOCUMENTED_SEVERITIES


def test_diagnose_module_speaks_the_registry():
    from ckpt_tui.core import diagnose

    assert diagnose.CODES is CODES


def test_tui_help_reads_the_registry():
    from ckpt_tui.ui.screens.dialogs import FINDING_HELP

    assert FINDING_HELP == {c.code: c.help for c in CODES.values()}
