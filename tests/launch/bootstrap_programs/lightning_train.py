"""A Lightning script with no sapper in it: a small MLP learns a fixed linear map."""

import lightning
import torch
from torch import nn

torch.set_num_threads(1)
torch.manual_seed(0)
target = torch.randn(16, 4, generator=torch.Generator().manual_seed(1)) / 4
x = torch.randn(512, 16, generator=torch.Generator().manual_seed(2))
data = torch.utils.data.TensorDataset(x, x @ target)


class Regressor(lightning.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 4))

    def training_step(self, batch, batch_idx):
        inputs, wanted = batch
        return nn.functional.mse_loss(self.net(inputs), wanted)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=1e-2)


trainer = lightning.Trainer(
    max_steps=40, accelerator="cpu", logger=False, enable_checkpointing=False,
    enable_progress_bar=False, enable_model_summary=False,
)
trainer.fit(Regressor(), torch.utils.data.DataLoader(data, batch_size=32))
print("trained", trainer.global_step)
