"""A transformer encoder classifier with attention dropout, in the word_language_model style.

Style: ``nn.TransformerEncoder`` of ``nn.TransformerEncoderLayer(batch_first=True)`` (whose
``nn.MultiheadAttention`` calls ``F.scaled_dot_product_attention`` with ``dropout_p`` > 0 in
training) plus one layer written out with ``F.scaled_dot_product_attention(dropout_p=...)``,
``--amp bf16|fp16|off`` autocast (a ``GradScaler`` for fp16), ``--sdpa-backend`` to pin
the attention kernel with ``torch.nn.attention.sdpa_kernel``, AdamW, token ids generated on
the host and moved with ``.to(device)``.

    python sdpa_dropout.py                                    # small, fast
    python sdpa_dropout.py --batch-size 32 --seq-len 2048 --d-model 1024 --n-head 16 \
        --n-layer 12 --amp bf16
"""

import argparse
import contextlib

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


class SelfAttention(nn.Module):
    """Multi-head self-attention written out, with attention dropout."""

    def __init__(self, d_model, n_head, dropout):
        super().__init__()
        self.n_head = n_head
        self.dropout = dropout
        self.qkv = nn.Linear(d_model, 3 * d_model)
        self.out = nn.Linear(d_model, d_model)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
                   for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=self.dropout if self.training
                                           else 0.0)
        return self.out(y.transpose(1, 2).reshape(B, T, C))


class Classifier(nn.Module):
    def __init__(self, vocab, d_model, n_head, n_layer, dropout, n_classes):
        super().__init__()
        self.emb = nn.Embedding(vocab, d_model)
        layer = nn.TransformerEncoderLayer(d_model, n_head, 4 * d_model, dropout=dropout,
                                           batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, n_layer, enable_nested_tensor=False)
        self.attn = SelfAttention(d_model, n_head, dropout)
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, n_classes)

    def forward(self, tokens):
        x = self.encoder(self.emb(tokens))
        x = self.norm(x + self.attn(x))
        return self.head(x.mean(dim=1))


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--d-model", type=int, default=128)
    p.add_argument("--n-head", type=int, default=2)
    p.add_argument("--n-layer", type=int, default=2)
    p.add_argument("--vocab", type=int, default=1000)
    p.add_argument("--dropout", type=float, default=0.1)
    p.add_argument("--amp", choices=["bf16", "fp16", "off"], default="bf16")
    p.add_argument("--sdpa-backend", choices=["auto", "math", "efficient", "flash"],
                   default="auto")
    p.add_argument("--steps", type=int, default=5)
    args = p.parse_args()

    device = torch.device("cuda")
    torch.manual_seed(0)
    model = Classifier(args.vocab, args.d_model, args.n_head, args.n_layer, args.dropout,
                       10).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(args.amp)
    scaler = torch.amp.GradScaler("cuda", enabled=args.amp == "fp16")
    backends = {"math": SDPBackend.MATH, "efficient": SDPBackend.EFFICIENT_ATTENTION,
                "flash": SDPBackend.FLASH_ATTENTION}
    pinned = sdpa_kernel(backends[args.sdpa_backend]) if args.sdpa_backend != "auto" \
        else contextlib.nullcontext()
    with pinned:
        train(model, optimizer, scaler, dtype, args, device)


def train(model, optimizer, scaler, dtype, args, device):
    for step in range(args.steps):
        tokens = torch.randint(args.vocab, (args.batch_size, args.seq_len)).to(device)
        labels = torch.randint(10, (args.batch_size,)).to(device)
        with torch.autocast("cuda", dtype=dtype or torch.float32, enabled=dtype is not None):
            loss = F.cross_entropy(model(tokens), labels)
        optimizer.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        print(f"step {step} loss {loss.item():.3f}")


if __name__ == "__main__":
    main()
