"""Train a Keras model on several machines with MultiWorkerMirroredStrategy and TF_CONFIG.

Every worker runs this script with the same list of workers and its own index:

    python scripts/tf_multiworker.py --workers localhost:23456,localhost:23457 --index 0 &
    python scripts/tf_multiworker.py --workers localhost:23456,localhost:23457 --index 1

Under SLURM, scripts/slurm_tf_multiworker.sbatch passes --workers and the index defaults
to SLURM_PROCID. If TF_CONFIG is already set and --workers is not given, it is used as is;
with neither, the script runs as a cluster of one worker. Each worker uses all GPUs it
sees (or its CPU), so several workers on ONE machine must each get their own GPUs, or they
share them (NCCL duplicate-GPU errors, or workers x GPUs replicas):

    CUDA_VISIBLE_DEVICES=0 python scripts/tf_multiworker.py --workers ... --index 0 &
    CUDA_VISIBLE_DEVICES=1 python scripts/tf_multiworker.py --workers ... --index 1

(CUDA_VISIBLE_DEVICES="" for CPU-only workers; SLURM with one task per node needs nothing.)
Keras 3's model.fit fails under MultiWorkerMirroredStrategy (keras-team/keras#20585), so
this is a custom training loop, as in TensorFlow's tutorial.
--checkpoint-dir saves every epoch with tf.train.CheckpointManager and resumes from it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--workers", default=None,
                   help="comma-separated host:port of every worker, the same on all workers")
    p.add_argument("--index", type=int, default=int(os.environ.get("SLURM_PROCID", 0)),
                   help="this worker's position in --workers (default: $SLURM_PROCID or 0)")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--global-batch", type=int, default=64,
                   help="batch size summed over ALL replicas of all workers")
    p.add_argument("--samples", type=int, default=1024)
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--checkpoint-dir", default=None,
                   help="save every epoch here (chief) and resume from the latest save")
    args = p.parse_args(argv)
    for name in ("epochs", "global_batch", "samples"):
        if getattr(args, name) <= 0:
            p.error(f"--{name.replace('_', '-')} must be positive")
    return args


def set_tf_config(args) -> dict:
    """TF_CONFIG from --workers/--index, else the one already set, else a cluster of one."""
    from helpers.launch import tf_config

    if args.workers:
        config = tf_config([w.strip() for w in args.workers.split(",")], args.index)
    elif "TF_CONFIG" in os.environ:
        config = json.loads(os.environ["TF_CONFIG"])
    else:
        config = tf_config(["localhost:23456"], 0)
    os.environ["TF_CONFIG"] = json.dumps(config)
    return config


def main(argv=None):
    args = parse_args(argv)
    try:
        config = set_tf_config(args)
    except ValueError as exc:
        sys.exit(f"tf_multiworker.py: error: {exc}")
    import helpers

    helpers.setup(seed=args.seed, tensorflow=True)  # quiet TF, seeded; before the strategy
    import tensorflow as tf

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    task = strategy.cluster_resolver.task_id
    chief = task == 0
    n_workers = len(config["cluster"]["worker"])
    replicas = strategy.num_replicas_in_sync
    if args.global_batch % replicas:
        sys.exit(f"--global-batch {args.global_batch} must divide by {replicas} replicas")
    if chief:
        print(f"TF_CONFIG of worker 0: {json.dumps(config)}", flush=True)
        print(f"{n_workers} worker(s), {replicas} replica(s) in sync: global batch "
              f"{args.global_batch} = {replicas} x {args.global_batch // replicas} per replica",
              flush=True)

    x, y = helpers.classification_data(args.samples, 32, 4, seed=args.seed, noise=6.0)
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    dataset = (tf.data.Dataset.from_tensor_slices((x, y)).shuffle(len(x), seed=args.seed)
               .batch(args.global_batch, drop_remainder=True).with_options(options))
    dist_dataset = strategy.experimental_distribute_dataset(dataset)

    with strategy.scope():
        model = tf.keras.Sequential([tf.keras.Input((32,)),
                                     tf.keras.layers.Dense(128, activation="relu"),
                                     tf.keras.layers.Dense(4)])
        optimizer = tf.keras.optimizers.SGD(args.lr, momentum=0.9)
        epoch = tf.Variable(0, dtype=tf.int64, trainable=False)
    per_sample = tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True,
                                                               reduction="none")

    manager = None
    if args.checkpoint_dir:
        ckpt = tf.train.Checkpoint(model=model, optimizer=optimizer, epoch=epoch)
        # every worker saves (it is a collective); only the chief writes the real directory
        directory = (args.checkpoint_dir if chief
                     else os.path.join(args.checkpoint_dir, f".worker{task}-tmp"))
        manager = tf.train.CheckpointManager(ckpt, directory, max_to_keep=2)
        latest = tf.train.latest_checkpoint(args.checkpoint_dir)  # the chief's, on every worker
        if latest:  # (a cluster needs a shared file system for this, as with torch)
            ckpt.restore(latest)
            if chief:
                print(f"resumed at epoch {int(epoch.numpy()) + 1}", flush=True)

    @tf.function
    def train_step(xb, yb):
        def replica_step(xb, yb):
            with tf.GradientTape() as tape:
                # divide by the GLOBAL batch: the all-reduce then sums to the mean over it
                loss = tf.nn.compute_average_loss(per_sample(yb, model(xb, training=True)),
                                                  global_batch_size=args.global_batch)
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))
            return loss

        return strategy.reduce("SUM", strategy.run(replica_step, args=(xb, yb)), axis=None)

    while int(epoch.numpy()) < args.epochs:
        total, steps = 0.0, 0
        for xb, yb in dist_dataset:
            total += float(train_step(xb, yb))
            steps += 1
        epoch.assign_add(1)
        if manager is not None:
            manager.save()
            if not chief:
                shutil.rmtree(directory, ignore_errors=True)
        if chief:
            print(f"epoch {int(epoch.numpy())}/{args.epochs}: mean loss {total / steps:.4f} "
                  f"({steps} steps)", flush=True)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
