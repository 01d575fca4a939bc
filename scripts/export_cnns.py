"""Small, structurally faithful CNNs in plain torch.nn for scripts/export_models.py.

torchvision does not import beside the pinned torch, so the four convolutional networks are
written out here: the same block types, stage strides and activations as the originals
(ResNet-50 bottlenecks, EfficientNet-B0 MBConv with squeeze-excitation and SiLU, ShuffleNetV2
units with channel split and shuffle, MobileNetV3-Small bnecks with hardswish and
hardsigmoid SE), with narrow channels and fewer repeats so that every file stays small.
"""
from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F


def conv_bn(cin, cout, k, stride=1, groups=1, act=None):
    """Conv (no bias) + BatchNorm + optional activation, as in every one of these networks."""
    layers = [nn.Conv2d(cin, cout, k, stride, k // 2, groups=groups, bias=False), nn.BatchNorm2d(cout)]
    if act is not None:
        layers.append(act())
    return nn.Sequential(*layers)


# ResNet-50: bottleneck blocks, stages of 3, 4, 6, 3 blocks (the real depths), width 1/32.

class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, cin, width, stride):
        super().__init__()
        cout = width * self.expansion
        self.conv1 = conv_bn(cin, width, 1, act=nn.ReLU)
        self.conv2 = conv_bn(width, width, 3, stride, act=nn.ReLU)
        self.conv3 = conv_bn(width, cout, 1)
        self.down = conv_bn(cin, cout, 1, stride) if stride != 1 or cin != cout else None

    def forward(self, x):
        identity = x if self.down is None else self.down(x)
        return F.relu(self.conv3(self.conv2(self.conv1(x))) + identity)


class ResNet50(nn.Module):
    def __init__(self, base=2, depths=(3, 4, 6, 3), classes=10):
        super().__init__()
        self.stem = nn.Sequential(conv_bn(3, base, 7, 2, act=nn.ReLU), nn.MaxPool2d(3, 2, 1))
        blocks, cin = [], base
        for i, depth in enumerate(depths):
            width = base * 2 ** i
            for j in range(depth):
                blocks.append(Bottleneck(cin, width, 2 if j == 0 and i > 0 else 1))
                cin = width * Bottleneck.expansion
        self.blocks = nn.Sequential(*blocks)
        self.fc = nn.Linear(cin, classes)

    def forward(self, x):
        x = self.blocks(self.stem(x))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


# EfficientNet-B0: MBConv (expand 1x1, depthwise kxk, squeeze-excitation, project 1x1) with
# SiLU; the seven B0 stages (expansion, kernel, stride) at width 1/8, at most two blocks each.

class SqueezeExcite(nn.Module):
    def __init__(self, channels, squeeze, act, gate):
        super().__init__()
        self.reduce = nn.Conv2d(channels, squeeze, 1)
        self.expand = nn.Conv2d(squeeze, channels, 1)
        self.act, self.gate = act(), gate()

    def forward(self, x):
        s = F.adaptive_avg_pool2d(x, 1)
        return x * self.gate(self.expand(self.act(self.reduce(s))))


class MBConv(nn.Module):
    def __init__(self, cin, cout, expand, k, stride):
        super().__init__()
        mid = cin * expand
        self.expand = conv_bn(cin, mid, 1, act=nn.SiLU) if expand != 1 else nn.Identity()
        self.depthwise = conv_bn(mid, mid, k, stride, groups=mid, act=nn.SiLU)
        self.se = SqueezeExcite(mid, max(1, cin // 4), nn.SiLU, nn.Sigmoid)
        self.project = conv_bn(mid, cout, 1)
        self.residual = stride == 1 and cin == cout

    def forward(self, x):
        y = self.project(self.se(self.depthwise(self.expand(x))))
        return x + y if self.residual else y


class EfficientNetB0(nn.Module):
    # (expansion, kernel, stride, channels at width 1, repeats in B0)
    STAGES = [(1, 3, 1, 16, 1), (6, 3, 2, 24, 2), (6, 5, 2, 40, 2), (6, 3, 2, 80, 3),
              (6, 5, 1, 112, 3), (6, 5, 2, 192, 4), (6, 3, 1, 320, 1)]

    def __init__(self, width=0.125, max_repeats=2, classes=10):
        super().__init__()
        ch = lambda c: max(4, int(c * width))
        self.stem = conv_bn(3, ch(32), 3, 2, act=nn.SiLU)
        blocks, cin = [], ch(32)
        for expand, k, stride, c, repeats in self.STAGES:
            for j in range(min(repeats, max_repeats)):
                blocks.append(MBConv(cin, ch(c), expand, k, stride if j == 0 else 1))
                cin = ch(c)
        self.blocks = nn.Sequential(*blocks)
        self.head = conv_bn(cin, ch(1280), 1, act=nn.SiLU)
        self.fc = nn.Linear(ch(1280), classes)

    def forward(self, x):
        x = self.head(self.blocks(self.stem(x)))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


# ShuffleNetV2: units with channel split (stride 1) or two branches (stride 2), concatenated
# and channel-shuffled in two groups; stages 116/232/464 scaled to 1/8, two units per stage.

def channel_shuffle(x, groups):
    b, c, h, w = x.shape
    return x.view(b, groups, c // groups, h, w).transpose(1, 2).reshape(b, c, h, w)


class ShuffleUnit(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.stride = stride
        half = cout // 2
        if stride > 1:
            self.branch1 = nn.Sequential(conv_bn(cin, cin, 3, stride, groups=cin), conv_bn(cin, half, 1, act=nn.ReLU))
        branch_in = cin if stride > 1 else half
        self.branch2 = nn.Sequential(conv_bn(branch_in, half, 1, act=nn.ReLU),
                                     conv_bn(half, half, 3, stride, groups=half),
                                     conv_bn(half, half, 1, act=nn.ReLU))

    def forward(self, x):
        if self.stride == 1:
            a, b = x.chunk(2, dim=1)
            out = torch.cat((a, self.branch2(b)), dim=1)
        else:
            out = torch.cat((self.branch1(x), self.branch2(x)), dim=1)
        return channel_shuffle(out, 2)


class ShuffleNetV2(nn.Module):
    def __init__(self, channels=(16, 32, 64), repeats=2, stem=8, last=128, classes=10):
        super().__init__()
        self.stem = nn.Sequential(conv_bn(3, stem, 3, 2, act=nn.ReLU), nn.MaxPool2d(3, 2, 1))
        units, cin = [], stem
        for c in channels:
            for j in range(repeats):
                units.append(ShuffleUnit(cin, c, 2 if j == 0 else 1))
                cin = c
        self.units = nn.Sequential(*units)
        self.conv5 = conv_bn(cin, last, 1, act=nn.ReLU)
        self.fc = nn.Linear(last, classes)

    def forward(self, x):
        x = self.conv5(self.units(self.stem(x)))
        return self.fc(x.mean([2, 3]))


# MobileNetV3-Small: the eleven bnecks of the paper (kernel, expansion, out, SE, activation,
# stride) at width 1/8; SE gates with hardsigmoid, activations ReLU or hardswish.

class Bneck(nn.Module):
    def __init__(self, cin, k, mid, cout, se, act, stride):
        super().__init__()
        self.expand = conv_bn(cin, mid, 1, act=act) if mid != cin else nn.Identity()
        self.depthwise = conv_bn(mid, mid, k, stride, groups=mid, act=act)
        self.se = SqueezeExcite(mid, max(4, mid // 4), nn.ReLU, nn.Hardsigmoid) if se else nn.Identity()
        self.project = conv_bn(mid, cout, 1)
        self.residual = stride == 1 and cin == cout

    def forward(self, x):
        y = self.project(self.se(self.depthwise(self.expand(x))))
        return x + y if self.residual else y


class MobileNetV3Small(nn.Module):
    RE, HS = nn.ReLU, nn.Hardswish
    BNECKS = [(3, 16, 16, True, RE, 2), (3, 72, 24, False, RE, 2), (3, 88, 24, False, RE, 1),
              (5, 96, 40, True, HS, 2), (5, 240, 40, True, HS, 1), (5, 240, 40, True, HS, 1),
              (5, 120, 48, True, HS, 1), (5, 144, 48, True, HS, 1), (5, 288, 96, True, HS, 2),
              (5, 576, 96, True, HS, 1), (5, 576, 96, True, HS, 1)]

    def __init__(self, width=0.125, classes=10):
        super().__init__()
        ch = lambda c: max(4, int(c * width))
        self.stem = conv_bn(3, ch(16), 3, 2, act=nn.Hardswish)
        blocks, cin = [], ch(16)
        for k, mid, cout, se, act, stride in self.BNECKS:
            blocks.append(Bneck(cin, k, ch(mid), ch(cout), se, act, stride))
            cin = ch(cout)
        self.blocks = nn.Sequential(*blocks)
        self.last = conv_bn(cin, ch(576), 1, act=nn.Hardswish)
        self.classifier = nn.Sequential(nn.Linear(ch(576), ch(1024)), nn.Hardswish(), nn.Dropout(0.2),
                                        nn.Linear(ch(1024), classes))

    def forward(self, x):
        x = self.last(self.blocks(self.stem(x)))
        return self.classifier(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def randomize_batchnorm(model: nn.Module, generator: torch.Generator) -> None:
    """Seeded running statistics and affine parameters, so that every BatchNorm does something
    (fresh modules hold mean 0, variance 1, scale 1, shift 0)."""
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            n = m.num_features
            m.running_mean.copy_(torch.randn(n, generator=generator) * 0.1)
            m.running_var.copy_(torch.rand(n, generator=generator) + 0.5)
            m.weight.data.copy_(torch.rand(n, generator=generator) + 0.5)
            m.bias.data.copy_(torch.randn(n, generator=generator) * 0.1)
