"""Call trees built by hand for the report tests."""
from __future__ import annotations

from typing import NamedTuple

from tracetorch.records.tree import CallNode

__all__ = ("EncoderTree", "encoder_tree", "add_flops")


class EncoderTree(NamedTuple):
    """The nodes of :func:`encoder_tree`, in the order it creates them."""

    root: CallNode
    model: CallNode
    encoder: CallNode
    fc: CallNode
    relu: CallNode
    head: CallNode


def encoder_tree() -> EncoderTree:
    """A fresh tree with no times or FLOPs yet::

        Sequential ""        (m0)
          encoder Encoder    (m1)
            0 Linear         (m2)
            1 ReLU           (m3)
          head Linear        (m4)
    """
    root = CallNode.root()
    model = root.child("", "Sequential", "m0")
    encoder = model.child("encoder", "Encoder", "m1")
    fc = encoder.child("0", "Linear", "m2")
    relu = encoder.child("1", "ReLU", "m3")
    head = model.child("head", "Linear", "m4")
    for leaf in (fc, relu, head):
        leaf.flops_source = "rule"  # as the engine marks layers whose FLOPs a rule gives
    return EncoderTree(root, model, encoder, fc, relu, head)


def add_flops(tree: EncoderTree) -> None:
    """Round FLOPs on ``tree``'s leaves: ``0`` 2000 (GEMM, 1000 MACs), ``1`` 100, ``head`` 600
    (GEMM, 300 MACs)."""
    tree.fc.flops = tree.fc.gemm_flops = 2000
    tree.fc.macs = 1000
    tree.relu.flops = 100
    tree.head.flops = tree.head.gemm_flops = 600
    tree.head.macs = 300
