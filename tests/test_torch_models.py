"""Models shared by the torch test modules (defined here, no torchvision), and their sanity checks.

``resnet18`` reproduces torchvision's ResNet-18 layer for layer (11,689,512 parameters).
"""
import os

import pytest

from support.torch_models import shared_classes

torch = pytest.importorskip("torch") if os.environ.get("CI") != "true" else __import__("torch")
nn = torch.nn
F = torch.nn.functional


# ----------------------------------------------------------------------------- ResNet-18
class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, inplanes, planes, stride=1, downsample=None):
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = downsample
        self.stride = stride

    def forward(self, x):
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        out += identity
        return self.relu(out)


class ResNet(nn.Module):
    def __init__(self, layers=(2, 2, 2, 2), num_classes=1000):
        super().__init__()
        self.inplanes = 64
        self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        self.layer1 = self._make_layer(64, layers[0])
        self.layer2 = self._make_layer(128, layers[1], 2)
        self.layer3 = self._make_layer(256, layers[2], 2)
        self.layer4 = self._make_layer(512, layers[3], 2)
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(512, num_classes)

    def _make_layer(self, planes, blocks, stride=1):
        downsample = None
        if stride != 1 or self.inplanes != planes:
            downsample = nn.Sequential(nn.Conv2d(self.inplanes, planes, 1, stride, bias=False),
                                       nn.BatchNorm2d(planes))
        layers = [BasicBlock(self.inplanes, planes, stride, downsample)]
        self.inplanes = planes
        layers += [BasicBlock(planes, planes) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def forward(self, x):
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        x = torch.flatten(self.avgpool(x), 1)
        return self.fc(x)


def resnet18():
    return ResNet()


# ----------------------------------------------------------------------------- peers.md models
# One Linear(100, 100, bias=False) held by three Block parents (shared with the core tests).
Block, Shared = shared_classes(torch)


class Attn(nn.Module):
    """Functional attention with no submodules: 2 x 64 x 64 x 32 MACs per product."""

    def forward(self, q):
        return torch.softmax(q @ q.transpose(-1, -2), dim=-1) @ q


class Boom(nn.Module):
    def forward(self, x):
        raise RuntimeError("boom")


class BoomNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.boom = Boom()

    def forward(self, x):
        return self.boom(self.lin(x))


# ----------------------------------------------------------------------------- transformer
class CausalSelfAttention(nn.Module):
    """GPT-style attention: fused qkv Linear, manual causal masking, output Linear."""

    def __init__(self, dim, heads, sdpa=False):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.sdpa = sdpa

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        if self.sdpa:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / (k.size(-1) ** 0.5))
            mask = torch.ones(t, t, dtype=torch.bool).tril()
            att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
            y = att @ v
        return self.proj(y.transpose(1, 2).reshape(b, t, c))


class MLP(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.fc = nn.Linear(dim, 4 * dim)
        self.act = nn.GELU()
        self.out = nn.Linear(4 * dim, dim)

    def forward(self, x):
        return self.out(self.act(self.fc(x)))


class GPTBlock(nn.Module):
    def __init__(self, dim=32, heads=4, sdpa=False):
        super().__init__()
        self.ln_1 = nn.LayerNorm(dim)
        self.attn = CausalSelfAttention(dim, heads, sdpa)
        self.ln_2 = nn.LayerNorm(dim)
        self.mlp = MLP(dim)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class Conv1D(nn.Module):
    """GPT-2's Conv1D from Hugging Face transformers: a Linear with a transposed weight."""

    def __init__(self, nf, nx):
        super().__init__()
        self.nf = nf
        self.weight = nn.Parameter(torch.randn(nx, nf) * 0.02)
        self.bias = nn.Parameter(torch.zeros(nf))

    def forward(self, x):
        size_out = x.size()[:-1] + (self.nf,)
        x = torch.addmm(self.bias, x.view(-1, x.size(-1)), self.weight)
        return x.view(size_out)


def fcm_counts(fn, *args):
    """FlopCounterMode's per-module totals for ``fn(*args)``: {module FQN: FLOPs}."""
    from torch.utils.flop_counter import FlopCounterMode

    with FlopCounterMode(display=False) as counter:
        fn(*args)
    return {name: sum(ops.values()) for name, ops in counter.get_flop_counts().items()}


def test_resnet18_has_torchvisions_parameter_count():
    assert sum(p.numel() for p in resnet18().parameters()) == 11_689_512


def test_shared_model_has_one_linear():
    model = Shared()
    assert model.a.lin is model.b.lin is model.c.lin
    assert sum(p.numel() for p in model.parameters()) == 10_000
