"""The models of tools/gpu_reference.py's comparison, built as their users build them: timm's and torchvision's own
constructors with random weights (nothing downloaded), for memgate's Python fixtures (arch: python) and for the plain
PyTorch run beside them."""


def timm_model(name: str, num_classes: int = 1000):
    """timm.create_model(name), e.g. vit_large_patch16_224, without pretrained weights."""
    import timm

    return timm.create_model(name, pretrained=False, num_classes=num_classes)


def torchvision_model(name: str, num_classes: int = 1000):
    """torchvision.models.<name>, e.g. resnet50, without weights."""
    import torchvision

    return getattr(torchvision.models, name)(weights=None, num_classes=num_classes)
