"""A small CNN trained in pure float16 (or moved back to float32) after moving to the GPU.

Style: module moves chained and repeated. ``model.cuda().half()``, then
``model.to(device).to(memory_format=torch.channels_last)`` (a second ``.to()`` and a memory
format), BatchNorm layers (their running statistics are buffers), inputs made with
``torch.randn(..., device=device, dtype=dtype)`` and ``.to(memory_format=torch.channels_last)``,
SGD with momentum built after the moves. ``--float32`` takes the ``model.float()`` path back
to float32 before training.

    python half_after_cuda.py                                  # small, fast
    python half_after_cuda.py --batch-size 256 --image-size 224 --width 128
"""

import argparse

import torch
import torch.nn as nn


def make_model(width, classes):
    def block(cin, cout):
        return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1, bias=False),
                             nn.BatchNorm2d(cout), nn.ReLU(inplace=True))

    return nn.Sequential(block(3, width), block(width, width), nn.MaxPool2d(2),
                         block(width, 2 * width), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(2 * width, classes))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--image-size", type=int, default=16)
    parser.add_argument("--width", type=int, default=8)
    parser.add_argument("--classes", type=int, default=10)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--float32", action="store_true",
                        help="move the model back to float32 (model.float()) before training")
    args = parser.parse_args()

    torch.manual_seed(0)
    device = torch.device("cuda")
    model = make_model(args.width, args.classes).cuda().half()
    model = model.to(device).to(memory_format=torch.channels_last)
    dtype = torch.float16
    if args.float32:
        model.float()
        dtype = torch.float32
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    for step in range(args.steps):
        x = torch.randn(args.batch_size, 3, args.image_size, args.image_size, device=device,
                        dtype=dtype).to(memory_format=torch.channels_last)
        y = torch.randint(0, args.classes, (args.batch_size,), device=device)
        loss = nn.functional.cross_entropy(model(x).float(), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        print(f"step {step}: loss {loss.item():.3f}")


if __name__ == "__main__":
    main()
