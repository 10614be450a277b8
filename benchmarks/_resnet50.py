"""The parameter shapes of torchvision's ResNet-50, written out from the architecture.

No torchvision here: the list follows ``torchvision.models.resnet50()`` (He et al. 2015, bottleneck
v1.5: the stride sits on the 3x3 conv), in ``model.parameters()`` order: conv weight, then the
BatchNorm's weight and bias, block by block; fc last. 161 tensors, 25,557,032 parameters.
"""

from __future__ import annotations

import math

Shape = tuple[int, ...]
LAYERS = (3, 4, 6, 3)
WIDTHS = (64, 128, 256, 512)
EXPANSION = 4
NUM_CLASSES = 1000


def _conv_bn(out_ch: int, in_ch: int, k: int) -> list[Shape]:
    return [(out_ch, in_ch, k, k), (out_ch,), (out_ch,)]


def resnet50_shapes() -> list[Shape]:
    """Return the 161 parameter shapes of ResNet-50, in ``model.parameters()`` order."""
    shapes = _conv_bn(64, 3, 7)  # stem: conv1 + bn1
    in_ch = 64
    for blocks, width in zip(LAYERS, WIDTHS, strict=True):
        out_ch = width * EXPANSION
        for block in range(blocks):
            shapes += _conv_bn(width, in_ch, 1)
            shapes += _conv_bn(width, width, 3)
            shapes += _conv_bn(out_ch, width, 1)
            if block == 0:  # downsample: 1x1 conv + bn on the shortcut
                shapes += _conv_bn(out_ch, in_ch, 1)
            in_ch = out_ch
    shapes += [(NUM_CLASSES, in_ch), (NUM_CLASSES,)]
    return shapes


def numel(shapes: list[Shape]) -> int:
    return sum(math.prod(s) for s in shapes)


if __name__ == "__main__":
    s = resnet50_shapes()
    print(len(s), numel(s))
