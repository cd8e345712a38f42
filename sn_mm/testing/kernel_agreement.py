"""SN's fused Triton kernels against its PyTorch kernels, layer by layer:
what the tests run in Triton's interpreter and ``make gpu-check`` runs on a
GPU. Each case builds two identical layers with non-trivial state, runs two
training (or eval) steps on each, and compares outputs, the input gradient,
every parameter gradient, the running statistics and the batch counter."""
import itertools

import torch

from ..models import SwitchableNorm
from ..ops.agreement import worst_difference

# (shape, channels_last): contiguous and channels_last maps, RoI-sized rows,
# long rows (split across programs), one position, 2D, 5D.
SHAPES = [((4, 6, 5, 3), False), ((4, 6, 5, 3), True), ((3, 5), False),
          ((2, 5, 1, 1), False), ((2, 3, 40, 50), False),
          ((6, 8, 7, 7), False), ((2, 3, 2, 2, 3), False)]
# Layer options beyond the defaults; group SN where the channels divide.
VARIANTS = [
    dict(),
    dict(momentum=None),
    dict(fixed=True),
    dict(ratio_fn='sparsestmax'),
    dict(ratio_groups=2),
    dict(ratio_groups=2, fixed=True)
]


def make_layer(c, using_bn=True, kernels=None, fixed=False, seed=0, **kwargs):
    """An SN layer with non-trivial parameters and running statistics
    (``fixed``: its mean ratios fixed)."""
    gen = torch.Generator().manual_seed(seed)
    layer = SwitchableNorm(c, using_bn=using_bn, kernels=kernels, **kwargs)
    with torch.no_grad():
        layer.weight.copy_(torch.rand(c, generator=gen) + 0.5)
        layer.bias.copy_(torch.randn(c, generator=gen))
        layer.mean_weight.copy_(
            torch.randn(layer.mean_weight.shape, generator=gen))
        layer.var_weight.copy_(
            torch.randn(layer.var_weight.shape, generator=gen))
        if using_bn:
            layer.running_mean.copy_(torch.randn(c, generator=gen))
            layer.running_var.copy_(torch.rand(c, generator=gen) + 0.5)
        if fixed:  # the mean ratios fixed (group SN: the first group's)
            k = layer.fixed_ratios.shape[-1]
            at = (0, 0) if layer.ratio_groups > 1 else 0
            layer.ratio_fixed[at] = True
            layer.fixed_ratios[at] = torch.tensor([0.2, 0.8, 0.][:k])
        if layer.radius is not None:
            layer.radius.fill_(0.3)
    return layer


def _run(layer, x, grad):
    x = x.clone().requires_grad_()
    for _ in range(2):
        y = layer(x)
        y.backward(grad)
    out = dict(output=y, input_grad=x.grad)
    out.update({f'{n} grad': p.grad for n, p in layer.named_parameters()})
    out.update({n: b for n, b in layer.named_buffers() if b is not None})
    return out, y


def compare_case(device, shape, channels_last, using_bn, training, dtype,
                 variant):
    """Worst relative difference of one case; raises AssertionError naming
    the case and the quantity where it exceeds the dtype's tolerance or a
    layout or dtype differs."""
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(shape, generator=gen) * 2 + 3
    grad = torch.randn(shape, generator=gen)
    if channels_last:
        x = x.to(memory_format=torch.channels_last)
        grad = grad.to(memory_format=torch.channels_last)
    x, grad = x.to(device, dtype), grad.to(device, dtype)
    runs = []
    for kernels in ('triton', 'torch'):
        layer = make_layer(shape[1], using_bn, kernels, **variant).to(device)
        runs.append(_run(layer.train(training), x, grad))
    (fused, y_fused), (ref, _) = runs
    case = (f'shape={shape} channels_last={channels_last} '
            f'using_bn={using_bn} training={training} dtype={dtype} '
            f'{variant}')
    if channels_last and not y_fused.is_contiguous(
            memory_format=torch.channels_last):
        raise AssertionError(f'{case}: output not channels_last')
    tol = 2e-4 if dtype == torch.float32 else 3e-2
    return worst_difference(fused, ref, tol, case)


def all_cases(dtypes=(torch.float32, torch.bfloat16)):
    """Every case of SHAPES x BN or not x train/eval x dtypes x VARIANTS, as
    :func:`compare_case`'s arguments after the device."""
    return [(shape, cl, using_bn, training, dtype, variant)
            for (shape,
                 cl), using_bn, training, dtype, variant in itertools.product(
                     SHAPES, (True, False), (True, False), dtypes, VARIANTS)
            if shape[1] % variant.get('ratio_groups', 1) == 0]
