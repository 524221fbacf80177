"""kdvfs.tune driven by a real Lightning Trainer (CPU, bf16-mixed, the fake NVML card, dry run):
the tuner's step is the job's whole step, and no step is mismatched."""

from __future__ import annotations

import sys
import time

import pytest
import torch
import torch.nn.functional as F

import kdvfs
from kdvfs.runtime import nvml_device
from kdvfs.runtime.nvml_device import NvmlDevice
from tests.runtime import fake_pynvml
from tests.runtime.test_torch_integration_frameworks import small_vit
from tests.tuner.job_loop import BUDGET, FAST_TIMING, POLL_S, WARMUP_S, configure_card

#: The job's pace: each step ends on the next multiple of it, waiting after kdvfs's end of step; s.
PACE_S = 0.05


@pytest.fixture(autouse=True)
def fake_card(monkeypatch, lease_registry):
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml)
    monkeypatch.delenv("KDVFS_NVML_MODULE", raising=False)
    monkeypatch.setattr(nvml_device, "admin_privilege", lambda: (True, "the fake card needs no root"))
    return configure_card(fake_pynvml)


def test_under_lightning_the_tuners_step_is_the_jobs_whole_step(fake_card, tmp_path):
    L = pytest.importorskip("lightning")

    class Module(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = small_vit()

        def training_step(self, batch, batch_idx):
            images, labels = batch
            return F.cross_entropy(self.net(images), labels)

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

    class Pace(L.Callback):  # input and logging after the step's kernels: the job's time too
        deadline_s = 0.0

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            self.deadline_s = (self.deadline_s or time.monotonic()) + PACE_S
            time.sleep(max(0.0, self.deadline_s - time.monotonic()))

    device = NvmlDevice(0, dry_run=True, lease_dir=tmp_path / "leases")
    tuning = kdvfs.tune(
        device=device,
        dry_run=True,
        budget=BUDGET,
        strategy="ucb",
        plan_store=False,
        track=False,
        timing=FAST_TIMING,
        poll_s=POLL_S,
        warmup_s=WARMUP_S,
    )
    torch.set_num_threads(1)
    data = torch.utils.data.TensorDataset(torch.randn(64, 3, 32, 32), torch.randint(0, 10, (64,)))
    trainer = L.Trainer(
        accelerator="cpu",
        max_steps=40,
        precision="bf16-mixed",
        callbacks=[kdvfs.lightning_callback(tuning), Pace()],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(Module(), torch.utils.data.DataLoader(data, batch_size=4))
    device.close()
    summary = tuning.summary()
    assert summary["mismatched_steps"] == 0
    assert summary["stock_step_s"] >= 0.9 * PACE_S  # the pause after the step's end is the step's
    assert all(name.startswith("nvmlDeviceReset") for name, _ in fake_card.calls if "Clocks" in name)
