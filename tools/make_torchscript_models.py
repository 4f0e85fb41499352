"""Makes the TorchScript test models under fixtures/models/torchscript/ from timm and torchvision.

Each module is a tiny configuration of a real library model, scripted with torch.jit.script and saved with
torch.jit.save, so memgate's TorchScript path can be checked against memgate's own zoo fixture of the same
architecture (tests/models/torchscript_test.cpp and the CPU memory suite):

- vit_tiny_timm.pt: timm's VisionTransformer with the geometry of fixtures/models/vit_tiny_full.yaml
  (img 40, patch 8, width 64, depth 4, 4 heads, 5 classes);
- resnet18_w8_torchvision.pt: torchvision's ResNet-18 with every width divided by 8 (stem 8, stages 8/16/32/64),
  built by torchvision's own ResNet, BasicBlock and _make_layer, 5 classes, the geometry of
  fixtures/models/resnet_tiny_classify.yaml;
- examples/downstream/fixtures/models/torchscript/small_cnn.pt: a small torch.nn CNN (conv-BN-ReLU x2, pooling,
  a linear head), the example project's TorchScript fixture;
- token_lm_traced.pt: a tiny pre-norm language model (token embedding, RMSNorm, attention with interleaved rotary
  embeddings, a SwiGLU MLP, logits over the vocabulary), saved with torch.jit.trace as course and research code is:
  its graph keeps tensor constants (the sizes and scalars it divides by, as 0-dim tensors), which an estimate on the
  Meta device must leave on the CPU.

Run it through tools/make_torchscript_models.sh, which installs the pinned timm and torchvision beside the
project's torch. Weights are seeded, but torch.jit.save writes a fresh serialization id into each file, so a regenerated file
has another content hash: its fixtures then ask for new baselines (ctest --preset update-baselines).
"""

import argparse
import pathlib

import timm
import torch
import torchvision
from torch import nn
from torchvision.models.resnet import BasicBlock


class NarrowResNet(torchvision.models.ResNet):
    """torchvision's ResNet with its stem, stages and head `width` wide instead of 64 (stages width x 1/2/4/8)."""

    def __init__(self, layers, width, num_classes):
        super().__init__(BasicBlock, layers, num_classes=num_classes)
        self.inplanes = width
        self.conv1 = nn.Conv2d(3, width, kernel_size=7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.layer1 = self._make_layer(BasicBlock, width, layers[0])
        self.layer2 = self._make_layer(BasicBlock, width * 2, layers[1], stride=2)
        self.layer3 = self._make_layer(BasicBlock, width * 4, layers[2], stride=2)
        self.layer4 = self._make_layer(BasicBlock, width * 8, layers[3], stride=2)
        self.fc = nn.Linear(width * 8, num_classes)


def small_cnn(classes=4):
    """A small CNN of torch.nn modules: the downstream example's model exported from Python."""
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
        nn.Conv2d(8, 16, 3, stride=2, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, classes))


class TokenLM(nn.Module):
    """A tiny pre-norm transformer LM written the way hand-rolled course models are (no torch.nn.functional
    attention): RMSNorm through a division by the width, rotary embeddings through a view of pairs, a SwiGLU MLP."""

    def __init__(self, vocab=64, width=32, heads=4, context=16, hidden=64, eps=1e-5):
        super().__init__()
        self.heads, self.eps, self.width = heads, eps, width
        self.embed = nn.Embedding(vocab, width)
        self.norm1 = nn.Parameter(torch.ones(width))
        self.norm2 = nn.Parameter(torch.ones(width))
        self.qkv = nn.Linear(width, 3 * width, bias=False)
        self.out = nn.Linear(width, width, bias=False)
        self.w1 = nn.Linear(width, hidden, bias=False)
        self.w3 = nn.Linear(width, hidden, bias=False)
        self.w2 = nn.Linear(hidden, width, bias=False)
        self.head = nn.Linear(width, vocab, bias=False)
        d = width // heads
        angle = torch.outer(torch.arange(context).float(), 1.0 / (10000 ** (torch.arange(0, d, 2).float() / d)))
        self.register_buffer("cos", angle.repeat_interleave(2, dim=-1).cos(), persistent=False)
        self.register_buffer("sin", angle.repeat_interleave(2, dim=-1).sin(), persistent=False)

    def rms(self, x, weight):
        return x / torch.sqrt((x * x).sum(-1, keepdim=True) / self.width + self.eps) * weight

    def rope(self, x):
        pairs = x.view(*x.shape[:-1], -1, 2)
        rotated = torch.stack((-pairs[..., 1], pairs[..., 0]), dim=-1).view(*x.shape)
        t = x.shape[-2]
        return x * self.cos[:t] + rotated * self.sin[:t]

    def forward(self, tokens):
        b, t = tokens.shape
        x = self.embed(tokens)
        q, k, v = self.qkv(self.rms(x, self.norm1)).view(b, t, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        q, k = self.rope(q), self.rope(k)
        scores = (q @ k.transpose(-1, -2)) / (q.shape[-1] ** 0.5)
        mask = torch.tril(torch.ones(t, t, dtype=torch.bool, device=tokens.device))
        weights = scores.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        x = x + self.out((weights @ v).transpose(1, 2).reshape(b, t, -1))
        h = self.rms(x, self.norm2)
        gate = self.w1(h)
        x = x + self.w2(gate * torch.sigmoid(gate) * self.w3(h))
        return self.head(x)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path(__file__).resolve().parent.parent
                        / "fixtures" / "models" / "torchscript")
    parser.add_argument("--example-out", type=pathlib.Path, default=pathlib.Path(__file__).resolve().parent.parent
                        / "examples" / "downstream" / "fixtures" / "models" / "torchscript")
    parser.add_argument("--only", action="append", default=[],
                        help="make only this module (repeat it); the others keep their files and content hashes")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    args.example_out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)

    vit = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=40, patch_size=8, embed_dim=64,
                            depth=4, num_heads=4, num_classes=5)
    resnet = NarrowResNet([2, 2, 2, 2], width=8, num_classes=5)
    lm = TokenLM().train()
    script = torch.jit.script
    modules = {"vit_tiny_timm": (args.out, vit, script),
               "resnet18_w8_torchvision": (args.out, resnet, script),
               "small_cnn": (args.example_out, small_cnn(), script),
               "token_lm_traced": (args.out, lm,
                                   lambda m: torch.jit.trace(m, (torch.randint(0, 64, (2, 16)),), check_trace=False))}
    unknown = sorted(set(args.only) - modules.keys())
    if unknown:
        parser.error(f"--only {', '.join(unknown)}: not one of {', '.join(modules)}")
    for name, (folder, model, export) in modules.items():
        if args.only and name not in args.only:
            continue
        scripted = export(model.train())
        path = folder / f"{name}.pt"
        torch.jit.save(scripted, str(path))
        params = sum(p.numel() for p in model.parameters())
        print(f"{path}: {params} parameters, {path.stat().st_size} bytes "
              f"(torch {torch.__version__}, timm {timm.__version__}, torchvision {torchvision.__version__})")


if __name__ == "__main__":
    main()
