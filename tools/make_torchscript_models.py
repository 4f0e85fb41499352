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
  a linear head), the example project's TorchScript fixture.

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


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path(__file__).resolve().parent.parent
                        / "fixtures" / "models" / "torchscript")
    parser.add_argument("--example-out", type=pathlib.Path, default=pathlib.Path(__file__).resolve().parent.parent
                        / "examples" / "downstream" / "fixtures" / "models" / "torchscript")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    args.example_out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)

    vit = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=40, patch_size=8, embed_dim=64,
                            depth=4, num_heads=4, num_classes=5)
    resnet = NarrowResNet([2, 2, 2, 2], width=8, num_classes=5)
    for folder, name, model in ((args.out, "vit_tiny_timm", vit), (args.out, "resnet18_w8_torchvision", resnet),
                                (args.example_out, "small_cnn", small_cnn())):
        scripted = torch.jit.script(model.train())
        path = folder / f"{name}.pt"
        torch.jit.save(scripted, str(path))
        params = sum(p.numel() for p in model.parameters())
        print(f"{path}: {params} parameters, {path.stat().st_size} bytes "
              f"(torch {torch.__version__}, timm {timm.__version__}, torchvision {torchvision.__version__})")


if __name__ == "__main__":
    main()
