"""Carry a DeepSpeed ZeRO-1/2/3 run over to torch: a torch.distributed.checkpoint folder holding
``{"model": ..., "optimizer": ..., "step": ...}`` in the FQN-keyed form of
``torch.distributed.checkpoint.state_dict.get_state_dict`` — what FSDP2 (``fully_shard``) and DDP
runs load with ``set_state_dict``, at any world size (DCP reshards on load).

- ``plan``: :func:`torch_dcp_plan` resolves SRC to a ZeRO tag, reads the fp32 masters and the
  Adam state as byte ranges, says what carries over and what does not; writes nothing (``--dry-run``).
- ``run``: :func:`convert_to_torch_dcp` (plan, on_progress, cancel) writes it with torch's own
  ``dcp.save`` fed one tensor at a time, verifies it through torch's own ``dcp.load``, moves it into place.
- ``instructions``: :func:`load_code`, the code that resumes from it (the test runs exactly this).
"""

from .instructions import instructions, load_code
from .plan import TMP_PREFIX, TorchDcpError, TorchDcpPlan, default_out, torch_dcp_plan
from .run import TorchDcpResult, convert_to_torch_dcp

__all__ = [
    "TMP_PREFIX",
    "TorchDcpError",
    "TorchDcpPlan",
    "TorchDcpResult",
    "convert_to_torch_dcp",
    "default_out",
    "instructions",
    "load_code",
    "torch_dcp_plan",
]
