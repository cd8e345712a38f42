"""A small CNN on scikit-learn's bundled handwritten digits (1797 8x8
images, nothing downloaded): the real data of the analysis studies."""
import torch
import torch.nn as nn

from ..models import SwitchableNorm
from ..models.switchable_whitening import SwitchableWhitening


class DigitsCNN(nn.Module):
    """conv-norm-ReLU x3 (16, 32, 64 channels), global average pooling, a
    linear classifier; the norm layers named bn1..bn3 (BN), sn1..sn3 (SN,
    with ``ratio_groups`` groups; ``'C'``: one per channel) or sw1..sw3
    (Switchable Whitening, with ``sw_kwargs``, e.g. ``sw_type``,
    ``num_pergroup``), as mmcv names them."""

    WIDTHS = (1, 16, 32, 64)

    def __init__(self, norm: str, ratio_groups=1, **sw_kwargs):
        super().__init__()
        for i in range(1, 4):
            width = self.WIDTHS[i]
            self.add_module(
                f'conv{i}',
                nn.Conv2d(self.WIDTHS[i - 1], width, 3, padding=1, bias=False))
            groups = width if ratio_groups == 'C' else ratio_groups
            if norm == 'BN':
                layer = nn.BatchNorm2d(width)
            elif norm == 'SW':
                layer = SwitchableWhitening(width, **sw_kwargs)
            else:
                layer = SwitchableNorm(width, ratio_groups=groups)
            self.add_module(f'{norm.lower()}{i}', layer)
        self.norm = norm.lower()
        self.fc = nn.Linear(64, 10)

    def forward(self, x):
        for i in range(1, 4):
            x = getattr(self, f'conv{i}')(x)
            x = torch.relu(getattr(self, f'{self.norm}{i}')(x))
            if i == 2:
                x = nn.functional.max_pool2d(x, 2)
        return self.fc(x.mean((2, 3)))


def add_digits_arguments(parser, epochs_help: str) -> None:
    """The flags the digits studies share: --epochs, --batches, --lr,
    --seed."""
    parser.add_argument('--epochs', type=int, default=20, help=epochs_help)
    parser.add_argument('--batches', type=int, nargs='+', default=[2, 32])
    parser.add_argument(
        '--lr',
        type=float,
        default=0.05,
        help='learning rate at batch 32 (scaled linearly)')
    parser.add_argument('--seed', type=int, default=0)


def load_digits_split(seed):
    """(train, test): 1500 and 297 images, shuffled by ``seed``, scaled to
    about zero mean and unit spread."""
    from sklearn.datasets import load_digits
    data = load_digits()
    x = torch.tensor(data.images, dtype=torch.float32).unsqueeze(1) / 16.
    y = torch.tensor(data.target)
    order = torch.randperm(
        len(y), generator=torch.Generator().manual_seed(seed))
    x, y = (x[order] - 0.3) / 0.4, y[order]
    return (x[:1500], y[:1500]), (x[1500:], y[1500:])


def train_digits(model, data, batch, epochs, lr, seed):
    """SGD (momentum 0.9, weight decay 1e-4) on shuffled batches."""
    x, y = data
    gen = torch.Generator().manual_seed(seed)
    optim = torch.optim.SGD(
        model.parameters(), lr=lr, momentum=0.9, weight_decay=1e-4)
    model.train()
    for _ in range(epochs):
        order = torch.randperm(len(y), generator=gen)
        for i in range(0, len(y) - batch + 1, batch):
            idx = order[i:i + batch]
            loss = nn.functional.cross_entropy(model(x[idx]), y[idx])
            optim.zero_grad()
            loss.backward()
            optim.step()
    return model


@torch.no_grad()
def digits_accuracy(model, data):
    """Top-1 accuracy of ``model`` (put in eval mode) on ``data`` (x, y)."""
    model.eval()
    x, y = data
    return (model(x).argmax(1) == y).float().mean().item()
