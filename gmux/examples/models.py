"""Two small real models and deterministic synthetic data sets for them."""
from __future__ import annotations

import torch
from torch import nn


class SmallCNN(nn.Module):
    def __init__(self, classes: int = 10, width: int = 16):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(width, 2 * width, 3, padding=1), nn.BatchNorm2d(2 * width), nn.ReLU(), nn.MaxPool2d(2))
        self.head = nn.Sequential(nn.Flatten(), nn.Dropout(0.2), nn.Linear(2 * width * 16, classes))

    def forward(self, x):
        return self.head(self.features(x))


class SmallTransformer(nn.Module):
    def __init__(self, vocab: int = 64, dim: int = 32, layers: int = 2, length: int = 16):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.pos = nn.Parameter(torch.zeros(length, dim))
        layer = nn.TransformerEncoderLayer(dim, nhead=4, dim_feedforward=64, dropout=0.1, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.out = nn.Linear(dim, vocab)

    def forward(self, tokens):
        return self.out(self.encoder(self.embed(tokens) + self.pos))


class Images(torch.utils.data.Dataset):
    """16x16 one-channel images whose class is encoded in their pixels; each item depends only on its index."""

    def __init__(self, n: int = 512, classes: int = 10, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        self.labels = torch.randint(0, classes, (n,), generator=g)
        self.images = torch.randn(n, 1, 16, 16, generator=g) + self.labels.view(-1, 1, 1, 1) * 0.1

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return self.images[i], self.labels[i]


class Tokens(torch.utils.data.Dataset):
    """Sequences whose next token is a fixed function of the current one: learnable, deterministic."""

    def __init__(self, n: int = 512, vocab: int = 64, length: int = 16, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        start = torch.randint(0, vocab, (n, 1), generator=g)
        steps = torch.arange(length + 1).view(1, -1)
        self.seq = (start * 7 + steps * 3) % vocab

    def __len__(self):
        return len(self.seq)

    def __getitem__(self, i):
        return self.seq[i, :-1], self.seq[i, 1:]


def build(name: str, seed: int = 0):
    """(model, dataset, loss function) for a model name."""
    torch.manual_seed(seed)
    if name == "cnn":
        return SmallCNN(), Images(seed=seed), nn.functional.cross_entropy
    if name == "transformer":
        model = SmallTransformer()
        return model, Tokens(seed=seed), lambda out, y: nn.functional.cross_entropy(out.flatten(0, 1), y.flatten())
    raise ValueError(f"unknown model {name!r}; choose cnn or transformer")
