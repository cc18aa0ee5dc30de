"""A sequence classifier with a stacked LSTM, in the pytorch/examples style.

Style: ``nn.Embedding`` -> 2-layer ``nn.LSTM(batch_first=True, dropout=...)`` ->
``nn.Linear`` on the last step's output, ``--no-cudnn`` (``torch.backends.cudnn.enabled =
False``, as for bitwise-reproducible runs), ``model.to(device)`` with
``device = torch.device("cuda" if torch.cuda.is_available() else "cpu")``, Adam, gradient
clipping (``clip_grad_norm_``), token ids and labels made in a ``TensorDataset`` and a
``DataLoader``, ``--bidirectional``.

    python lstm_classifier.py                                 # small, fast
    python lstm_classifier.py --batch-size 128 --seq-len 512 --hidden 1024 --layers 3
"""

import argparse

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


class LSTMClassifier(nn.Module):
    def __init__(self, vocab, embed, hidden, layers, n_classes, bidirectional, dropout):
        super().__init__()
        self.emb = nn.Embedding(vocab, embed)
        self.lstm = nn.LSTM(embed, hidden, layers, batch_first=True, dropout=dropout,
                            bidirectional=bidirectional)
        self.fc = nn.Linear(hidden * (2 if bidirectional else 1), n_classes)

    def forward(self, tokens):
        out, _ = self.lstm(self.emb(tokens))
        return self.fc(out[:, -1])


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=32)
    p.add_argument("--embed", type=int, default=64)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--vocab", type=int, default=500)
    p.add_argument("--bidirectional", action="store_true")
    p.add_argument("--dropout", type=float, default=0.1)
    p.add_argument("--samples", type=int, default=64)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--no-cudnn", action="store_true")
    args = p.parse_args()

    torch.backends.cudnn.enabled = not args.no_cudnn
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(0)
    data = TensorDataset(torch.randint(args.vocab, (args.samples, args.seq_len)),
                         torch.randint(4, (args.samples,)))
    loader = DataLoader(data, batch_size=args.batch_size, shuffle=True, drop_last=True)
    model = LSTMClassifier(args.vocab, args.embed, args.hidden, args.layers, 4,
                           args.bidirectional, args.dropout).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    criterion = nn.CrossEntropyLoss()
    for epoch in range(args.epochs):
        model.train()
        for i, (tokens, labels) in enumerate(loader):
            tokens, labels = tokens.to(device), labels.to(device)
            optimizer.zero_grad()
            loss = criterion(model(tokens), labels)
            loss.backward()
            nn.utils.clip_grad_norm_(model.parameters(), 0.5)
            optimizer.step()
            if i % 4 == 0:
                print(f"epoch {epoch} batch {i} loss {loss.item():.3f}")


if __name__ == "__main__":
    main()
