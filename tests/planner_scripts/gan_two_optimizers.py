"""A DCGAN-style GAN with two optimizers (a bad input for a planner that counts all steps).

Style: the PyTorch DCGAN tutorial's training loop. A generator (ConvTranspose2d, BatchNorm,
ReLU, Tanh) and a discriminator (Conv2d, BatchNorm, LeakyReLU) each with its own Adam
(betas 0.5, 0.999), ``device = torch.device("cuda" if torch.cuda.is_available() else
"cpu")``, ``.to(device)``, DataLoader over synthetic images, BCEWithLogitsLoss with
``torch.full(..., device=device)`` labels, the discriminator's step on real and
``fake.detach()`` images, then the generator's step through the discriminator, ``.item()``
logging. ``--n-critic N`` takes N discriminator steps per generator step (WGAN's critic
schedule): the two optimizers step at different rates. ``--iters`` generator steps in all.

    python gan_two_optimizers.py
    python gan_two_optimizers.py --batch-size 128 --image-size 64 --nz 100 --ngf 64 --ndf 64
    python gan_two_optimizers.py --n-critic 5
"""

import argparse

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


def generator(nz, ngf, image_size):
    layers = [nn.ConvTranspose2d(nz, ngf * 4, 4, 1, 0, bias=False), nn.BatchNorm2d(ngf * 4),
              nn.ReLU(True)]
    size, ch = 4, ngf * 4
    while size * 2 < image_size:
        layers += [nn.ConvTranspose2d(ch, ch // 2, 4, 2, 1, bias=False),
                   nn.BatchNorm2d(ch // 2), nn.ReLU(True)]
        size, ch = size * 2, ch // 2
    layers += [nn.ConvTranspose2d(ch, 3, 4, 2, 1, bias=False), nn.Tanh()]
    return nn.Sequential(*layers)


def discriminator(ndf, image_size):
    layers = [nn.Conv2d(3, ndf, 4, 2, 1, bias=False), nn.LeakyReLU(0.2, inplace=True)]
    size, ch = image_size // 2, ndf
    while size > 4:
        layers += [nn.Conv2d(ch, ch * 2, 4, 2, 1, bias=False), nn.BatchNorm2d(ch * 2),
                   nn.LeakyReLU(0.2, inplace=True)]
        size, ch = size // 2, ch * 2
    layers += [nn.Conv2d(ch, 1, 4, 1, 0, bias=False), nn.Flatten()]
    return nn.Sequential(*layers)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--image-size", type=int, default=16)
    p.add_argument("--nz", type=int, default=16)
    p.add_argument("--ngf", type=int, default=8)
    p.add_argument("--ndf", type=int, default=8)
    p.add_argument("--n-critic", type=int, default=1,
                   help="discriminator steps per generator step")
    p.add_argument("--iters", type=int, default=4, help="generator steps in all")
    p.add_argument("--samples", type=int, default=256)
    args = p.parse_args()

    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    images = torch.rand(args.samples, 3, args.image_size, args.image_size) * 2 - 1
    loader = DataLoader(TensorDataset(images), batch_size=args.batch_size, shuffle=True,
                        drop_last=True)

    netG = generator(args.nz, args.ngf, args.image_size).to(device)
    netD = discriminator(args.ndf, args.image_size).to(device)
    optD = torch.optim.Adam(netD.parameters(), lr=2e-4, betas=(0.5, 0.999))
    optG = torch.optim.Adam(netG.parameters(), lr=2e-4, betas=(0.5, 0.999))
    criterion = nn.BCEWithLogitsLoss()

    g_steps = d_steps = 0
    while g_steps < args.iters:
        for (real,) in loader:
            real = real.to(device)
            b = real.size(0)
            # the discriminator: real images up, generated ones down
            netD.zero_grad()
            out_real = netD(real)
            err_real = criterion(out_real, torch.full((b, 1), 1.0, device=device))
            noise = torch.randn(b, args.nz, 1, 1, device=device)
            fake = netG(noise)
            out_fake = netD(fake.detach())
            err_fake = criterion(out_fake, torch.full((b, 1), 0.0, device=device))
            (err_real + err_fake).backward()
            optD.step()
            d_steps += 1
            if d_steps % args.n_critic:
                continue
            # the generator: make the discriminator say "real"
            netG.zero_grad()
            err_g = criterion(netD(fake), torch.full((b, 1), 1.0, device=device))
            err_g.backward()
            optG.step()
            g_steps += 1
            print(f"step {g_steps}: loss D {(err_real + err_fake).item():.3f} "
                  f"G {err_g.item():.3f}")
            if g_steps >= args.iters:
                break


if __name__ == "__main__":
    main()
