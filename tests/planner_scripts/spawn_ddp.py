"""Multi-process DDP started by the script itself, as pytorch/examples' ImageNet script does.

Style: ``--multiprocessing-distributed`` makes the script call ``torch.multiprocessing.spawn``
with one process per GPU (``torch.cuda.device_count()``); each worker joins an NCCL process
group, wraps the model in ``DistributedDataParallel(device_ids=[gpu])`` and trains. Without
the option it trains in one process on ``cuda:0`` (``--gpu 0``).

    python spawn_ddp.py --multiprocessing-distributed     # all GPUs of the node
    python spawn_ddp.py --gpu 0                           # one process, one GPU
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel


def main_worker(gpu, ngpus_per_node, args):
    if args.distributed:
        dist.init_process_group("nccl", init_method="tcp://127.0.0.1:29517",
                                world_size=ngpus_per_node, rank=gpu)
    torch.cuda.set_device(gpu)
    model = nn.Sequential(nn.Linear(args.features, args.hidden), nn.ReLU(),
                          nn.Linear(args.hidden, 10)).cuda(gpu)
    if args.distributed:
        model = DistributedDataParallel(model, device_ids=[gpu])
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for step in range(args.steps):
        x = torch.randn(args.batch_size, args.features).cuda(gpu, non_blocking=True)
        y = torch.randint(0, 10, (args.batch_size,)).cuda(gpu, non_blocking=True)
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 10 == 0 and (not args.distributed or gpu == 0):
            print(f"step {step} loss {loss.item():.3f}")
    if args.distributed:
        dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--multiprocessing-distributed", action="store_true")
    parser.add_argument("--gpu", type=int, default=0)
    parser.add_argument("--features", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    args.distributed = args.multiprocessing_distributed
    ngpus_per_node = torch.cuda.device_count()
    if args.multiprocessing_distributed:
        os.environ.setdefault("NCCL_DEBUG", "WARN")
        mp.spawn(main_worker, nprocs=ngpus_per_node, args=(ngpus_per_node, args))
    else:
        main_worker(args.gpu, ngpus_per_node, args)


if __name__ == "__main__":
    main()
