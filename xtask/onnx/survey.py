#!/usr/bin/env python3
"""Which real models opsched imports and runs: export torchvision's and Hugging Face's models
(random weights, seeded) to ONNX, run each with onnxruntime and with `opsched run --backend cpu`
on the same seeded input, and print one row per model: whether it ran, the largest difference
from onnxruntime relative to the largest output, and both medians of latency on this machine's
CPU (onnxruntime with as many threads as opsched uses).

Needs torch, torchvision, transformers, onnx and onnxruntime (CPU is enough):
    python -m venv /tmp/venv && /tmp/venv/bin/pip install torch torchvision transformers \
        onnx onnxruntime
    cargo build --release
    /tmp/venv/bin/python xtask/onnx/survey.py [--out DIR] [--repeats N] [MODEL ...]

The exports are kept in DIR (default /tmp/opsched-survey) and reused; without MODEL names,
every model below is surveyed. Writes DIR/survey.md (the table) as well as printing it.
"""

import json
import os
import subprocess
import sys
import time
import warnings

import numpy as np
import onnxruntime as ort
import torch

warnings.filterwarnings("ignore")

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
BIN = os.path.join(ROOT, "target", "release", "opsched")

TORCHVISION = [
    "alexnet", "vgg11", "resnet18", "resnext50_32x4d", "wide_resnet50_2", "squeezenet1_1",
    "densenet121", "googlenet", "inception_v3", "mobilenet_v2", "mobilenet_v3_large",
    "mnasnet0_5", "shufflenet_v2_x1_0", "efficientnet_b0", "efficientnet_v2_s",
    "regnet_y_400mf", "convnext_tiny", "vit_b_16", "swin_t", "swin_v2_t", "maxvit_t",
    "fcn_resnet50", "deeplabv3_mobilenet_v3_large", "lraspp_mobilenet_v3_large",
]
SEGMENTATION = {"fcn_resnet50", "deeplabv3_mobilenet_v3_large", "lraspp_mobilenet_v3_large"}
HUGGING_FACE = [
    "bert", "distilbert", "roberta", "gpt2", "t5_encoder", "llama", "clip_text", "clip_vision",
    "vit_hf", "deit", "segformer", "convnextv2", "whisper_encoder", "wav2vec2",
]


class Output(torch.nn.Module):
    """A model's one output tensor (a dict's `out`, or `last_hidden_state`)."""

    def __init__(self, m, key):
        super().__init__()
        self.m, self.key = m, key

    def forward(self, x):
        y = self.m(x)
        return y[self.key] if self.key == "out" else getattr(y, self.key)


def torchvision_model(name):
    import torchvision
    kw = {}
    if name in ("googlenet", "inception_v3"):
        kw = dict(aux_logits=False, init_weights=True)
    if name in SEGMENTATION:
        kw = dict(weights_backbone=None)
        if name != "lraspp_mobilenet_v3_large":
            kw["aux_loss"] = False
    m = torchvision.models.get_model(name, weights=None, **kw).eval()
    side = 299 if name == "inception_v3" else 224
    x = torch.randn(1, 3, side, side, generator=torch.Generator().manual_seed(1))
    return (Output(m, "out") if name in SEGMENTATION else m), x


def hugging_face_model(name):
    import transformers as tf
    two = dict(num_hidden_layers=2)
    make = {
        "bert": lambda: tf.BertModel(tf.BertConfig(**two)),
        "distilbert": lambda: tf.DistilBertModel(tf.DistilBertConfig(n_layers=2)),
        "roberta": lambda: tf.RobertaModel(tf.RobertaConfig(**two)),
        "gpt2": lambda: tf.GPT2Model(tf.GPT2Config(n_layer=2)),
        "t5_encoder": lambda: tf.T5EncoderModel(tf.T5Config(num_layers=2)),
        "llama": lambda: tf.LlamaModel(tf.LlamaConfig(
            num_hidden_layers=2, hidden_size=256, intermediate_size=512,
            num_attention_heads=4, num_key_value_heads=2, vocab_size=1000)),
        "clip_text": lambda: tf.CLIPTextModel(tf.CLIPTextConfig(**two)),
        "clip_vision": lambda: tf.CLIPVisionModel(tf.CLIPVisionConfig(**two)),
        "vit_hf": lambda: tf.ViTModel(tf.ViTConfig(**two)),
        "deit": lambda: tf.DeiTModel(tf.DeiTConfig(**two)),
        "segformer": lambda: tf.SegformerModel(tf.SegformerConfig()),
        "convnextv2": lambda: tf.ConvNextV2Model(tf.ConvNextV2Config()),
        "whisper_encoder": lambda: tf.WhisperModel(
            tf.WhisperConfig(encoder_layers=2, decoder_layers=2)).encoder,
        "wav2vec2": lambda: tf.Wav2Vec2Model(tf.Wav2Vec2Config(**two)),
    }[name]
    m = make().eval()
    g = torch.Generator().manual_seed(1)
    if name == "whisper_encoder":
        x = torch.randn(1, 80, 3000, generator=g)
    elif name == "wav2vec2":
        x = torch.randn(1, 16000, generator=g)
    elif name in ("clip_vision", "vit_hf", "deit", "segformer", "convnextv2"):
        x = torch.randn(1, 3, 224, 224, generator=g)
    else:
        x = torch.randint(0, 1000, (1, 16), generator=g)
    return Output(m, "last_hidden_state"), x


def export(name, out):
    path = os.path.join(out, name + ".onnx")
    torch.manual_seed(0)
    m, x = hugging_face_model(name) if name in HUGGING_FACE else torchvision_model(name)
    # Zero-initialised layers (ViT's head) would make every output zero: give them values.
    with torch.no_grad():
        for p in m.parameters():
            if p.numel() and p.abs().max() == 0:
                p.normal_(0, 0.02)
    np.save(os.path.join(out, name + ".x.npy"), x.numpy())
    if not os.path.exists(path):
        try:
            torch.onnx.export(m, (x,), path, opset_version=17, dynamo=False)
        except Exception:  # e.g. grouped-query attention: only the dynamo exporter has it
            torch.onnx.export(m, (x,), path, opset_version=18, dynamo=True, external_data=False)
    return path, x.numpy()


def ort_run(path, x, threads, repeats):
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    sess = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
    feed = {sess.get_inputs()[0].name: x}
    y = sess.run(None, feed)[0]
    for _ in range(3):
        sess.run(None, feed)
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        sess.run(None, feed)
        times.append(time.perf_counter() - t)
    return y, 1e3 * float(np.median(times))


def main():
    args = sys.argv[1:]
    out, repeats = "/tmp/opsched-survey", 20
    if "--out" in args:
        at = args.index("--out")
        out = args[at + 1]
        del args[at:at + 2]
    if "--repeats" in args:
        at = args.index("--repeats")
        repeats = int(args[at + 1])
        del args[at:at + 2]
    names = args or TORCHVISION + HUGGING_FACE
    os.makedirs(out, exist_ok=True)
    rows = ["| model | runs | max diff / max | ours (ms) | onnxruntime (ms) | ours / ort |",
            "|---|---|---|---|---|---|"]
    print("\n".join(rows), flush=True)
    for name in names:
        try:
            path, x = export(name, out)
        except Exception as e:
            rows.append(f"| {name} | export failed: {type(e).__name__} | | | | |")
            print(rows[-1], flush=True)
            continue
        ours = os.path.join(out, name + ".ours.npy")
        if os.path.exists(ours):
            os.remove(ours)
        run = subprocess.run(
            [BIN, "run", path, "--backend", "cpu", "--algo", "sequential", "--input",
             os.path.join(out, name + ".x.npy"), "--output", ours, "--repeats", str(repeats),
             "--warmup", "3", "--json", "-q"],
            capture_output=True, text=True)
        if run.returncode != 0:
            why = (run.stderr.strip().splitlines() or ["?"])[-1].replace("|", "/")
            rows.append(f"| {name} | no: {why} | | | | |")
            print(rows[-1], flush=True)
            continue
        report = json.loads(run.stdout)
        threads = int(report["device"]["fingerprint"]["sms"])
        want, ort_ms = ort_run(path, x, threads, repeats)
        got = np.load(ours)
        diff = float(np.abs(got - want).max() / max(np.abs(want).max(), 1e-30))
        ms = report["latency"]["median_ms"]
        rows.append(f"| {name} | yes | {diff:.1e} | {ms:.2f} | {ort_ms:.2f} | "
                    f"{ms / ort_ms:.2f} |")
        print(rows[-1], flush=True)
    with open(os.path.join(out, "survey.md"), "w") as f:
        f.write("\n".join(rows) + "\n")


if __name__ == "__main__":
    main()
