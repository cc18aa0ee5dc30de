"""Trainer-style script with the data already on the GPU.

Style: a hand-rolled "Lightning-like" Trainer class (``fit()``, ``train_step()``,
``validate()``) configured by a dataclass filled from argparse. It sets
``torch.set_float32_matmul_precision("high")`` and ``cudnn.benchmark``, builds an MLP with
BatchNorm1d and Dropout, moves it with ``model.to("cuda")``, creates the whole data set on the
GPU (``torch.randn(N, D, device="cuda")``) and batches it by indexing with
``torch.randperm(N, device="cuda")``, trains with AdamW + StepLR, guards against NaN losses
and saves the best checkpoint whenever the validation loss improves.

    python lightning_style.py                                  # small, fast
    python lightning_style.py --n-train 1000000 --dim 1024 --hidden 4096 --batch-size 8192
"""

import argparse
import dataclasses

import torch
import torch.nn as nn
import torch.nn.functional as F


@dataclasses.dataclass
class Config:
    n_train: int = 512
    n_val: int = 128
    dim: int = 32
    hidden: int = 64
    classes: int = 4
    batch_size: int = 64
    epochs: int = 2
    lr: float = 1e-3
    weight_decay: float = 0.01
    dropout: float = 0.1
    step_size: int = 1
    gamma: float = 0.5
    ckpt: str = "best.pt"


def make_model(cfg):
    return nn.Sequential(
        nn.Linear(cfg.dim, cfg.hidden), nn.BatchNorm1d(cfg.hidden), nn.ReLU(),
        nn.Dropout(cfg.dropout),
        nn.Linear(cfg.hidden, cfg.hidden), nn.BatchNorm1d(cfg.hidden), nn.ReLU(),
        nn.Dropout(cfg.dropout),
        nn.Linear(cfg.hidden, cfg.classes))


class Trainer:
    def __init__(self, cfg):
        self.cfg = cfg
        self.model = make_model(cfg).to("cuda")
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=cfg.lr,
                                           weight_decay=cfg.weight_decay)
        self.scheduler = torch.optim.lr_scheduler.StepLR(self.optimizer, cfg.step_size,
                                                         gamma=cfg.gamma)
        self.best_val = float("inf")

    def train_step(self, x, y):
        self.model.train()
        loss = F.cross_entropy(self.model(x), y)
        if torch.isnan(loss).any():
            print("NaN loss, skipping the batch")
            return None
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        return loss.detach()

    @torch.no_grad()
    def validate(self, X, Y):
        self.model.eval()
        total = torch.zeros((), device="cuda")
        for i in range(0, len(X), self.cfg.batch_size):
            x, y = X[i:i + self.cfg.batch_size], Y[i:i + self.cfg.batch_size]
            total += F.cross_entropy(self.model(x), y, reduction="sum")
        return total / len(X)

    def fit(self, X, Y, X_val, Y_val):
        n = len(X)
        for epoch in range(self.cfg.epochs):
            perm = torch.randperm(n, device="cuda")
            for i in range(0, n - self.cfg.batch_size + 1, self.cfg.batch_size):  # drop last
                idx = perm[i:i + self.cfg.batch_size]
                self.train_step(X[idx], Y[idx])
            self.scheduler.step()
            val_loss = self.validate(X_val, Y_val).item()
            print(f"epoch {epoch}: val loss {val_loss:.4f}")
            if val_loss < self.best_val:
                self.best_val = val_loss
                torch.save({"model": self.model.state_dict(), "epoch": epoch,
                            "val_loss": val_loss}, self.cfg.ckpt)


def parse_config():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for f in dataclasses.fields(Config):
        p.add_argument("--" + f.name.replace("_", "-"), type=type(f.default), default=f.default)
    return Config(**vars(p.parse_args()))


def main():
    cfg = parse_config()
    torch.set_float32_matmul_precision("high")
    torch.backends.cudnn.benchmark = True
    torch.manual_seed(0)

    # the whole data set lives on the GPU: no DataLoader, no host-to-device copies
    w = torch.randn(cfg.dim, cfg.classes, device="cuda")
    X = torch.randn(cfg.n_train, cfg.dim, device="cuda")
    Y = (X @ w).argmax(dim=1)
    X_val = torch.randn(cfg.n_val, cfg.dim, device="cuda")
    Y_val = (X_val @ w).argmax(dim=1)

    Trainer(cfg).fit(X, Y, X_val, Y_val)


if __name__ == "__main__":
    main()
