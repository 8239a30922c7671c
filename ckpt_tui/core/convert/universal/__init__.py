"""Convert a DeepSpeed ZeRO checkpoint to a universal checkpoint with DeepSpeed's own converter.

We never reimplement ``ds_to_universal``: we screen the checkpoint (the converter unpickles
freely), run it as a subprocess in its own process group with a watchdog, give it an output folder
nested in a private temp folder (it writes ``latest_universal`` into its output's parent), verify
what it wrote against the fp32 masters we reconstruct ourselves, move the result into place with
``os.replace`` and only then write our own ``latest_universal``.

- ``plan``: :func:`universal_plan` resolves and screens the source, checks the output, says what
  will happen (printable: ``--dry-run``); writes nothing.
- ``run``: :func:`convert_to_universal` (plan, on_progress, cancel) runs it.
- ``watchdog``: the converter's parent, ``python -m ckpt_tui.core.convert.universal.watchdog``; kills
  the converter's process group when ckpt-tui goes away (even by ``kill -9``).
- ``verify``: :func:`verify_universal` checks a universal folder against its source, bit-exact.
- ``frozen``: :func:`export_frozen` writes what ``load_universal`` does not restore.
- ``instructions``: how to load / resume (DeepSpeed, HF Trainer, Lightning).
"""

from .frozen import export_frozen
from .instructions import FROZEN_FILE, frozen_load_code, instructions
from .plan import TMP_PREFIX, UniversalError, UniversalPlan, universal_plan
from .run import UniversalResult, convert_to_universal, write_latest
from .verify import UniversalVerification, verify_universal

__all__ = [
    "FROZEN_FILE",
    "TMP_PREFIX",
    "UniversalError",
    "UniversalPlan",
    "UniversalResult",
    "UniversalVerification",
    "convert_to_universal",
    "export_frozen",
    "frozen_load_code",
    "instructions",
    "universal_plan",
    "verify_universal",
    "write_latest",
]
