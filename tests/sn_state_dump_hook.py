"""Hooks the tests of real runs import (``custom_imports``): what SN layers
the model that ran had, their state, what a run did to them, and a kill
mid-run."""
import os
import os.path as osp
import signal

import torch
from mmengine.dist import get_rank
from mmengine.hooks import Hook
from mmengine.model import is_model_wrapper
from mmengine.registry import HOOKS

from sn_mm import SwitchableNorm


@HOOKS.register_module()
class SNStateDumpHook(Hook):
    """After training, write every SN parameter and buffer of this rank to
    ``work_dir/sn_state_rank{rank}.pth``; after testing, the same to
    ``work_dir/sn_state_test_rank{rank}.pth``. Each file also maps every SN
    layer's name to its class name."""

    def _dump(self, runner, name):
        model = runner.model.module if is_model_wrapper(
            runner.model) else runner.model
        state = {}
        for layer, module in model.named_modules():
            if isinstance(module, SwitchableNorm):
                for key, value in module.state_dict().items():
                    state[f'{layer}.{key}'] = value.detach().clone()
        torch.save(
            dict(
                state=state,
                types={
                    n: type(m).__name__
                    for n, m in model.named_modules()
                    if isinstance(m, SwitchableNorm)
                }), osp.join(runner.work_dir, f'{name}_rank{get_rank()}.pth'))

    def after_train(self, runner):
        self._dump(runner, 'sn_state')

    def after_test(self, runner):
        self._dump(runner, 'sn_state_test')


@HOOKS.register_module()
class SNFirstStepHook(Hook):
    """Around the first training iteration, write to
    ``work_dir/first_step_rank{rank}.pth`` the backbone's input and state
    before it (after DDP's start has made the ranks equal) and its SN
    layers' running statistics after it."""

    def before_train(self, runner):
        model = runner.model.module if is_model_wrapper(
            runner.model) else runner.model
        self.backbone = model.backbone
        self.record = {}

        def keep_input(module, args):
            self.record.setdefault('input', args[0].detach().clone())

        self.handle = self.backbone.register_forward_pre_hook(keep_input)

    def before_train_iter(self, runner, batch_idx, data_batch=None):
        if runner.iter == 0:
            self.record['before'] = {
                k: v.detach().clone()
                for k, v in self.backbone.state_dict().items()
            }

    def after_train_iter(self,
                         runner,
                         batch_idx,
                         data_batch=None,
                         outputs=None):
        if runner.iter == 0:
            self.handle.remove()
            self.record['after'] = {
                k: v.detach().clone()
                for k, v in self.backbone.state_dict().items()
                if k.endswith(('running_mean', 'running_var'))
            }
            torch.save(
                self.record,
                osp.join(runner.work_dir, f'first_step_rank{get_rank()}.pth'))


@HOOKS.register_module()
class SNRunRecordHook(Hook):
    """What a run did to its SN layers, written after training to
    ``work_dir/sn_run_rank{rank}.pth``: the dtypes of the inputs they saw
    in training,
    whether the runner compiled ``train_step``, and every SN entry of the
    model (not an average of it) after each iteration."""

    def before_train(self, runner):
        self.dtypes = set()
        self.steps = []
        self.compiled = hasattr(runner.model.train_step,
                                '_torchdynamo_orig_callable')
        # (A hook that dynamo traced would make it recompile.)
        for module in runner.model.modules() if not self.compiled else ():
            if isinstance(module, SwitchableNorm):
                module.register_forward_pre_hook(self.keep_dtype)

    def keep_dtype(self, module, args):
        if module.training:  # (not validation's)
            self.dtypes.add(str(args[0].dtype))

    def after_train_iter(self,
                         runner,
                         batch_idx,
                         data_batch=None,
                         outputs=None):
        model = runner.model.module if is_model_wrapper(
            runner.model) else runner.model
        self.steps.append({
            f'{name}.{key}': value.detach().clone()
            for name, module in model.named_modules()
            if isinstance(module, SwitchableNorm)
            for key, value in module.state_dict().items()
        })

    def after_train(self, runner):
        torch.save(
            dict(dtypes=self.dtypes, compiled=self.compiled, steps=self.steps),
            osp.join(runner.work_dir, f'sn_run_rank{get_rank()}.pth'))


@HOOKS.register_module()
class KillAtIterHook(Hook):
    """SIGKILL this process before training iteration ``iter`` (counted
    over the whole run): a run killed mid-epoch."""

    def __init__(self, iter):
        self.iter = iter

    def before_train_iter(self, runner, batch_idx, data_batch=None):
        if runner.iter == self.iter:
            os.kill(os.getpid(), signal.SIGKILL)
