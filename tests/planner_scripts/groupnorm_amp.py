"""A diffusion-style convolutional denoiser with GroupNorm + SiLU under float16 autocast.

Style: the U-Net-like residual blocks of diffusion models (``GroupNorm(32, C)``, ``SiLU``,
3x3 convolutions, a time embedding added per block), an epsilon-prediction MSE loss on
noised images, ``torch.autocast("cuda", dtype=torch.float16)`` with
``torch.amp.GradScaler("cuda")``, AdamW, images generated on the host.

    python groupnorm_amp.py                                   # small, fast
    python groupnorm_amp.py --batch-size 64 --image-size 64 --width 128 --blocks 8
"""

import argparse
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class ResBlock(nn.Module):
    def __init__(self, channels, t_dim):
        super().__init__()
        self.norm1 = nn.GroupNorm(32, channels)
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1)
        self.t_proj = nn.Linear(t_dim, channels)
        self.norm2 = nn.GroupNorm(32, channels)
        self.conv2 = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x, t):
        h = self.conv1(F.silu(self.norm1(x)))
        h = h + self.t_proj(t)[:, :, None, None]
        h = self.conv2(F.silu(self.norm2(h)))
        return x + h


def timestep_embedding(t, dim):
    half = dim // 2
    freqs = torch.exp(-math.log(10000) * torch.arange(half, device=t.device) / half)
    args = t[:, None].float() * freqs[None]
    return torch.cat([torch.cos(args), torch.sin(args)], dim=-1)


class Denoiser(nn.Module):
    def __init__(self, width, blocks, t_dim=128):
        super().__init__()
        self.t_dim = t_dim
        self.t_mlp = nn.Sequential(nn.Linear(t_dim, t_dim), nn.SiLU(), nn.Linear(t_dim, t_dim))
        self.inp = nn.Conv2d(3, width, 3, padding=1)
        self.blocks = nn.ModuleList(ResBlock(width, t_dim) for _ in range(blocks))
        self.out_norm = nn.GroupNorm(32, width)
        self.out = nn.Conv2d(width, 3, 3, padding=1)

    def forward(self, x, t):
        temb = self.t_mlp(timestep_embedding(t, self.t_dim))
        h = self.inp(x)
        for block in self.blocks:
            h = block(h, temb)
        return self.out(F.silu(self.out_norm(h)))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--image-size", type=int, default=16)
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--blocks", type=int, default=2)
    p.add_argument("--steps", type=int, default=5)
    args = p.parse_args()

    device = "cuda"
    torch.manual_seed(0)
    model = Denoiser(args.width, args.blocks).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-4)
    scaler = torch.amp.GradScaler("cuda")
    for step in range(args.steps):
        x0 = torch.randn(args.batch_size, 3, args.image_size, args.image_size).to(device)
        t = torch.randint(1000, (args.batch_size,)).to(device)
        noise = torch.randn_like(x0)
        alpha = (1 - t.float() / 1000)[:, None, None, None]
        xt = alpha.sqrt() * x0 + (1 - alpha).sqrt() * noise
        with torch.autocast("cuda", dtype=torch.float16):
            loss = F.mse_loss(model(xt, t), noise)
        optimizer.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        print(f"step {step} loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
