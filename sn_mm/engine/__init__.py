from .batch_average import sn_batch_average
from .hooks import (SNBatchAverageHook, SNFuseHook, SNRatioHook,
                    SSNRadiusHook)
from .optim_constructor import SNOptimWrapperConstructor
from .runner import SNRunner, trusted_torch_load

__all__ = [
    'sn_batch_average', 'SNBatchAverageHook', 'SNFuseHook', 'SNRatioHook',
    'SSNRadiusHook', 'SNOptimWrapperConstructor', 'SNRunner',
    'trusted_torch_load'
]
