"""SN's six kernels from the native CPU extension (``csrc/sn_kernels.cpp``,
built as ``sn_mm._ext`` by ``pip install -e .``), with the arguments of
their PyTorch versions in ``torch_kernels.py``. float32/float64 CPU tensors
only; :func:`sn_mm.ops.select_kernels` sends everything else elsewhere."""
from typing import Tuple

from torch import Tensor

try:
    from .. import _ext
except ImportError:  # not built (SN_MM_NO_EXT=1): PyTorch kernels only
    _ext = None


def available() -> bool:
    return _ext is not None


def row_moments(x: Tensor, correction: int) -> Tuple[Tensor, Tensor]:
    return tuple(_ext.row_moments(x, correction))


def moment_reductions(mean_in: Tensor, var_in: Tensor) -> Tuple[Tensor, ...]:
    return tuple(_ext.moment_reductions(mean_in, var_in))


def normalize(x, mean_in, var_in, wm_in, wv_in, mu_n, var_n, mu_c, var_c,
              weight, bias, eps):
    return tuple(_ext.normalize(x, mean_in, var_in, float(wm_in),
                                float(wv_in), mu_n, var_n, mu_c, var_c,
                                weight, bias, eps))


def row_grad_sums(grad: Tensor, x: Tensor,
                  mean_in: Tensor) -> Tuple[Tensor, Tensor]:
    return tuple(_ext.row_grad_sums(grad, x, mean_in))


def grad_reductions(sum_g, sum_gxc, mu, rstd, weight, mean_in, var_in,
                    mean_ln, mean_c):
    return tuple(_ext.grad_reductions(sum_g, sum_gxc, mu, rstd, weight,
                                      mean_in, var_in, mean_ln, mean_c))


def input_grad(grad, x, sum_g, sum_gxc, mu, rstd, weight, mean_in, wm_in,
               wv_in, dvar_n, dmean_n, center_n, dvar_c, dmean_c, center_c,
               correction):
    return _ext.input_grad(grad, x, sum_g, sum_gxc, mu, rstd, weight,
                           mean_in, float(wm_in), float(wv_in), dvar_n,
                           dmean_n, center_n, dvar_c, dmean_c, center_c,
                           correction)


# -- the fused operator ------------------------------------------------------
# Loading the extension registers sn_mm::switchable_norm (torch.library): SN
# on one device, one call per pass, autograd in C++. Its fake (meta)
# implementation lets tracers that meet it know the output without data.
if _ext is not None:
    import torch

    @torch.library.register_fake('sn_mm::switchable_norm')
    def _switchable_norm_fake(x, weight, bias, mean_logits, var_logits,
                              running_mean, running_var, num_batches_tracked,
                              ratio_fixed, fixed_ratios, training, momentum,
                              eps, unbiased, ratios_given):
        return torch.empty_like(x, memory_format=torch.contiguous_format)

    switchable_norm_op = torch.ops.sn_mm.switchable_norm
else:
    switchable_norm_op = None
