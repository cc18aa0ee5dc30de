"""The workshop's out-of-memory script (lesson 08), as a file to plan with ``helpers.fit``.

The original episode's challenge script, line for line, with the two names it leaves
undefined taken from the kit (``LargeResNet``: a ResNet-200, 64.7 million parameters;
``dataset``: synthetic 224 x 224 images with 1000 labels) and its batch size and image size
made options, so the planner can search them::

    python -m helpers.fit scripts/workshop_oom.py --gpu L40S
    python -m helpers.fit scripts/workshop_oom.py --image-size 112 --batch-arg --batch-size

It needs a CUDA GPU to run for real (it calls ``.cuda()``). Used by lesson 10.
"""

import argparse

import torch
import torch.nn as nn
from torch.utils.data import DataLoader

from helpers import LargeResNet, SyntheticImages

parser = argparse.ArgumentParser(description="The workshop's out-of-memory script")
parser.add_argument("--batch-size", type=int, default=256)
parser.add_argument("--image-size", type=int, default=224)
args = parser.parse_args()
dataset = SyntheticImages(4 * args.batch_size, size=args.image_size)

model = LargeResNet().cuda()
optimizer = torch.optim.Adam(model.parameters())
criterion = nn.CrossEntropyLoss()

train_loader = DataLoader(dataset, batch_size=args.batch_size, num_workers=1)

for epoch in range(100):  # noqa: B007 - the workshop's line, as written
    for data, labels in train_loader:
        data = data.cuda()
        labels = labels.cuda()

        outputs = model(data)
        loss = criterion(outputs, labels)

        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
