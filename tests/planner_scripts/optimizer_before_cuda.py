"""An MLP whose optimizer is built before the model moves to the GPU.

Style: the "build everything, then move" script. The model and ``torch.optim.Adam(
model.parameters())`` are made on the host, then ``model.cuda()`` moves the model; this works
on a GPU because a module's move keeps its Parameter objects (``param.data`` is replaced in
place), so the optimizer's references stay valid. A ``LambdaLR`` warmup, inputs moved with
``.cuda(non_blocking=True)``, ``.item()`` logging.

    python optimizer_before_cuda.py                            # small, fast
    python optimizer_before_cuda.py --batch-size 1024 --dim 4096 --hidden 16384
"""

import argparse

import torch
import torch.nn as nn


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(args.dim, args.hidden), nn.ReLU(),
                          nn.Linear(args.hidden, args.hidden), nn.ReLU(),
                          nn.Linear(args.hidden, args.classes))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / 5))
    model.cuda()  # after the optimizer: it keeps the same Parameter objects

    for step in range(args.steps):
        x = torch.randn(args.batch_size, args.dim).cuda(non_blocking=True)
        y = torch.randint(0, args.classes, (args.batch_size,)).cuda(non_blocking=True)
        loss = nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        scheduler.step()
        if step % 5 == 0:
            print(f"step {step}: loss {loss.item():.3f}")


if __name__ == "__main__":
    main()
