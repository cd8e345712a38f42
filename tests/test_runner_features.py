"""The runner's features in real toy runs of tools/train.py, each checked
for what it does to SN: --amp (bfloat16 on the CPU), compile=True, an EMA
hook (mmdet's ExpMomentumEMA) and --resume after a run killed mid-epoch."""
import math
import os.path as osp

import pytest
import torch
from tool_runner import ROOT, run_python, run_python_together, tool

from sn_mm.engine import BF16OptimWrapper
from sn_mm.testing import make_toy_cls, make_toy_coco

TESTS = osp.join(ROOT, 'tests')
CLS_CONFIG = osp.join(ROOT, 'configs', 'toy', 'resnet18-sn_toy-cls.py')
DET_CONFIG = osp.join(ROOT, 'configs', 'toy',
                      'mask-rcnn_r18-sn_fpn_sn-head_toy-coco.py')
# One thread per run: a resumed run then computes bit for bit what the
# uninterrupted one did.
ENV = dict(PYTHONPATH=TESTS, OMP_NUM_THREADS='1')
# 32 images, batches of 8: 4 iterations an epoch, 2 epochs.
STEPS = 8
CLS_RUN = f"""_base_ = '{CLS_CONFIG}'
custom_imports = dict(imports=['sn_mm', 'sn_state_dump_hook'])
custom_hooks = [dict(type='SNRunRecordHook')]
# No random flip: a resumed run sees the images the first run saw.
train_pipeline = [dict(type='LoadImageFromFile'), dict(type='PackInputs')]
train_dataloader = dict(batch_size=8, dataset=dict(pipeline=train_pipeline))
train_cfg = dict(max_epochs=2, val_interval=2)
default_hooks = dict(logger=dict(interval=1),
                     checkpoint=dict(interval=1, max_keep_ckpts=3))
"""


def train(cwd, config, work_dir, *args):
    return [tool('train.py'), config, '--work-dir', work_dir, *args]


def record(cwd, work_dir):
    return torch.load(cwd / work_dir / 'sn_run_rank0.pth')


@pytest.fixture(scope='module')
def cls_runs(tmp_path_factory):
    """The toy classification set, and the eager, --amp and killed runs
    (together: most of each is importing)."""
    cwd = tmp_path_factory.mktemp('runner_features')
    make_toy_cls(str(cwd / 'data' / 'toy_cls'), num_train=32, num_val=8)
    (cwd / 'run.py').write_text(CLS_RUN)
    (cwd / 'killed.py').write_text(
        "_base_ = './run.py'\n"
        "custom_hooks = [dict(type='SNRunRecordHook'),\n"
        "                dict(type='KillAtIterHook', iter=6)]\n")
    eager, amp, killed = run_python_together([
        train(cwd, 'run.py', 'eager'),
        train(cwd, 'run.py', 'amp', '--amp'),
        train(cwd, 'killed.py', 'resumed')
    ],
                                             cwd,
                                             ok=False,
                                             env=ENV)
    assert eager.returncode == 0, eager.stderr[-3000:]
    assert amp.returncode == 0, amp.stderr[-3000:]
    assert killed.returncode == -9, killed.stderr[-3000:]
    return cwd, amp.stdout + amp.stderr


def last_state(cwd, work_dir):
    steps = record(cwd, work_dir)['steps']
    assert len(steps) == STEPS
    return steps[-1]


def test_amp_runs_sn_on_bfloat16_inputs_in_float32(cls_runs):
    cwd, log = cls_runs
    assert 'BF16OptimWrapper' in log
    amp = record(cwd, 'amp')
    # The convolutions ran in bfloat16, so SN saw bfloat16 inputs ...
    assert amp['dtypes'] == {'torch.bfloat16'}
    assert record(cwd, 'eager')['dtypes'] == {'torch.float32'}
    # ... and kept its state in float32, finite, moving every step.
    first, last = amp['steps'][0], amp['steps'][-1]
    for key, value in last.items():
        assert value.dtype in (torch.float32, torch.int64, torch.bool), key
        assert torch.isfinite(value.float()).all(), key
    assert int(last['backbone.sn1.num_batches_tracked']) == STEPS
    assert int(last['backbone.sn1.nonfinite_batches']) == 0
    for key in ('backbone.sn1.running_mean', 'backbone.layer4.1.sn2.'
                'mean_weight'):
        assert not torch.equal(first[key], last[key]), key
    # bfloat16 rounding, not another computation: the first step's
    # statistics are the float32 run's within bfloat16's precision.
    eager = record(cwd, 'eager')['steps'][0]
    for key in ('backbone.sn1.running_mean', 'backbone.sn1.running_var'):
        torch.testing.assert_close(
            first[key], eager[key], rtol=2e-2, atol=2e-2, msg=key)


def test_resume_after_a_kill_mid_epoch_continues_exactly(cls_runs):
    cwd, _ = cls_runs
    # Killed before the 7th iteration: epoch 1's checkpoint is the last.
    assert (cwd / 'resumed' / 'epoch_1.pth').exists()
    assert not (cwd / 'resumed' / 'epoch_2.pth').exists()
    result = run_python(
        train(cwd, 'run.py', 'resumed', '--resume'), cwd, env=ENV)
    assert 'resumed epoch: 1, iter: 4' in result.stdout + result.stderr
    steps = record(cwd, 'resumed')['steps']
    assert len(steps) == STEPS // 2  # the second epoch only
    eager = last_state(cwd, 'eager')
    # Ratios, running statistics and counters: what the run that was never
    # killed holds, bit for bit.
    assert steps[-1].keys() == eager.keys()
    for key, value in eager.items():
        assert torch.equal(steps[-1][key], value), key
    assert int(steps[-1]['backbone.sn1.num_batches_tracked']) == STEPS


def test_compile_trains_sn_as_eager_mode_does(cls_runs):
    """mmengine's ``compile`` in the config. The suite traces with
    ``backend='aot_eager'`` (dynamo, AOT autograd and its functionalised
    buffer updates, as ``compile=True`` does, without inductor's code
    generation, which on 2 cores takes minutes for this model)."""
    cwd, _ = cls_runs
    run_python(
        train(cwd, 'run.py', 'compiled', '--cfg-options',
              'compile.backend=aot_eager'),
        cwd,
        env=ENV)
    compiled = record(cwd, 'compiled')
    assert compiled['compiled']
    assert not record(cwd, 'eager')['compiled']
    eager = record(cwd, 'eager')['steps']
    assert len(compiled['steps']) == STEPS
    # Running statistics updated once a step, logits learned: the first
    # steps are eager mode's up to rounding (which a few steps of this toy
    # run amplify, as they amplify another thread count's).
    for step in (0, 1):
        for key, value in eager[step].items():
            torch.testing.assert_close(
                compiled['steps'][step][key],
                value,
                rtol=1e-4,
                atol=1e-5,
                msg=key)
    assert int(compiled['steps'][-1]['backbone.sn1.num_batches_tracked']) \
        == STEPS


def test_ema_model_averages_sn_logits_and_statistics(tmp_path):
    """mmdet's ExpMomentumEMA on the toy Mask R-CNN: the averaged model's
    SN logits and running statistics are the exponential average of the
    trained model's, step by step."""
    make_toy_coco(
        str(tmp_path / 'data' / 'toy_coco'), num_train=8, num_val=2, size=96)
    momentum, gamma = 0.2, 1
    (tmp_path / 'ema.py').write_text(
        f"_base_ = '{DET_CONFIG}'\n"
        "custom_imports = dict(imports=['sn_mm', 'sn_state_dump_hook'])\n"
        "custom_hooks = [dict(type='SNRunRecordHook'),\n"
        "    dict(type='EMAHook', ema_type='ExpMomentumEMA',\n"
        f"         momentum={momentum}, gamma={gamma}, update_buffers=True,\n"
        "         priority=49)]\n"
        "train_dataloader = dict(batch_size=2)\n"
        "train_cfg = dict(max_iters=3, val_interval=10)\n")
    run_python(train(tmp_path, 'ema.py', 'ema'), tmp_path, env=ENV)
    steps = record(tmp_path, 'ema')['steps']
    # The checkpoint holds the averaged model (EMAHook swaps it in).
    saved = torch.load(
        tmp_path / 'ema' / 'iter_3.pth', weights_only=False)['state_dict']
    expected = {k: v.clone() for k, v in steps[0].items()}
    for k in range(1, len(steps)):
        weight = (1 - momentum) * math.exp(-(1 + k) / gamma) + momentum
        for key, value in expected.items():
            if value.is_floating_point():
                value.mul_(1 - weight).add_(steps[k][key], alpha=weight)
    checked = 0
    averaged = ('mean_weight', 'var_weight', 'running_mean', 'running_var')
    for key in steps[-1]:
        if key.endswith(averaged):
            torch.testing.assert_close(saved[key], expected[key], msg=key)
            checked += 1
        elif key.endswith(('num_batches_tracked', 'ratio_fixed')):
            # State, not averaged: the trained model's.
            assert torch.equal(saved[key], steps[-1][key]), key
    assert checked > 100
    # Averaging changed them: the trained model's differ.
    assert not torch.allclose(saved['backbone.sn1.mean_weight'],
                              steps[-1]['backbone.sn1.mean_weight'])


def test_bf16_wrapper_names_ops_without_bfloat16_cpu_kernels():
    from mmcv.ops import nms
    model = torch.nn.Linear(4, 4)
    wrapper = BF16OptimWrapper(
        optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    with pytest.raises(RuntimeError, match='without --amp on the CPU'):
        with wrapper.optim_context(model):
            boxes = model(torch.rand(3, 4)).abs().cumsum(1)
            nms(boxes, torch.rand(3).to(boxes.dtype), 0.5)


@pytest.mark.parametrize('update_buffers', [True, False])
def test_averaged_model_takes_sn_schedule_state_as_it_is(update_buffers):
    """Sparse SN's radius and fixed ratios are the trained model's in the
    averaged model, not an average of them; logits are averaged."""
    from mmdet.models.layers import ExpMomentumEMA

    from sn_mm import SwitchableNorm
    model = torch.nn.Sequential(SwitchableNorm(4, ratio_fn='sparsestmax'))
    ema = ExpMomentumEMA(
        model, momentum=0.5, gamma=1, update_buffers=update_buffers)
    ema.update_parameters(model)
    with torch.no_grad():
        model[0].set_radius(0.6)
        model[0].fix_ratios(mean=[0., 1., 0.])
        model[0].mean_weight.add_(1)
    ema.update_parameters(model)
    averaged = ema.module[0]
    assert float(averaged.radius) == pytest.approx(0.6)
    assert averaged.fixed() == model[0].fixed()
    assert torch.equal(averaged.fixed_ratios, model[0].fixed_ratios)
    assert not torch.equal(averaged.mean_weight, model[0].mean_weight)
