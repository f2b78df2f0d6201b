#!/usr/bin/env python3
"""Export torchvision models to weight-free ONNX files for the ONNX import tests.

Writes fixtures/onnx/torchvision/{inception_v3,googlenet,squeezenet1_0,resnet50}.onnx: batch 1,
opset 17, eval mode (so the exporter folds batch norm into the convolutions), exported with
the TorchScript exporter (dynamo=False), whose node names carry the module path
(/layer1/layer1.0/conv1/Conv) that the importer turns into blocks.

Also writes squeezenet_ios.onnx: IOS's SqueezeNet 1.0 variant (the zoo's `squeezenet`: a
bypass sum after every fire module, through a 1x1 projection conv where the channel counts
differ; a stem conv padded by 3; floor-mode pools; no flatten), written in PyTorch here since
torchvision's SqueezeNet has no bypasses.

Weights are stripped: every tensor of 1 KiB or more is moved to an external data file that is
then deleted, so the files keep only the initializers' names and shapes (small shape constants
stay inline). The importer never needs the weights.

Needs torch, torchvision and onnx (CPU is enough):
    python -m venv /tmp/venv && /tmp/venv/bin/pip install torch torchvision onnx
    /tmp/venv/bin/python xtask/onnx/export_torchvision.py [OUT_DIR]
"""

import os
import sys

import onnx
import torch
import torchvision
from torch import nn


def conv_bn_relu(cin, cout, k, stride=1, pad=None):
    pad = k // 2 if pad is None else pad
    return nn.Sequential(
        nn.Conv2d(cin, cout, k, stride, pad, bias=False), nn.BatchNorm2d(cout), nn.ReLU()
    )


class FireIOS(nn.Module):
    """IOS's fire module: squeeze, expand 3x3 and 1x1, concat, bypass sum."""

    def __init__(self, cin, squeeze, expand):
        super().__init__()
        self.squeeze = conv_bn_relu(cin, squeeze, 1)
        self.expand3x3 = conv_bn_relu(squeeze, expand, 3)
        self.expand1x1 = conv_bn_relu(squeeze, expand, 1)
        self.bypass = conv_bn_relu(cin, 2 * expand, 1) if cin != 2 * expand else None

    def forward(self, x):
        y = self.squeeze(x)
        y = torch.cat([self.expand3x3(y), self.expand1x1(y)], 1)
        return y + (self.bypass(x) if self.bypass is not None else x)


class SqueezeNetIOS(nn.Module):
    def __init__(self):
        super().__init__()
        self.front = nn.Sequential(conv_bn_relu(3, 96, 7, 2, 3), nn.MaxPool2d(3, 2))
        self.fire2 = FireIOS(96, 16, 64)
        self.fire3 = FireIOS(128, 16, 64)
        self.fire4 = FireIOS(128, 32, 128)
        self.pool4 = nn.MaxPool2d(3, 2)
        self.fire5 = FireIOS(256, 32, 128)
        self.fire6 = FireIOS(256, 48, 192)
        self.fire7 = FireIOS(384, 48, 192)
        self.fire8 = FireIOS(384, 64, 256)
        self.pool8 = nn.MaxPool2d(3, 2)
        self.fire9 = FireIOS(512, 64, 256)
        self.tail = nn.Sequential(conv_bn_relu(512, 1000, 1), nn.AdaptiveAvgPool2d(1))

    def forward(self, x):
        x = self.fire4(self.fire3(self.fire2(self.front(x))))
        x = self.fire8(self.fire7(self.fire6(self.fire5(self.pool4(x)))))
        return self.tail(self.fire9(self.pool8(x)))

MODELS = {
    # name: (constructor, input side)
    "inception_v3": (
        lambda: torchvision.models.inception_v3(
            weights=None, aux_logits=False, init_weights=False
        ),
        299,
    ),
    "googlenet": (
        lambda: torchvision.models.googlenet(
            weights=None, aux_logits=False, init_weights=False
        ),
        224,
    ),
    "squeezenet1_0": (lambda: torchvision.models.squeezenet1_0(weights=None), 224),
    "resnet50": (lambda: torchvision.models.resnet50(weights=None), 224),
    "squeezenet_ios": (SqueezeNetIOS, 224),
}


def strip_weights(path):
    """Move the weights to an external file and delete it: only shapes remain."""
    model = onnx.load(path)
    data = os.path.basename(path) + ".weights"
    onnx.save_model(
        model,
        path,
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location=data,
        size_threshold=1024,
    )
    os.remove(os.path.join(os.path.dirname(path), data))


def main():
    out_dir = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        os.path.dirname(__file__), "..", "..", "fixtures", "onnx", "torchvision"
    )
    os.makedirs(out_dir, exist_ok=True)
    torch.manual_seed(0)
    for name, (make, side) in MODELS.items():
        model = make().eval()
        x = torch.randn(1, 3, side, side)
        path = os.path.join(out_dir, name + ".onnx")
        with torch.no_grad():
            torch.onnx.export(
                model,
                (x,),
                path,
                dynamo=False,
                opset_version=17,
                input_names=["input"],
                output_names=["logits"],
                do_constant_folding=True,
            )
        strip_weights(path)
        print(f"{path}: {os.path.getsize(path)} bytes, torch {torch.__version__}, "
              f"torchvision {torchvision.__version__}")


if __name__ == "__main__":
    main()
