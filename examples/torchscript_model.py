#!/usr/bin/python3
"""A model for `dblp-worker --gradient=train --model=PATH.pt`, as a user
would write one: any nn.Module that torch.jit.script accepts, whose
forward(x) maps a float batch [N, 1, 28, 28] (or the --data hook's inputs)
to logits [N, C]. Defining loss(logits, target) (marked @torch.jit.export)
replaces the default cross-entropy. DBLP moves every parameter with
requires_grad, in named_parameters() order. Contract: docs/PYTORCH.md.

  /usr/bin/python3 examples/torchscript_model.py /tmp/cnn.pt
  dblp-worker ... -- --gradient=train --model=/tmp/cnn.pt ...

tools/make-torchscript-example.py, which the tests use, imports this
SmallCnn (and adds a label-smoothing variant and an example data hook).
"""

import sys

import torch
import torch.nn.functional as F
from torch import Tensor, nn


class SmallCnn(nn.Module):
    def __init__(self, classes: int = 10):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, 3, padding=1)
        self.conv2 = nn.Conv2d(8, 16, 3, padding=1)
        # Adaptive pooling: any image side from 8 up gives 16x4x4 features.
        self.pool = nn.AdaptiveAvgPool2d(4)
        self.fc = nn.Linear(16 * 4 * 4, classes)

    def forward(self, x: Tensor) -> Tensor:
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.relu(self.conv2(x))
        return self.fc(self.pool(x).flatten(1))

    # Optional: uncomment to train with label smoothing instead of plain
    # cross-entropy.
    # @torch.jit.export
    # def loss(self, logits: Tensor, target: Tensor) -> Tensor:
    #     return F.cross_entropy(logits, target, label_smoothing=0.1)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: torchscript_model.py OUT.pt")
    # Every worker loads the same file, so all replicas start equal.
    torch.manual_seed(1)
    torch.jit.script(SmallCnn()).save(sys.argv[1])
    print("wrote " + sys.argv[1])
