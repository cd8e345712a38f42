"""``norm_eval`` of OpenMMLab's backbones, kept for SN, SyncSN, SW and SyncSW
layers.

mmdet's, mmseg's, mmpretrain's and mmaction2's backbones (ResNet and its
variants, RegNet, HRNet, ResNet3d, ...) freeze their norm layers in
``train()`` when built with ``norm_eval=True``, by putting every
``_BatchNorm`` instance back in eval mode. SN is not a ``_BatchNorm``, and
must not be one: ``nn.SyncBatchNorm.convert_sync_batchnorm``, mmengine's
``sync_bn`` and mmcv's conv-BN fusion take every ``_BatchNorm`` for a BN.
So each registered model class that takes ``norm_eval`` has its ``train``
extended: after the class's own ``train(True)``, with ``self.norm_eval``
set, every SN layer below it is put in eval mode too (running statistics
untouched; whether its logits and affine parameters learn is
``requires_grad``'s business, as for BN). ``frozen_stages`` and
``norm_cfg.requires_grad=False`` need nothing: they act on modules and
parameters whatever their type.
"""
import functools
import inspect

import torch.nn as nn
from mmengine.registry import MODELS

_MARK = '_sn_keeps_norm_eval'
# {id(registry): number of entries seen}: registries walked already.
_seen = {}
# The layer types norm_eval freezes besides BN (SN, SW, ...): one wrapper
# per train method serves them all, whichever registered first.
_norm_types = set()


def takes_norm_eval(cls: type) -> bool:
    """Whether ``cls`` (or a base whose ``__init__`` it reaches through
    ``**kwargs``) takes a ``norm_eval`` argument."""
    for klass in cls.__mro__:
        code = getattr(klass.__dict__.get('__init__'), '__code__', None)
        if code is not None and 'norm_eval' in code.co_varnames[:(
                code.co_argcount + code.co_kwonlyargcount)]:
            return True
    return False


def keep_norm_eval(cls: type) -> None:
    """Extend the ``train`` that ``cls`` runs (defined on ``cls`` or a
    base) so that ``norm_eval`` freezes the layers of every type given to
    :func:`keep_norm_eval_everywhere` as it freezes BN."""
    for klass in cls.__mro__:
        if 'train' in klass.__dict__:
            break
    if klass is nn.Module or getattr(klass.train, _MARK, False):
        return
    train = klass.train

    @functools.wraps(train)
    def train_keeping_sn_frozen(self, mode: bool = True):
        result = train(self, mode)
        if mode and getattr(self, 'norm_eval', False):
            frozen = tuple(_norm_types)
            for m in self.modules():
                if isinstance(m, frozen):
                    m.eval()
        return result

    setattr(train_keeping_sn_frozen, _MARK, True)
    klass.train = train_keeping_sn_frozen


def registries(root=MODELS):
    """``root`` and every registry below it (mmdet's, mmseg's, ...)."""
    yield root
    for child in root.children.values():
        yield from registries(child)


def keep_norm_eval_everywhere(norm_type: type) -> None:
    """Let ``norm_eval`` freeze ``norm_type`` layers too, and
    :func:`keep_norm_eval` every model class registered so far that takes
    ``norm_eval``. Cheap when nothing was registered since the last call:
    SN and SW layers call it as they are built, when their backbone's class
    is registered (imported) for sure."""
    _norm_types.add(norm_type)
    for registry in registries():
        entries = registry.module_dict
        if _seen.get(id(registry)) == len(entries):
            continue
        for obj in list(entries.values()):
            if inspect.isclass(obj) and issubclass(
                    obj, nn.Module) and takes_norm_eval(obj):
                keep_norm_eval(obj)
        _seen[id(registry)] = len(entries)
