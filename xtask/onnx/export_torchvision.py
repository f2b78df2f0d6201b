#!/usr/bin/env python3
"""Export torchvision models to weight-free ONNX files for the ONNX import tests.

Writes fixtures/onnx/torchvision/{inception_v3,googlenet,squeezenet1_0,resnet50}.onnx: batch 1,
opset 17, eval mode (so the exporter folds batch norm into the convolutions), exported with
the TorchScript exporter (dynamo=False), whose node names carry the module path
(/layer1/layer1.0/conv1/Conv) that the importer turns into blocks.

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
