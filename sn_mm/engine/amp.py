"""Mixed precision in bfloat16, on the CPU as on GPUs."""
import contextlib

import torch
from mmengine.optim import OptimWrapper
from mmengine.registry import OPTIM_WRAPPERS


@OPTIM_WRAPPERS.register_module()
class BF16OptimWrapper(OptimWrapper):
    """mmengine's ``OptimWrapper`` whose forward runs under
    ``torch.autocast`` in bfloat16 on the model's device: what
    ``tools/train.py --amp`` uses without CUDA, where mmengine's
    ``AmpOptimWrapper`` refuses to start. bfloat16 has float32's range, so
    no loss scaling. SN layers take bfloat16 inputs and compute their
    statistics, ratios and running statistics in float32. Models with
    ops that have no bfloat16 CPU kernel (mmcv's nms, RoIAlign: the
    detectors) stop at their first step with an error that says so.

    Args:
        device_type (str, optional): autocast's device ('cpu', 'cuda');
            default: the device of the model's first parameter.
        Others: as ``OptimWrapper``.
    """

    def __init__(self, device_type=None, **kwargs):
        super().__init__(**kwargs)
        self.device_type = device_type

    @contextlib.contextmanager
    def optim_context(self, model: torch.nn.Module):
        device = self.device_type
        if device is None:
            first = next(model.parameters(), None)
            device = 'cpu' if first is None else first.device.type
        with super().optim_context(model), torch.autocast(
                device, dtype=torch.bfloat16):
            try:
                yield
            except RuntimeError as error:
                if device != 'cpu' or 'BFloat16' not in str(error):
                    raise
                raise RuntimeError(
                    'mixed precision on the CPU (--amp, BF16OptimWrapper) '
                    'runs in bfloat16, and an op of this model has no '
                    'bfloat16 CPU kernel (mmcv\'s nms and RoIAlign in '
                    'detectors have none): train it without --amp on the '
                    f'CPU, or with --amp on a GPU. ({error})') from error
