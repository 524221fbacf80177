"""The framework paths on real models: a real Lightning Trainer (bf16-mixed, gradient
accumulation, a module whose training_step calls an inner model) and the Hugging Face hooks
with micro-batches under bf16 autocast; sites fire in the order the workload expects."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from kdvfs.runtime.step_feed import site_workload
from kdvfs.runtime.torch_integration import HFTrainerHooks, KdvfsTrainer, lightning_callback, site_schedule
from kdvfs.runtime.types import ClockPair
from tests.runtime.test_torch_integration import LoggingDevice

pytestmark = pytest.mark.usefixtures("lease_registry")

SITES = ["step", "forward", "backward", "optimizer"]
PAIRS = {
    "forward": ClockPair(1980, 3201),
    "backward": ClockPair(1410, 3201),
    "optimizer": ClockPair(990, 2201),
}


def small_vit() -> nn.Module:
    """Patches, two transformer layers and a head: a ViT in miniature."""

    class ViT(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.patch = nn.Conv2d(3, 32, 8, 8)
            self.encoder = nn.TransformerEncoder(nn.TransformerEncoderLayer(32, 4, 64, batch_first=True), 2)
            self.head = nn.Linear(32, 10)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.head(self.encoder(self.patch(x).flatten(2).transpose(1, 2)).mean(1))

    return ViT()


def trainer_on_a_simulated_card() -> KdvfsTrainer:
    workload = site_workload(SITES)
    return KdvfsTrainer(LoggingDevice(), workload, site_schedule(workload, PAIRS))


@pytest.mark.parametrize("accumulate", [1, 2])
def test_a_lightning_trainer_fires_the_sites_in_order_whatever_its_module_calls(accumulate):
    L = pytest.importorskip("lightning")

    class Module(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = small_vit()

        def training_step(self, batch, batch_idx):  # the inner model: the module's forward never runs
            images, labels = batch
            loss = F.cross_entropy(self.net(images), labels)
            if batch_idx % 3 == 0:
                loss.item()  # a host synchronisation, as logging does
            return loss

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

    data = torch.utils.data.TensorDataset(torch.randn(48, 3, 32, 32), torch.randint(0, 10, (48,)))
    tuner = trainer_on_a_simulated_card()
    trainer = L.Trainer(
        accelerator="cpu",
        max_steps=6,
        precision="bf16-mixed",
        accumulate_grad_batches=accumulate,
        callbacks=[lightning_callback(tuner)],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(Module(), torch.utils.data.DataLoader(data, batch_size=4))
    controller = tuner.controller
    assert controller.mismatched_steps == []
    assert len(tuner.records) == 6  # one step per optimizer step, its micro-batches inside
    assert controller.repeated_sites == 2 * (accumulate - 1) * 6  # forward and backward again
    assert [r.site for r in controller.requests[:8]] == SITES * 2  # each site its pair, step by step
    assert tuner.device.clocks_in_effect() is None  # stock back at the end


def test_the_hugging_face_hooks_take_micro_batches_under_bf16_autocast():
    model = small_vit()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    wrapped = type("AcceleratedOptimizer", (), {"optimizer": optimizer})()  # accelerate's wrapper
    tuner = trainer_on_a_simulated_card()
    hooks = HFTrainerHooks(tuner)
    hooks.on_train_begin(None, None, None, model=model, optimizer=wrapped)
    for _ in range(4):
        hooks.on_step_begin(None, None, None)
        for _ in range(2):  # gradient accumulation: two micro-batches a step
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = F.cross_entropy(model(torch.randn(4, 3, 32, 32)), torch.randint(0, 10, (4,)))
            loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        hooks.on_step_end(None, None, None)
    hooks.on_train_end(None, None, None)
    assert tuner.controller.mismatched_steps == []
    assert len(tuner.records) == 4 and tuner.controller.repeated_sites == 2 * 4
