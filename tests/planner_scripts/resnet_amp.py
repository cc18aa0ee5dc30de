"""ResNet-50 with mixed precision (float16 autocast + GradScaler), one process per GPU.

Style: the "launched by torchrun/SLURM" script. It picks its card from ``LOCAL_RANK``
(``torch.cuda.set_device(local_rank)``, ``torch.device("cuda", local_rank)``), writes
ResNet-50 out (Bottleneck blocks, stages [3, 4, 6, 3], as torchvision's ``resnet50``), trains
with Adam under ``torch.autocast("cuda", dtype=torch.float16)`` and
``torch.amp.GradScaler("cuda")``, unscales before clipping the gradient norm, and skips a
step whose loss is not finite. ``--no-amp`` turns autocast and the scaler off (``enabled=``).

    python resnet_amp.py                                        # small, fast
    python resnet_amp.py --batch-size 256 --image-size 224 --no-amp   # the classic benchmark
"""

import argparse
import os

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, Dataset


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, inplanes, planes, stride=1, downsample=None):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, planes * self.expansion, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(planes * self.expansion)
        self.relu = nn.ReLU(inplace=True)
        self.downsample = downsample

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        return self.relu(out + identity)


class ResNet50(nn.Module):
    def __init__(self, num_classes=1000, layers=(3, 4, 6, 3)):
        super().__init__()
        self.inplanes = 64
        self.conv1 = nn.Conv2d(3, 64, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        self.layer1 = self._make_layer(64, layers[0])
        self.layer2 = self._make_layer(128, layers[1], stride=2)
        self.layer3 = self._make_layer(256, layers[2], stride=2)
        self.layer4 = self._make_layer(512, layers[3], stride=2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(512 * Bottleneck.expansion, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def _make_layer(self, planes, blocks, stride=1):
        downsample = None
        if stride != 1 or self.inplanes != planes * Bottleneck.expansion:
            downsample = nn.Sequential(
                nn.Conv2d(self.inplanes, planes * Bottleneck.expansion, 1, stride=stride,
                          bias=False),
                nn.BatchNorm2d(planes * Bottleneck.expansion))
        layers = [Bottleneck(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes * Bottleneck.expansion
        layers += [Bottleneck(self.inplanes, planes) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


class RandomImageNet(Dataset):
    """ImageNet-shaped random images, generated in ``__getitem__`` from a per-index seed."""

    def __init__(self, samples, image_size, num_classes):
        self.samples, self.image_size, self.num_classes = samples, image_size, num_classes

    def __len__(self):
        return self.samples

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        image = torch.randn(3, self.image_size, self.image_size, generator=g)
        return image, int(torch.randint(self.num_classes, (1,), generator=g))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--image-size", type=int, default=64)
    p.add_argument("--num-classes", type=int, default=1000)
    p.add_argument("--samples", type=int, default=64)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--no-amp", action="store_true", help="train in float32")
    args = p.parse_args()
    use_amp = not args.no_amp

    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)

    loader = DataLoader(RandomImageNet(args.samples, args.image_size, args.num_classes),
                        batch_size=args.batch_size, shuffle=True, num_workers=args.workers,
                        drop_last=True)
    model = ResNet50(num_classes=args.num_classes).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    scaler = torch.amp.GradScaler("cuda", enabled=use_amp)

    for epoch in range(args.epochs):
        model.train()
        for step, (images, targets) in enumerate(loader):
            images, targets = images.to(device), targets.to(device)
            optimizer.zero_grad(set_to_none=True)
            with torch.autocast("cuda", dtype=torch.float16, enabled=use_amp):
                loss = F.cross_entropy(model(images), targets)
            if not torch.isfinite(loss):
                print(f"step {step}: non-finite loss, skipping the batch")
                continue
            scaler.scale(loss).backward()
            scaler.unscale_(optimizer)
            torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1.0)
            scaler.step(optimizer)
            scaler.update()
            if step % 10 == 0:
                print(f"epoch {epoch} step {step} loss {loss.item():.4f} "
                      f"scale {scaler.get_scale():.0f}")


if __name__ == "__main__":
    main()
