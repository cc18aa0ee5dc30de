"""Small CNN on synthetic 32x32 images, device-agnostic with ``torch.accelerator``.

Style: the "modern portable" script. The device comes from ``torch.accelerator`` (CUDA, MPS,
XPU... or the CPU), the model and batches move with ``.to(device)`` /
``.to(device, non_blocking=True)``, the DataLoader shuffles with worker processes and pinned
memory, every RNG is seeded (torch, random, numpy), and a checkpoint with the model's and the
optimizer's state is written with ``torch.save`` after every epoch.

    python cnn_accelerator.py                                  # small, fast
    python cnn_accelerator.py --batch-size 512 --width 128 --samples 50000 --epochs 10
"""

import argparse
import os
import random

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset


class SyntheticImages(Dataset):
    """3x32x32 images made on the fly, the same for the same index (a seeded generator)."""

    def __init__(self, samples, classes, seed=0):
        self.samples, self.classes, self.seed = samples, classes, seed

    def __len__(self):
        return self.samples

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + i)
        label = int(torch.randint(self.classes, (1,), generator=g))
        image = torch.randn(3, 32, 32, generator=g) + 0.1 * label
        return image, label


class SmallCNN(nn.Module):
    def __init__(self, classes, width):
        super().__init__()
        self.conv1 = nn.Conv2d(3, width, 3, padding=1)
        self.conv2 = nn.Conv2d(width, 2 * width, 3, padding=1)
        self.conv3 = nn.Conv2d(2 * width, 4 * width, 3, padding=1)
        self.fc = nn.Linear(4 * width * 4 * 4, classes)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)  # 16x16
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)  # 8x8
        x = F.max_pool2d(F.relu(self.conv3(x)), 2)  # 4x4
        return self.fc(torch.flatten(x, 1))


def seed_everything(seed):
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--width", type=int, default=16)
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--samples", type=int, default=64)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--out", default="checkpoints/cnn.pt")
    args = p.parse_args()

    seed_everything(args.seed)
    device = (torch.accelerator.current_accelerator()
              if torch.accelerator.is_available() else torch.device("cpu"))
    print(f"using device {device}")

    loader = DataLoader(SyntheticImages(args.samples, args.classes, seed=args.seed),
                        batch_size=args.batch_size, shuffle=True,
                        num_workers=args.workers, pin_memory=True)
    model = SmallCNN(args.classes, args.width).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)

    for epoch in range(args.epochs):
        model.train()
        running, batches = 0.0, 0
        for images, labels in loader:
            images = images.to(device, non_blocking=True)
            labels = labels.to(device, non_blocking=True)
            optimizer.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(images), labels)
            loss.backward()
            optimizer.step()
            running += loss.item()
            batches += 1
        print(f"epoch {epoch}: mean loss {running / max(batches, 1):.4f}")
        torch.save({"epoch": epoch,
                    "model": model.state_dict(),
                    "optimizer": optimizer.state_dict()}, args.out)


if __name__ == "__main__":
    main()
