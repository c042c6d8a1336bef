#!/usr/bin/python3
"""Writes an example TorchScript model and data hook for
`dblp-worker --gradient=train --model=PATH.pt [--data=PATH.pt]`.

The contract both files follow is in docs/PYTORCH.md ("Bring your own model
and data"). Run with a python3 that has torch (Debian: python3-torch):

  /usr/bin/python3 tools/make-torchscript-example.py \\
      --model /tmp/cnn.pt --data /tmp/blobs.pt

--model: a small CNN (about 4k parameters; SmallCnn of
    examples/torchscript_model.py). Its adaptive pooling takes any
    image side from 8 up, so it trains on Fashion-MNIST (--data=fashion-mnist,
    [N,1,28,28]) and on the example hook's [N,1,16,16] images alike.
    --label_smoothing adds a loss(logits, target) method.
--data: a data hook holding a synthetic 10-class image set (class patterns
    plus noise) in its buffers; batch() hands each worker a strided shard.
    Replace the tensors with your own data set to train on it.
"""

import argparse
import os
import sys
from typing import Tuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn

# The model is the user-style example's (examples/torchscript_model.py).
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                "..", "examples"))
from torchscript_model import SmallCnn  # noqa: E402


class SmallCnnSmoothed(SmallCnn):
    """SmallCnn with its own loss: dblp-worker calls loss(logits, target)
    instead of plain cross-entropy when the module defines it."""

    def __init__(self, classes: int = 10, smoothing: float = 0.1):
        super().__init__(classes)
        self.smoothing = smoothing

    @torch.jit.export
    def loss(self, logits: Tensor, target: Tensor) -> Tensor:
        return F.cross_entropy(logits, target,
                               label_smoothing=self.smoothing)


class TensorData(nn.Module):
    """A data hook over tensors it carries as buffers (saved in the .pt).

    batch(): worker `rank` of `world` takes every world-th training example
    (its shard) and walks through it batch by batch, wrapping around.
    """

    def __init__(self, images: Tensor, labels: Tensor, test_images: Tensor,
                 test_labels: Tensor):
        super().__init__()
        self.register_buffer("images", images)
        self.register_buffer("labels", labels)
        self.register_buffer("test_images", test_images)
        self.register_buffer("test_labels", test_labels)

    @torch.jit.export
    def steps_per_epoch(self, world: int, batch_size: int) -> int:
        return max(1, self.images.size(0) // world // batch_size)

    @torch.jit.export
    def batch(self, step: int, rank: int, world: int,
              batch_size: int) -> Tuple[Tensor, Tensor]:
        images = self.images[rank::world]
        labels = self.labels[rank::world]
        per_epoch = max(1, images.size(0) // batch_size)
        start = (step % per_epoch) * batch_size
        return (images[start:start + batch_size],
                labels[start:start + batch_size])

    @torch.jit.export
    def eval_batch(self, index: int,
                   batch_size: int) -> Tuple[Tensor, Tensor]:
        # Past the end the slices are empty: that ends the evaluation.
        start = index * batch_size
        return (self.test_images[start:start + batch_size],
                self.test_labels[start:start + batch_size])


def synthetic_images(n: int, patterns: Tensor, noise: float,
                     gen: torch.Generator) -> Tuple[Tensor, Tensor]:
    labels = torch.randint(0, patterns.size(0), (n,), generator=gen)
    images = patterns[labels] + noise * torch.randn(
        (n,) + tuple(patterns.shape[1:]), generator=gen)
    return images.float(), labels


def make_data(side: int, classes: int, train: int, test: int,
              noise: float, seed: int) -> TensorData:
    gen = torch.Generator().manual_seed(seed)
    # Smooth class patterns: random low-resolution images scaled up.
    coarse = torch.randn((classes, 1, 4, 4), generator=gen)
    patterns = F.interpolate(coarse, size=(side, side), mode="bilinear",
                             align_corners=False)
    x, y = synthetic_images(train, patterns, noise, gen)
    tx, ty = synthetic_images(test, patterns, noise, gen)
    return TensorData(x, y, tx, ty)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="write the example model here (.pt)")
    ap.add_argument("--data", help="write the example data hook here (.pt)")
    ap.add_argument("--classes", type=int, default=10)
    ap.add_argument("--label_smoothing", type=float, default=0.0,
                    help="> 0: the model defines loss() with this smoothing")
    ap.add_argument("--side", type=int, default=16,
                    help="data hook: image side (inputs [N,1,side,side])")
    ap.add_argument("--train_size", type=int, default=2048)
    ap.add_argument("--test_size", type=int, default=512)
    ap.add_argument("--noise", type=float, default=3.0,
                    help="data hook: noise std around the class patterns")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args(argv)
    if not a.model and not a.data:
        ap.error("give --model PATH and/or --data PATH")
    if a.side < 8:
        ap.error("--side must be >= 8 (the CNN pools twice)")
    torch.manual_seed(a.seed)  # the model's initial weights
    if a.model:
        model = (SmallCnnSmoothed(a.classes, a.label_smoothing)
                 if a.label_smoothing > 0 else SmallCnn(a.classes))
        torch.jit.script(model).save(a.model)
        print("wrote %s: %d parameters" %
              (a.model, sum(p.numel() for p in model.parameters())))
    if a.data:
        hook = make_data(a.side, a.classes, a.train_size, a.test_size,
                         a.noise, a.seed)
        torch.jit.script(hook).save(a.data)
        print("wrote %s: %d training and %d test images of 1x%dx%d" %
              (a.data, a.train_size, a.test_size, a.side, a.side))
    return 0


if __name__ == "__main__":
    sys.exit(main())
