"""Classic MLP classifier, ``.cuda()`` everywhere.

Style: the script most people write first on a cluster. It refuses to run without a GPU,
prints the card's name, moves the model and every batch with ``.cuda()``, trains with SGD and
momentum, logs ``loss.item()`` every N steps and measures accuracy at the end of each epoch
under ``torch.no_grad()`` with ``(pred == y).sum().item()``.

    python mlp_cuda_everywhere.py                              # small, fast
    python mlp_cuda_everywhere.py --batch-size 4096 --hidden 8192 --samples 200000
"""

import argparse
import sys

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset


class SyntheticClassification(Dataset):
    """Gaussian features; the label is the argmax of a fixed random projection."""

    def __init__(self, samples, features, classes, seed=0):
        g = torch.Generator().manual_seed(seed)
        self.x = torch.randn(samples, features, generator=g)
        proj = torch.randn(features, classes, generator=g)
        self.y = (self.x @ proj).argmax(dim=1)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


class MLP(nn.Module):
    def __init__(self, features, hidden, classes, depth):
        super().__init__()
        layers, width = [], features
        for _ in range(depth):
            layers += [nn.Linear(width, hidden), nn.ReLU()]
            width = hidden
        layers.append(nn.Linear(width, classes))
        self.net = nn.Sequential(*layers)

    def forward(self, x):
        return self.net(x)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--features", type=int, default=64)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--depth", type=int, default=3)
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--samples", type=int, default=256)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--log-every", type=int, default=4)
    args = p.parse_args()

    if not torch.cuda.is_available():
        sys.exit("error: this script needs a CUDA GPU (torch.cuda.is_available() is False)")
    print(f"GPU: {torch.cuda.get_device_name(0)}")
    torch.manual_seed(0)

    train_set = SyntheticClassification(args.samples, args.features, args.classes, seed=0)
    val_set = SyntheticClassification(args.samples // 4, args.features, args.classes, seed=1)
    train_loader = DataLoader(train_set, batch_size=args.batch_size, shuffle=True)
    val_loader = DataLoader(val_set, batch_size=args.batch_size)

    model = MLP(args.features, args.hidden, args.classes, args.depth)
    model.cuda()
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)

    step = 0
    for epoch in range(args.epochs):
        model.train()
        for x, y in train_loader:
            x, y = x.cuda(), y.cuda()
            optimizer.zero_grad()
            loss = criterion(model(x), y)
            loss.backward()
            optimizer.step()
            step += 1
            if step % args.log_every == 0:
                print(f"epoch {epoch} step {step} loss {loss.item():.4f}")

        model.eval()
        correct = total = 0
        with torch.no_grad():
            for x, y in val_loader:
                x, y = x.cuda(), y.cuda()
                pred = model(x).argmax(dim=1)
                correct += (pred == y).sum().item()
                total += y.size(0)
        print(f"epoch {epoch} val accuracy {correct / total:.3f}")


if __name__ == "__main__":
    main()
