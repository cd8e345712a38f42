from .amp import BF16OptimWrapper
from .batch_average import BatchAverageProgress, sn_batch_average
from .ema import copy_sn_state
from .hooks import SNBatchAverageHook, SNFuseHook, SNRatioHook, SSNRadiusHook
from .optim_constructor import SNOptimWrapperConstructor
from .pretrained import SNPretrainedInit, sn_state_from
from .runner import SNRunner, trusted_torch_load

__all__ = [
    'BF16OptimWrapper', 'BatchAverageProgress', 'copy_sn_state',
    'sn_batch_average', 'SNBatchAverageHook', 'SNFuseHook', 'SNRatioHook',
    'SSNRadiusHook', 'SNOptimWrapperConstructor', 'SNPretrainedInit',
    'SNRunner', 'sn_state_from', 'trusted_torch_load'
]
