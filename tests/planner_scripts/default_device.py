"""An MLP classifier written for ``torch.set_default_device("cuda")``.

Style: no ``.cuda()`` or ``device=`` anywhere after the first line of ``main``: the model,
its BatchNorm buffers, the data set and each batch index are made on the GPU by the default
device. ``torch.get_default_device()`` printed, ``torch.randperm`` batches, AdamW, a
``StepLR`` schedule, ``torch.utils.checkpoint`` around the hidden block,
``assert x.device.type == "cuda"``.

    python default_device.py                                   # small, fast
    python default_device.py --n-train 200000 --dim 1024 --hidden 8192 --batch-size 4096
"""

import argparse

import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint


class Net(nn.Module):
    def __init__(self, dim, hidden, classes):
        super().__init__()
        self.inp = nn.Sequential(nn.Linear(dim, hidden), nn.BatchNorm1d(hidden), nn.ReLU())
        self.hidden = nn.Sequential(nn.Linear(hidden, hidden), nn.GELU(),
                                    nn.Linear(hidden, hidden), nn.GELU())
        self.out = nn.Linear(hidden, classes)

    def forward(self, x):
        h = self.inp(x)
        h = checkpoint(self.hidden, h, use_reentrant=False)
        return self.out(h)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n-train", type=int, default=512)
    parser.add_argument("--dim", type=int, default=32)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--steps", type=int, default=6)
    args = parser.parse_args()

    torch.set_default_device("cuda")
    print("default device:", torch.get_default_device())
    torch.manual_seed(0)
    model = Net(args.dim, args.hidden, args.classes)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=3, gamma=0.5)
    data = torch.randn(args.n_train, args.dim)
    labels = torch.randint(0, args.classes, (args.n_train,))

    for step in range(args.steps):
        idx = torch.randperm(args.n_train)[:args.batch_size]
        x, y = data[idx], labels[idx]
        assert x.device.type == "cuda"
        loss = nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        scheduler.step()
        print(f"step {step}: loss {loss.item():.3f}")


if __name__ == "__main__":
    main()
