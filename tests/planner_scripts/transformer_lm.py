"""A small GPT-style language model with gradient accumulation and a warmup+cosine schedule.

Style: the nanoGPT-like script. A decoder-only transformer written out (token and position
embeddings, causal self-attention with ``F.scaled_dot_product_attention(is_causal=True)``,
LayerNorm, a GELU MLP), AdamW with weight-decay parameter groups (no decay for biases and
LayerNorm weights), ``--accum-steps`` micro-batches per optimizer step (loss / accum_steps),
a LambdaLR warmup+cosine schedule stepped after each optimizer step, ``device = "cuda"`` as a
string, and an evaluation loop reporting the perplexity ``math.exp(loss)``.

    python transformer_lm.py                                   # small, fast
    python transformer_lm.py --batch-size 16 --block-size 1024 --n-layer 12 --n-head 12 \
        --n-embd 768 --vocab-size 50304
"""

import argparse
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd, n_head):
        super().__init__()
        self.n_head = n_head
        self.qkv = nn.Linear(n_embd, 3 * n_embd)
        self.proj = nn.Linear(n_embd, n_embd)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).contiguous().view(B, T, C))


class Block(nn.Module):
    def __init__(self, n_embd, n_head):
        super().__init__()
        self.ln1 = nn.LayerNorm(n_embd)
        self.attn = CausalSelfAttention(n_embd, n_head)
        self.ln2 = nn.LayerNorm(n_embd)
        self.mlp = nn.Sequential(nn.Linear(n_embd, 4 * n_embd), nn.GELU(),
                                 nn.Linear(4 * n_embd, n_embd))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, vocab_size, block_size, n_layer, n_head, n_embd):
        super().__init__()
        self.tok_emb = nn.Embedding(vocab_size, n_embd)
        self.pos_emb = nn.Embedding(block_size, n_embd)
        self.blocks = nn.ModuleList(Block(n_embd, n_head) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(n_embd)
        self.head = nn.Linear(n_embd, vocab_size, bias=False)

    def forward(self, idx, targets=None):
        T = idx.size(1)
        pos = torch.arange(T, device=idx.device)
        x = self.tok_emb(idx) + self.pos_emb(pos)
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln_f(x))
        if targets is None:
            return logits, None
        return logits, F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def get_batch(data, batch_size, block_size, generator, device):
    ix = torch.randint(len(data) - block_size - 1, (batch_size,), generator=generator)
    x = torch.stack([data[i:i + block_size] for i in ix])
    y = torch.stack([data[i + 1:i + 1 + block_size] for i in ix])
    return x.to(device), y.to(device)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--block-size", type=int, default=64)
    p.add_argument("--n-layer", type=int, default=2)
    p.add_argument("--n-head", type=int, default=4)
    p.add_argument("--n-embd", type=int, default=128)
    p.add_argument("--vocab-size", type=int, default=1000)
    p.add_argument("--accum-steps", type=int, default=4)
    p.add_argument("--max-steps", type=int, default=20)
    p.add_argument("--warmup-steps", type=int, default=4)
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--eval-every", type=int, default=10)
    p.add_argument("--eval-batches", type=int, default=2)
    args = p.parse_args()

    device = "cuda"
    torch.manual_seed(1337)
    g = torch.Generator().manual_seed(1337)
    tokens = torch.randint(args.vocab_size, (50_000,), generator=g)
    train_data, val_data = tokens[:45_000], tokens[45_000:]

    model = GPT(args.vocab_size, args.block_size, args.n_layer, args.n_head, args.n_embd)
    model.to(torch.device(device))
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]  # biases, LayerNorm
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": args.weight_decay},
                                   {"params": no_decay, "weight_decay": 0.0}],
                                  lr=args.lr, betas=(0.9, 0.95))

    def lr_lambda(step):
        if step < args.warmup_steps:
            return (step + 1) / args.warmup_steps
        progress = (step - args.warmup_steps) / max(1, args.max_steps - args.warmup_steps)
        return 0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0)))
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda)

    for step in range(args.max_steps):
        model.train()
        optimizer.zero_grad(set_to_none=True)
        for _ in range(args.accum_steps):
            x, y = get_batch(train_data, args.batch_size, args.block_size, g, device)
            _, loss = model(x, y)
            (loss / args.accum_steps).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        scheduler.step()
        print(f"step {step} loss {loss.item():.4f} lr {scheduler.get_last_lr()[0]:.2e}")

        if (step + 1) % args.eval_every == 0:
            model.eval()
            losses = []
            with torch.no_grad():
                for _ in range(args.eval_batches):
                    x, y = get_batch(val_data, args.batch_size, args.block_size, g, device)
                    losses.append(model(x, y)[1].item())
            val_loss = sum(losses) / len(losses)
            print(f"step {step} val loss {val_loss:.4f} perplexity {math.exp(val_loss):.1f}")


if __name__ == "__main__":
    main()
