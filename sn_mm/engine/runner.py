"""mmengine's Runner, able to resume under torch >= 2.6."""
import contextlib
import functools
import os.path as osp

import torch
import torch.distributed as dist
from mmengine.model import is_model_wrapper
from mmengine.registry import RUNNERS
from mmengine.runner import Runner

from ..models import (SwitchableNorm, SwitchableWhitening, SyncSwitchableNorm,
                      SyncSwitchableWhitening, convert_sync_sn,
                      keep_level_statistics, revert_sync_sn)
from ..models.sync_switchable_norm import name_sync_layers


@contextlib.contextmanager
def torch_load_default(weights_only: bool):
    """Make ``weights_only`` the default of ``torch.load`` inside the block
    (for callers, such as mmengine's loaders, that do not pass it)."""
    original = torch.load

    @functools.wraps(original)
    def load(*args, **kwargs):
        kwargs.setdefault('weights_only', weights_only)
        return original(*args, **kwargs)

    torch.load = load
    try:
        yield
    finally:
        torch.load = original


def trusted_torch_load():
    """Make ``torch.load`` default to ``weights_only=False`` inside the block.

    torch >= 2.6 loads with ``weights_only=True``; mmengine 0.10.7 does not
    pass the argument, and its own training checkpoints hold mmengine and
    numpy objects (the message hub's HistoryBuffers) that the safe loader
    refuses -- so ``--resume`` fails. Allow-listing them would mean allowing
    ``builtins.getattr``, which defeats the safe loader, so instead only the
    resume of the run's own checkpoint is trusted; pretrained weights
    (``load_from``, ``init_cfg``) keep the safe default.
    """
    return torch_load_default(False)


def safe_torch_load():
    """Make ``torch.load`` default to ``weights_only=True`` inside the
    block: torch >= 2.6's default, on the older torches too (whose default
    unpickles anything)."""
    return torch_load_default(True)


CHECKPOINT_DOC = ('docs/configs_and_checkpoints.md'
                  '#where-each-checkpoint-comes-from')


def pretrained_checkpoints(cfg, where='model'):
    """(config key, checkpoint) of every ``init_cfg`` in ``cfg`` that loads
    a checkpoint, and of mmaction2's ``pretrained`` backbone argument."""
    if isinstance(cfg, dict):
        for key, value in cfg.items():
            if key == 'pretrained' and isinstance(value, str):
                yield f'{where}.pretrained', value
            elif key == 'init_cfg':
                inits = value if isinstance(value, list) else [value]
                for i, init in enumerate(inits):
                    if isinstance(init, dict) and isinstance(
                            init.get('checkpoint'), str):
                        at = f'{where}.init_cfg' + (f'[{i}]' if isinstance(
                            value, list) else '')
                        yield f'{at}.checkpoint', init['checkpoint']
            else:
                yield from pretrained_checkpoints(value, f'{where}.{key}')
    elif isinstance(cfg, (list, tuple)):
        for i, value in enumerate(cfg):
            yield from pretrained_checkpoints(value, f'{where}[{i}]')


def missing_checkpoints(cfg, where='model'):
    """(config key, path) of every checkpoint :func:`pretrained_checkpoints`
    finds that names a local file which does not exist (URLs such as
    ``torchvision://resnet50`` are mmengine's to resolve)."""
    return [(key, path) for key, path in pretrained_checkpoints(cfg, where)
            if '://' not in path and not osp.exists(path)]


def check_checkpoints(model_cfg) -> None:
    """Before anything is built: a FileNotFoundError naming every pretrained
    file the model's config expects and does not find, and where the docs
    say each comes from."""
    missing = missing_checkpoints(model_cfg)
    if missing:
        raise FileNotFoundError(
            'the config starts from checkpoint files that do not exist: ' +
            '; '.join(f'{path} ({key})' for key, path in missing) +
            f'. {CHECKPOINT_DOC} says where each comes from and how to make '
            'it; or point a key elsewhere with --cfg-options KEY=PATH')


@RUNNERS.register_module()
class SNRunner(Runner):
    """mmengine's Runner, able to resume under torch >= 2.6 and to run
    several processes on CPUs.

    - ``resume`` loads the run's own checkpoint (see
      :func:`trusted_torch_load`).
    - A pretrained file the model's config names and the disk lacks stops
      training before the datasets are built, naming the file and the docs
      (:func:`check_checkpoints`); testing a trained model does not need
      them.
    - On one process (no launcher), SyncSN layers become SN layers and
      SyncSW layers SW layers, as
      mmengine's own ``wrap_model`` turns SyncBN into BN: there is nothing to
      synchronise with, and SN computes the same thing.
    - Distributed, with the config's ``sync_bn`` set (mmengine's switch:
      ``'torch'`` or ``'mmcv'``), SN and SW layers become SyncSN and SyncSW
      layers, as mmengine turns BN into SyncBN.
    - SN layers with a BN term in a detection head that runs once per FPN
      level (RetinaNet's, FCOS's, ...) keep each level's BN statistics
      (:func:`sn_mm.models.keep_level_statistics`), as a level's own batch
      statistics normalise it in training.
    - ``compile=True`` compiles the model's forward and loss; the data
      preprocessing and the optimizer's update run eagerly.
    - With a launcher but no CUDA (e.g. ``torchrun --nproc_per_node 2
      tools/train.py CFG --launcher pytorch`` on a CPU machine), mmengine
      0.10.7 would call ``torch.cuda.set_device`` and give DDP a device id;
      here the process group starts on gloo and DDP wraps the CPU model.

    ``tools/train.py`` and ``tools/test.py`` use it unless a config names
    another ``runner_type``.
    """

    def train(self):
        # Before the datasets are built: init_weights would fail later.
        check_checkpoints(self.cfg.get('model', {}))
        return super().train()

    def build_model(self, model):
        model = super().build_model(model)
        for name, (levels, layers) in keep_level_statistics(model).items():
            self.logger.info(
                f'{name} runs on {levels} FPN levels: its {layers} SN layers '
                'keep each level\'s BN statistics')
        name_sync_layers(model)
        return model

    def _cpu_distributed(self) -> bool:
        return self.distributed and not torch.cuda.is_available()

    def setup_env(self, env_cfg):
        if self._cpu_distributed() and not dist.is_initialized():
            # torchrun/slurm env:// variables; NCCL needs GPUs, gloo not.
            dist.init_process_group(backend='gloo')
        super().setup_env(env_cfg)

    def wrap_model(self, model_wrapper_cfg, model):
        if not self.distributed and not is_model_wrapper(model):
            sn = sum(
                isinstance(m, SyncSwitchableNorm) for m in model.modules())
            sw = sum(
                isinstance(m, SyncSwitchableWhitening)
                for m in model.modules())
            if sn or sw:
                model = revert_sync_sn(model)
                self.logger.info(f'Not distributed: turned {sn} SyncSN layers '
                                 f'into SN layers and {sw} SyncSW layers into '
                                 'SW layers')
        if self.distributed and self.cfg.get('sync_bn') in ('torch', 'mmcv') \
                and not is_model_wrapper(model):
            model = self._sync_sn(model)
        if self._cpu_distributed():
            model_wrapper_cfg = dict(
                dict(
                    type='MMDistributedDataParallel',
                    broadcast_buffers=False,
                    find_unused_parameters=self.cfg.get(
                        'find_unused_parameters', False)),
                **(model_wrapper_cfg or {}))
            # An explicit None beats the LOCAL_RANK device id mmengine adds.
            model_wrapper_cfg['device_ids'] = None
        return super().wrap_model(model_wrapper_cfg, model)

    def _sync_sn(self, model):
        # Exact types: a SyncSN is an SN too, and stays as it is.
        sn = sum(type(m) is SwitchableNorm for m in model.modules())
        sw = sum(type(m) is SwitchableWhitening for m in model.modules())
        if sn or sw:
            model = convert_sync_sn(model)
            self.logger.info(f'sync_bn={self.cfg.sync_bn!r}: turned {sn} SN '
                             f'layers into SyncSN layers and {sw} SW layers '
                             'into SyncSW layers')
        return model

    def _maybe_compile(self, target: str) -> None:
        # mmengine compiles the whole train_step, optimizer step included;
        # torch 2.14's dynamo fails inside SGD.step on mmengine's param
        # groups (InternalTorchDynamoError, whatever the model's norm
        # layers), and torch 2.1's inside the toolboxes' batch stacking.
        # The data preprocessor and the optimizer wrapper's update
        # (backward, step) run eagerly; the forward and loss are compiled.
        if self.cfg.get('compile') and target == 'train_step' and hasattr(
                self, 'optim_wrapper') and not getattr(
                    self.optim_wrapper, '_sn_eager_update', False):
            wrapper = self.optim_wrapper
            wrapper.update_params = torch.compiler.disable(
                wrapper.update_params)
            wrapper._sn_eager_update = True
            model = getattr(self.model, 'module', self.model)
            preprocessor = getattr(model, 'data_preprocessor', None)
            if preprocessor is not None:
                preprocessor.forward = torch.compiler.disable(
                    preprocessor.forward)
        super()._maybe_compile(target)

    def resume(self, *args, **kwargs):
        with trusted_torch_load():
            return super().resume(*args, **kwargs)
