#!/usr/bin/env python3
"""Generate the small, weight-free ONNX fixtures of the ONNX import tests (fixtures/onnx/).

Every weight is an initializer with its shape and an external-data location ("weights.bin")
that does not exist: the importer reads shapes only. Small integer constants (reshape targets,
axes) are stored inline, as exporters do. Node names carry module scopes the way PyTorch's
exporter writes them (/layer1/layer1.0/conv1/Conv), so the importer finds blocks.

    python -m venv /tmp/venv && /tmp/venv/bin/pip install onnx numpy
    /tmp/venv/bin/python xtask/onnx/make_fixtures.py [OUT_DIR]

Fixtures:
  multi_branch_cnn.onnx        opset 13  Inception-style module, conv-BN-ReLU/Clip, SAME padding,
                                         channel Split, Squeeze with axes input, Gemm, Softmax
  residual.onnx                opset 17  ResNet basic blocks: conv-BN(-ReLU), Add, ReLU, downsample
  transformer_block.onnx       opset 17  BERT-style encoder layer: LayerNormalization, decomposed
                                         GELU, attention with a transposed key and a scale
  transformer_block_opset13.onnx opset 13 the same layer with layer norm decomposed
                                         (ReduceMean/Sub/Pow/Sqrt/Div) and a dynamic batch
  dynamic_batch.onnx           opset 17  CNN with a symbolic batch and Shape->Gather->Concat->Reshape
  unsupported.onnx             opset 17  DepthToSpace x2, LRN, a custom-domain op (error listing)
"""

import os
import sys

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


class Graph:
    def __init__(self, name):
        self.name = name
        self.nodes = []
        self.inits = []
        self.offset = 0
        self.names = set()

    def weight(self, name, dims):
        """A float initializer whose data lives in an absent external file."""
        t = TensorProto()
        t.name = name
        t.data_type = TensorProto.FLOAT
        t.dims.extend(dims)
        t.data_location = TensorProto.EXTERNAL
        length = int(np.prod(dims)) * 4
        for k, v in (("location", "weights.bin"), ("offset", str(self.offset)),
                     ("length", str(length))):
            e = t.external_data.add()
            e.key = k
            e.value = v
        self.offset += length
        self.inits.append(t)
        return name

    def const(self, name, array):
        """A small inline initializer."""
        self.inits.append(numpy_helper.from_array(np.asarray(array), name))
        return name

    def op(self, op_type, inputs, scope, outputs=1, domain=None, **attrs):
        base = f"/{scope}/{op_type}" if scope else f"/{op_type}"
        name, k = base, 1
        while name in self.names:
            k += 1
            name = f"{base}_{k}"
        self.names.add(name)
        outs = [f"{name}_output_{i}" for i in range(outputs)]
        kw = {"domain": domain} if domain else {}
        self.nodes.append(helper.make_node(op_type, inputs, outs, name=name, **kw, **attrs))
        return outs[0] if outputs == 1 else outs

    def conv(self, x, cin, cout, k, scope, stride=1, pad=None, bn=True, act="Relu",
             groups=1, auto_pad=None, act_inputs=()):
        kh, kw = (k, k) if isinstance(k, int) else k
        w = self.weight(f"{scope}.weight", [cout, cin // groups, kh, kw])
        inputs = [x, w]
        if not bn:
            inputs.append(self.weight(f"{scope}.bias", [cout]))
        attrs = {"kernel_shape": [kh, kw], "strides": [stride, stride], "group": groups}
        if auto_pad:
            attrs["auto_pad"] = auto_pad
        else:
            ph, pw = (kh // 2, kw // 2) if pad is None else pad
            attrs["pads"] = [ph, pw, ph, pw]
        y = self.op("Conv", inputs, scope + "/conv", **attrs)
        if bn:
            p = [self.weight(f"{scope}.bn.{n}", [cout]) for n in
                 ("weight", "bias", "running_mean", "running_var")]
            y = self.op("BatchNormalization", [y] + p, scope + "/bn", epsilon=1e-3)
        if act:
            y = self.op(act, [y] + list(act_inputs), scope + "/act")
        return y

    def model(self, inputs, outputs, opset, value_info=()):
        g = helper.make_graph(self.nodes, self.name, inputs, outputs, self.inits,
                              value_info=list(value_info))
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)],
                              producer_name="opsched make_fixtures.py")
        m.ir_version = 8
        return m


def tensor(name, dims, elem=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, elem, dims)


def multi_branch_cnn():
    g = Graph("multi_branch_cnn")
    x = g.conv("input", 3, 16, 3, "stem", stride=2)  # 16 x 32 x 32
    # An Inception-style module: four branches, one concat.
    relu6 = (g.const("six.min", np.float32(0)), g.const("six.max", np.float32(6)))
    b1 = g.conv(x, 16, 8, 1, "mixed/branch1")
    b2 = g.conv(x, 16, 8, 1, "mixed/branch2_1")
    b2 = g.conv(b2, 8, 12, 3, "mixed/branch2_2", act="Clip", act_inputs=relu6)
    b3 = g.conv(x, 16, 4, 1, "mixed/branch3_1")
    b3 = g.conv(b3, 4, 8, 5, "mixed/branch3_2", auto_pad="SAME_UPPER")
    b4 = g.op("MaxPool", [x], "mixed/pool", kernel_shape=[3, 3], strides=[1, 1],
              pads=[1, 1, 1, 1])
    b4 = g.conv(b4, 16, 8, 1, "mixed/branch4")
    y = g.op("Concat", [b1, b2, b3, b4], "mixed", axis=1)  # 36 x 32 x 32
    # A channel split: two halves through their own convs, concatenated again.
    s0, s1 = g.op("Split", [y, g.const("split.sizes", np.array([18, 18], np.int64))],
                  "split", outputs=2, axis=1)
    s0 = g.conv(s0, 18, 18, 3, "split/left", bn=False)
    s1 = g.conv(s1, 18, 18, 3, "split/right", stride=1, bn=False, act="Sigmoid")
    y = g.op("Concat", [s0, s1], "split", axis=1)
    y = g.op("GlobalAveragePool", [y], "head")
    y = g.op("Squeeze", [y, g.const("head.axes", np.array([2, 3], np.int64))], "head")
    y = g.op("Gemm", [y, g.weight("fc.weight", [10, 36]), g.weight("fc.bias", [10])],
             "fc", transB=1)
    y = g.op("Softmax", [y], "head")
    return g.model([tensor("input", [1, 3, 64, 64])], [tensor(y, [1, 10])], 13)


def residual():
    g = Graph("residual")
    x = g.conv("input", 3, 16, 3, "stem")

    def block(x, cin, cout, stride, scope):
        y = g.conv(x, cin, cout, 3, f"{scope}/conv1", stride=stride)
        y = g.conv(y, cout, cout, 3, f"{scope}/conv2", act=None)
        if stride != 1 or cin != cout:
            x = g.conv(x, cin, cout, 1, f"{scope}/downsample", stride=stride, act=None)
        y = g.op("Add", [y, x], scope)
        return g.op("Relu", [y], scope + "/relu")

    x = block(x, 16, 16, 1, "layer1/layer1.0")
    x = block(x, 16, 32, 2, "layer2/layer2.0")
    x = block(x, 32, 32, 1, "layer2/layer2.1")
    x = g.op("GlobalAveragePool", [x], "avgpool")
    x = g.op("Flatten", [x], "", axis=1)
    x = g.op("Gemm", [x, g.weight("fc.weight", [10, 32]), g.weight("fc.bias", [10])],
             "fc", transB=1)
    return g.model([tensor("input", [1, 3, 32, 32])], [tensor(x, [1, 10])], 17)


HIDDEN, HEADS, FFN, SEQ = 64, 4, 256, 16


def linear(g, x, cin, cout, scope):
    y = g.op("MatMul", [x, g.weight(f"{scope}.weight", [cin, cout])], scope)
    return g.op("Add", [y, g.weight(f"{scope}.bias", [cout])], scope)


def layer_norm(g, x, scope, decomposed):
    gamma = g.weight(f"{scope}.weight", [HIDDEN])
    beta = g.weight(f"{scope}.bias", [HIDDEN])
    if not decomposed:
        return g.op("LayerNormalization", [x, gamma, beta], scope, axis=-1, epsilon=1e-12)
    mean = g.op("ReduceMean", [x], scope, axes=[-1])
    d = g.op("Sub", [x, mean], scope)
    p = g.op("Pow", [d, g.const(f"{scope}.two", np.float32(2))], scope)
    var = g.op("ReduceMean", [p], scope, axes=[-1])
    v = g.op("Add", [var, g.const(f"{scope}.eps", np.float32(1e-12))], scope)
    s = g.op("Sqrt", [v], scope)
    n = g.op("Div", [d, s], scope)
    n = g.op("Mul", [n, gamma], scope)
    return g.op("Add", [n, beta], scope)


def gelu(g, x, scope):
    """PyTorch's opset < 20 export of nn.GELU: x * 0.5 * (1 + erf(x / sqrt 2))."""
    d = g.op("Div", [x, g.const(f"{scope}.sqrt2", np.float32(1.4142135))], scope)
    e = g.op("Erf", [d], scope)
    a = g.op("Add", [e, g.const(f"{scope}.one", np.float32(1))], scope)
    m = g.op("Mul", [x, a], scope)
    return g.op("Mul", [m, g.const(f"{scope}.half", np.float32(0.5))], scope)


def transformer_block(decomposed, opset, batch):
    g = Graph("transformer_block")
    x = "hidden"
    heads = g.const("heads.shape", np.array([0, 0, HEADS, HIDDEN // HEADS], np.int64))
    merged = g.const("merged.shape", np.array([0, 0, HIDDEN], np.int64))

    def split_heads(t, scope):
        t = g.op("Reshape", [t, heads], scope)
        return g.op("Transpose", [t], scope, perm=[0, 2, 1, 3])

    q = split_heads(linear(g, x, HIDDEN, HIDDEN, "layer0/attention/query"), "layer0/attention/q")
    k = split_heads(linear(g, x, HIDDEN, HIDDEN, "layer0/attention/key"), "layer0/attention/k")
    v = split_heads(linear(g, x, HIDDEN, HIDDEN, "layer0/attention/value"), "layer0/attention/v")
    kt = g.op("Transpose", [k], "layer0/attention", perm=[0, 1, 3, 2])
    s = g.op("MatMul", [q, kt], "layer0/attention")
    s = g.op("Div", [s, g.const("scale", np.float32(4.0))], "layer0/attention")
    p = g.op("Softmax", [s], "layer0/attention", axis=-1)
    c = g.op("MatMul", [p, v], "layer0/attention")
    c = g.op("Transpose", [c], "layer0/attention", perm=[0, 2, 1, 3])
    c = g.op("Reshape", [c, merged], "layer0/attention")
    o = linear(g, c, HIDDEN, HIDDEN, "layer0/attention/output")
    r = g.op("Add", [o, x], "layer0/attention")
    h = layer_norm(g, r, "layer0/attention/norm", decomposed)
    f = linear(g, h, HIDDEN, FFN, "layer0/ffn/fc1")
    f = gelu(g, f, "layer0/ffn/gelu")
    f = linear(g, f, FFN, HIDDEN, "layer0/ffn/fc2")
    r = g.op("Add", [f, h], "layer0/ffn")
    y = layer_norm(g, r, "layer0/ffn/norm", decomposed)
    return g.model([tensor("hidden", [batch, SEQ, HIDDEN])], [tensor(y, [batch, SEQ, HIDDEN])],
                   opset)


def dynamic_batch():
    g = Graph("dynamic_batch")
    x = g.conv("input", 3, 16, 3, "features/features.0")
    x = g.op("MaxPool", [x], "features/features.1", kernel_shape=[2, 2], strides=[2, 2])
    x = g.conv(x, 16, 32, 3, "features/features.2")  # 32 x 16 x 16
    # x.view(x.size(0), -1), as the exporter writes it with a dynamic batch.
    shape = g.op("Shape", [x], "")
    n = g.op("Gather", [shape, g.const("zero", np.array(0, np.int64))], "", axis=0)
    n = g.op("Unsqueeze", [n, g.const("axes0", np.array([0], np.int64))], "")
    target = g.op("Concat", [n, g.const("minus_one", np.array([-1], np.int64))], "", axis=0)
    x = g.op("Reshape", [x, target], "")
    x = g.op("Gemm", [x, g.weight("fc.weight", [10, 32 * 16 * 16]), g.weight("fc.bias", [10])],
             "fc", transB=1)
    return g.model([tensor("input", ["batch", 3, 32, 32])], [tensor(x, ["batch", 10])], 17)


def unsupported():
    g = Graph("unsupported")
    x = g.conv("input", 8, 32, 3, "stem", bn=False)
    x = g.op("DepthToSpace", [x], "up1", blocksize=2)  # 8 x 32 x 32
    x = g.op("LRN", [x], "norm", size=3)
    x = g.conv(x, 8, 32, 3, "mid", bn=False)
    x = g.op("DepthToSpace", [x], "up2", blocksize=2)  # 8 x 64 x 64
    y = g.op("Custom", [x], "custom", domain="com.example")
    m = g.model([tensor("input", [1, 8, 16, 16])], [tensor(y, [1, 8, 64, 64])], 17)
    m.opset_import.append(helper.make_opsetid("com.example", 1))
    m = onnx.shape_inference.infer_shapes(m)
    return m


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
        os.path.dirname(__file__), "..", "..", "fixtures", "onnx")
    os.makedirs(out, exist_ok=True)
    models = {
        "multi_branch_cnn": multi_branch_cnn(),
        "residual": residual(),
        "transformer_block": transformer_block(False, 17, 1),
        "transformer_block_opset13": transformer_block(True, 13, "batch"),
        "dynamic_batch": dynamic_batch(),
        "unsupported": unsupported(),
    }
    for name, m in models.items():
        if name != "unsupported":
            # The checker wants the (absent) weights file; strict shape inference checks the
            # operators, their attributes and the shapes without it.
            onnx.shape_inference.infer_shapes(m, check_type=True, strict_mode=True)
        path = os.path.join(out, name + ".onnx")
        onnx.save_model(m, path)
        print(f"{path}: {os.path.getsize(path)} bytes, {len(m.graph.node)} nodes")


if __name__ == "__main__":
    main()
