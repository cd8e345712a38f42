"""mmengine's averaged models (``EMAHook``'s ``ExponentialMovingAverage``,
mmdet's ``ExpMomentumEMA``, ``StochasticWeightAverage``) with SN layers.

They average every floating-point entry of the state (with
``update_buffers=True``) and copy the others only at their first step.
SN's ratio logits, affine parameters and running statistics average as
BN's do; its schedule state must not: ``radius`` (Sparse SN's, which
``SSNRadiusHook`` grows), ``ratio_fixed``/``fixed_ratios`` (ratios fixed
in training: Sparse SN's one-hot vectors, hardening) and the batch
counters. Averaged, the averaged model would mix its logits at a lagging
radius and never fix a ratio the trained model fixed. So after each
update they are copied from the trained model.
"""
from mmengine.model import BaseAveragedModel

from ..models import SwitchableNorm

SN_STATE = ('radius', 'ratio_fixed', 'fixed_ratios', 'num_batches_tracked',
            'nonfinite_batches')


def copy_sn_state(averaged, source) -> None:
    """Copy :data:`SN_STATE` of every SN layer of ``source`` into the layer
    of the same name in ``averaged``."""
    layers = dict(averaged.named_modules())
    for name, module in source.named_modules():
        if isinstance(module, SwitchableNorm):
            for key in SN_STATE:
                value = getattr(module, key)
                if value is not None:
                    target = getattr(layers[name], key)
                    target.copy_(value.to(target.device))


def _averaging_sn_state_as_state(update):

    def update_parameters(self, model):
        update(self, model)
        copy_sn_state(self.module, model)

    update_parameters.__doc__ = update.__doc__
    update_parameters._sn_state_copied = True
    return update_parameters


if not getattr(BaseAveragedModel.update_parameters, '_sn_state_copied', False):
    BaseAveragedModel.update_parameters = _averaging_sn_state_as_state(
        BaseAveragedModel.update_parameters)
