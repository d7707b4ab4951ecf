"""Train a lazy CNN on scikit-learn's handwritten digits (8x8 images, 10 classes).

No layer is told its input size: the first batch decides every one, and from then on the
model is plain torch.nn. Run: ``python examples/digits.py`` (needs ``scikit-learn``).
"""

from __future__ import annotations

import argparse
import time

import torch
from sklearn.datasets import load_digits
from torch import nn

import lazynn


def make_model() -> nn.Sequential:
    """A small CNN whose sizes are all inferred: input (N, 1, 8, 8), output (N, 10) logits."""
    return nn.Sequential(
        lazynn.LazyConv2d(16, 3, padding=1),
        lazynn.LazyBatchNorm2d(),
        nn.ReLU(),
        lazynn.LazyConv2d(32, 3, padding=1),
        lazynn.LazyBatchNorm2d(),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Flatten(),
        lazynn.LazyLinear(64),
        nn.ReLU(),
        lazynn.LazyLinear(10),
    )


def main(epochs: int = 8, seed: int = 0) -> float:
    torch.manual_seed(seed)
    digits = load_digits()
    images = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
    labels = torch.tensor(digits.target)
    order = torch.randperm(len(labels))
    train, test = order[:1400], order[1400:]

    model = make_model()
    print("before the first call:", model[0], model[8], sep="\n  ")
    # The optimizer may be built before the first call: it holds the placeholders, which the
    # first call fills in place.
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    start = time.perf_counter()
    for epoch in range(epochs):
        model.train()
        for batch in train[torch.randperm(len(train))].split(64):
            loss = nn.functional.cross_entropy(model(images[batch]), labels[batch])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        model.eval()
        with torch.no_grad():
            accuracy = (model(images[test]).argmax(1) == labels[test]).float().mean().item()
        print(f"epoch {epoch + 1}: loss {loss.item():.3f}, test accuracy {accuracy:.3f}")
    print(f"trained in {time.perf_counter() - start:.1f} s")
    print("after:", model[0], model[8], sep="\n  ")
    params = sum(p.numel() for p in model.parameters())
    print(f"{params} parameters; every layer is plain torch.nn: {not lazynn.is_lazy(model)}")
    return accuracy


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--epochs", type=int, default=8)
    main(parser.parse_args().epochs)
