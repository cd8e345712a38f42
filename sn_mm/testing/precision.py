"""float32 against float64 on inputs far from zero: the errors of a norm
layer, for SN and for PyTorch's own norms on the same inputs."""
from typing import Callable, Dict, List

import torch
import torch.nn as nn

OFFSETS = (1e2, 1e3, 1e4)
SPREADS = (1e-2, 1e-1, 1.)
METRICS = ('train', 'eval', 'running_mean', 'running_var')


def ulps_of_largest(value: torch.Tensor, reference: torch.Tensor) -> float:
    """max |value - reference| in units in the last place, in value's
    dtype, of reference's largest magnitude (near zero a value's own ulps
    would count the cancellation of x - mean, not the kernels); 0 where
    they are empty."""
    value, reference = value.detach(), reference.detach()
    if not value.numel():
        return 0.0
    big = reference.abs().max().to(value.dtype)
    unit = torch.nextafter(big, big + 1) - big
    return float(
        (value.double() - reference.double()).abs().max() / unit.double())


def offset_inputs(shape,
                  offset: float,
                  spread: float,
                  count: int,
                  seed: int = 0) -> List[torch.Tensor]:
    """``count`` float32 inputs of mean about ``offset`` and standard
    deviation ``spread``, the channels' means a spread apart (so that IN,
    LN and BN statistics differ)."""
    gen = torch.Generator().manual_seed(seed)
    inputs = []
    for _ in range(count):
        means = offset + spread * torch.randn(
            1, shape[1], *[1] * (len(shape) - 2), generator=gen)
        inputs.append(torch.randn(shape, generator=gen) * spread + means)
    return inputs


def float32_errors(make: Callable[[], nn.Module],
                   inputs,
                   offset: float,
                   spread: float,
                   start: str = 'data') -> Dict[str, float]:
    """A layer's float32 errors against its float64 copy: training steps on
    ``inputs[:-1]``, then eval on ``inputs[-1]``. The running statistics
    start at the data's mean and variance (``start='data'``) or where the
    layer starts them (``'layer'``: 0 and 1, so that in eval after a few
    steps the output is far from zero and magnifies any error of the
    variance). ``train``/``eval``: the largest absolute output error;
    ``running_mean``/``running_var``: the largest relative error after
    training (0 for layers without them)."""
    m32 = make()
    if start == 'data' and getattr(m32, 'running_mean', None) is not None:
        with torch.no_grad():
            m32.running_mean.fill_(offset)
            m32.running_var.fill_(spread**2)
    m64 = make().double()
    m64.load_state_dict(m32.state_dict())
    m32.train()
    m64.train()
    with torch.no_grad():
        train = max((m32(x).double() - m64(x.double())).abs().max().item()
                    for x in inputs[:-1])
        running = [0., 0.]
        if getattr(m32, 'running_mean', None) is not None:
            running = [((a.double() - b).abs() / b.abs()).max().item()
                       for a, b in ((m32.running_mean, m64.running_mean),
                                    (m32.running_var, m64.running_var))]
        x = inputs[-1]
        evaluated = (m32.eval()(x).double() -
                     m64.eval()(x.double())).abs().max().item()
    return dict(zip(METRICS, [train, evaluated, *running]))


def pytorch_norms(channels: int) -> Dict[str, Callable[[], nn.Module]]:
    """PyTorch's BN, IN and LN (GroupNorm with one group): the yardsticks."""
    return dict(
        BN=lambda: nn.BatchNorm2d(channels),
        IN=lambda: nn.InstanceNorm2d(channels, affine=True),
        LN=lambda: nn.GroupNorm(1, channels))
