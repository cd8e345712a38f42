from .optim_constructor import SNOptimWrapperConstructor
from .runner import SNRunner, trusted_torch_load

__all__ = ['SNOptimWrapperConstructor', 'SNRunner', 'trusted_torch_load']
