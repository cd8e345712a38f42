"""An optimizer-wrapper constructor that knows SN layers are norm layers."""
import logging
from typing import List, Optional, Union

import torch.nn as nn
from mmengine.logging import print_log
from mmengine.optim import DefaultOptimWrapperConstructor
from mmengine.registry import OPTIM_WRAPPER_CONSTRUCTORS

from ..models import SwitchableNorm, SwitchableWhitening

# The ratio logits: SN's, and Switchable Whitening's importance weights.
RATIO_PARAMS = ('mean_weight', 'var_weight', 'sw_mean_weight', 'sw_var_weight')


@OPTIM_WRAPPER_CONSTRUCTORS.register_module()
class SNOptimWrapperConstructor(DefaultOptimWrapperConstructor):
    """mmengine's default constructor, with SN, SyncSN, SW and SyncSW as norm
    layers.

    mmengine recognises norm layers by type (BN, IN, GN, LN), so
    ``norm_decay_mult`` silently misses SN's ``weight`` and ``bias``. Here
    every ``paramwise_cfg`` option keeps its mmengine meaning, and for SN
    layers:

    - ``weight`` and ``bias`` follow the norm rules: ``norm_decay_mult``
      applies and ``bias_lr_mult`` does not (as for ``_BatchNorm``).
    - ``mean_weight`` / ``var_weight`` (the ratio logits) take
      ``ratio_lr_mult`` and ``ratio_decay_mult``; without the latter they
      follow the norm rules too. Sparse SN layers (``ratio_fn=
      'sparsestmax'``) have the same parameters and follow the same rules
      (SSN's authors train them at a tenth of the LR without decay:
      ``ratio_lr_mult=0.1, ratio_decay_mult=0``). Switchable Whitening's
      importance weights (``sw_mean_weight`` / ``sw_var_weight``) are ratio
      logits too, and its ``weight`` and ``bias`` norm parameters.
    - ``custom_keys`` still override everything, as in mmengine.

    Example::

        optim_wrapper = dict(
            constructor='SNOptimWrapperConstructor',
            optimizer=dict(type='SGD', lr=0.02, momentum=0.9,
                           weight_decay=1e-4),
            paramwise_cfg=dict(norm_decay_mult=0., ratio_decay_mult=0.))
    """

    def __init__(self,
                 optim_wrapper_cfg: dict,
                 paramwise_cfg: Optional[dict] = None) -> None:
        super().__init__(optim_wrapper_cfg, paramwise_cfg)
        if ('ratio_decay_mult' in self.paramwise_cfg and self.base_wd is None):
            raise ValueError('ratio_decay_mult needs the optimizer to set '
                             'weight_decay (base_wd is None)')

    def add_params(self,
                   params: List[dict],
                   module: nn.Module,
                   prefix: str = '',
                   is_dcn_module: Optional[Union[int, float]] = None) -> None:
        start = len(params)
        super().add_params(params, module, prefix, is_dcn_module)
        if isinstance(module, (SwitchableNorm, SwitchableWhitening)):
            self._apply_sn_rules(params[start:], module, prefix)

    def _apply_sn_rules(self, groups: List[dict], module: nn.Module,
                        prefix: str) -> None:
        """Correct the groups mmengine made for an SN layer's own parameters,
        which it treated as those of a plain module."""
        cfg = self.paramwise_cfg
        custom_keys = cfg.get('custom_keys', {})
        norm_decay_mult = cfg.get('norm_decay_mult')
        ratio_lr_mult = cfg.get('ratio_lr_mult')
        ratio_decay_mult = cfg.get('ratio_decay_mult')
        names = {id(p): n for n, p in module.named_parameters(recurse=False)}
        for group in groups:
            name = names.get(id(group['params'][0]))
            full_name = f'{prefix}.{name}' if prefix else name
            if name is None or any(k in f'{prefix}.{name}'
                                   for k in custom_keys):
                continue
            if name == 'bias':
                # mmengine's bias_lr_mult leaves norm biases alone.
                group.pop('lr', None)
            decay_mult = norm_decay_mult
            if name in RATIO_PARAMS:
                if ratio_lr_mult is not None:
                    group['lr'] = self.base_lr * ratio_lr_mult
                if ratio_decay_mult is not None:
                    decay_mult = ratio_decay_mult
            if self.base_wd is not None and decay_mult is not None:
                group['weight_decay'] = self.base_wd * decay_mult
            print_log(
                f'paramwise_options (SN) -- {full_name}: ' +
                ', '.join(f'{k}={v}'
                          for k, v in group.items() if k != 'params'),
                logger='current',
                level=logging.DEBUG)
