"""A Python project's own model, as memgate gates it (ci/pip-install.sh, ci/downstream.sh): a small CNN built by a
function of the project's, named by my_model.yaml. EXAMPLE_GROW_MODEL=1 widens its hidden layer, as a change to the
project's code that grows memory would: the gate must fail."""
import os

from torch import nn


def build(width=16, num_classes=5):
    hidden = 4 * width if os.environ.get("EXAMPLE_GROW_MODEL") == "1" else width
    return nn.Sequential(nn.Conv2d(3, width, 3, padding=1), nn.ReLU(), nn.Conv2d(width, hidden, 3, padding=1),
                         nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(hidden, num_classes))
