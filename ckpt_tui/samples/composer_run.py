"""A checkpoint composer's Trainer writes (mosaicml 0.32.1 on torch 2.7.0, CPU), committed under tests/data/composer/.

composer pins ``torch>=2.6,<2.7.1``; PyPI carries only CUDA builds of those (~5 GB with their nvidia-* wheels, run on
the CPU here). Building that venv in every cold CI run would cost more than the file it writes (28 kB), so the output
and its oracle are committed and this generator re-makes them on request (CONTRIBUTING.md, "composer fixture"):

    python3 -m venv /tmp/composer-venv
    /tmp/composer-venv/bin/pip install torch==2.7.0 mosaicml==0.32.1 safetensors
    /tmp/composer-venv/bin/python ckpt_tui/samples/composer_run.py tests/data/composer

What it writes, as a user's run leaves it:
  ckpts/ep0-ba2-rank0.pt    Trainer(save_folder="ckpts", save_interval="2ba", max_duration="2ba"): the model
                            (a ComposerClassifier around a 2-layer MLP: names under `module.`), the AdamW state
                            (FQN-keyed, under state.optimizers.AdamW), the timestamp (datetime.timedelta wall
                            times), the metadata (torch's TorchVersion), the RNG state
  ckpts/latest-rank0.pt     composer's symlink to the newest save
  oracle/model.safetensors  the live model's state_dict() after training (ComposerModel names: `module.…`)
  oracle/optimizer.safetensors  the live optimizer's state, `<fqn>.<state>` (fqn as composer keys it)
  oracle/versions.json      what wrote it
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path


def main() -> None:
    import composer  # type: ignore[import-not-found]
    import torch
    from composer import Trainer  # type: ignore[import-not-found]
    from composer.models import ComposerClassifier  # type: ignore[import-not-found]
    from safetensors.torch import save_file
    from torch.utils.data import DataLoader, TensorDataset

    out = Path(sys.argv[1]).resolve()
    out.mkdir(parents=True, exist_ok=True)
    os.chdir(out)  # save_folder relative, as a user's run has it
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4))
    model = ComposerClassifier(net, num_classes=4)
    data = TensorDataset(torch.randn(32, 16), torch.randint(0, 4, (32,)))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    trainer = Trainer(
        model=model,
        train_dataloader=DataLoader(data, batch_size=8),
        optimizers=opt,
        max_duration="2ba",
        save_folder="ckpts",
        save_interval="2ba",
        device="cpu",
        progress_bar=False,
        log_to_console=False,
        seed=1234,
    )
    trainer.fit()
    oracle = Path("oracle")
    oracle.mkdir(exist_ok=True)
    save_file({k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}, oracle / "model.safetensors")
    names = {id(p): n for n, p in model.named_parameters()}
    state = {f"{names[id(p)]}.{k}": v.clone() for p, s in opt.state.items() for k, v in s.items() if k != "step"}
    save_file(state, oracle / "optimizer.safetensors")
    versions = {"torch": torch.__version__, "composer": composer.__version__}
    (oracle / "versions.json").write_text(json.dumps(versions, indent=1, sort_keys=True) + "\n")
    trainer.close()


if __name__ == "__main__":
    main()
