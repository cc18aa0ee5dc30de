"""Resumable training: a checkpoint in the working folder is loaded, then saved over.

Style: the script that runs as a chain of cluster jobs. It resumes from ``--ckpt`` when the
file exists (``torch.load(map_location=device)``), appends to a log file, and at the end of
each epoch writes the checkpoint atomically (``torch.save`` to a temporary name, then
``os.replace``), keeps a copy of the best one with ``shutil.copyfile``, and writes a small
JSON summary with ``pathlib``. Every one of those writes lands in the working folder.

    python resume_checkpoint.py                     # small, fast; run it twice to resume
    python resume_checkpoint.py --hidden 8192 --batch-size 1024
"""

import argparse
import json
import os
import shutil
from pathlib import Path

import torch
import torch.nn as nn

parser = argparse.ArgumentParser()
parser.add_argument("--ckpt", default="model.pt")
parser.add_argument("--log", default="train.log")
parser.add_argument("--features", type=int, default=32)
parser.add_argument("--hidden", type=int, default=64)
parser.add_argument("--classes", type=int, default=10)
parser.add_argument("--batch-size", type=int, default=16)
parser.add_argument("--steps-per-epoch", type=int, default=2)
parser.add_argument("--epochs", type=int, default=2)
args = parser.parse_args()

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(args.features, args.hidden), nn.ReLU(),
                      nn.Linear(args.hidden, args.classes)).to(device)
opt = torch.optim.Adam(model.parameters(), lr=1e-3)
start_epoch = 0
if os.path.exists(args.ckpt):
    state = torch.load(args.ckpt, map_location=device)
    model.load_state_dict(state["model"])
    if "optimizer" in state:
        opt.load_state_dict(state["optimizer"])
    start_epoch = state.get("epoch", -1) + 1
    print(f"resumed from {args.ckpt} at epoch {start_epoch}")

log = open(args.log, "a")
best = float("inf")
for epoch in range(start_epoch, start_epoch + args.epochs):
    for step in range(args.steps_per_epoch):
        x = torch.randn(args.batch_size, args.features, device=device)
        y = torch.randint(0, args.classes, (args.batch_size,), device=device)
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        log.write(f"epoch {epoch} step {step} loss {loss.item():.4f}\n")
    torch.save({"model": model.state_dict(), "optimizer": opt.state_dict(), "epoch": epoch},
               args.ckpt + ".tmp")
    os.replace(args.ckpt + ".tmp", args.ckpt)
    if loss.item() < best:
        best = loss.item()
        shutil.copyfile(args.ckpt, "best_" + os.path.basename(args.ckpt))
    Path("summary.json").write_text(json.dumps({"epoch": epoch, "loss": loss.item()}))
log.close()
