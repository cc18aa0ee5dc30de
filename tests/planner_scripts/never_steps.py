"""Feature extraction that never takes an optimizer step (a bad input for a training planner).

Style: an inference / embedding-extraction loop. A model goes to the GPU with ``.cuda()``,
forward passes run under ``torch.no_grad()`` in a ``while True`` loop (a "serve forever" or
"stream until killed" job), a counter is printed every 100 iterations, and no optimizer
exists at all: ``optimizer.step()`` is never called. A planner that waits for the 2nd
optimizer step must give up on this script (a timeout or an iteration limit), not hang.

    python never_steps.py                                      # runs until interrupted
    python never_steps.py --batch-size 256 --dim 2048 --max-iters 1000
"""

import argparse

import torch
import torch.nn as nn


class Encoder(nn.Module):
    def __init__(self, dim, hidden, out_dim):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(),
                                 nn.Linear(hidden, hidden), nn.GELU(),
                                 nn.Linear(hidden, out_dim))

    def forward(self, x):
        return nn.functional.normalize(self.net(x), dim=-1)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--out-dim", type=int, default=32)
    p.add_argument("--max-iters", type=int, default=0,
                   help="stop after this many batches (0: run forever)")
    args = p.parse_args()

    model = Encoder(args.dim, args.hidden, args.out_dim).cuda()
    model.eval()
    g = torch.Generator().manual_seed(0)

    it = 0
    norm_sum = 0.0
    with torch.no_grad():
        while True:
            x = torch.randn(args.batch_size, args.dim, generator=g).cuda()
            features = model(x)
            it += 1
            if it % 100 == 0:
                norm_sum += features.norm(dim=-1).mean().item()
                print(f"iteration {it}: {it * args.batch_size} samples embedded, "
                      f"mean norm {norm_sum / (it // 100):.3f}")
            if args.max_iters and it >= args.max_iters:
                break


if __name__ == "__main__":
    main()
