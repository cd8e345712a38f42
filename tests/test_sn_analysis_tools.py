"""SNRatioHook and SNBatchAverageHook in a real training run, and the
batch_average and plot_ratios tools on its checkpoint."""
import glob
import json
import os.path as osp

import pytest
import torch

from sn_mm.datasets import make_toy_seg
from released_sn_resnet import ReleasedResNetSN
from tool_runner import ROOT, run_python
SEG_CONFIG = osp.join(ROOT, 'configs', 'toy', 'deeplabv3_r18-sn-d8_toy-seg.py')


run = run_python


@pytest.fixture(scope='module')
def trained(tmp_path_factory):
    cwd = tmp_path_factory.mktemp('analysis')
    make_toy_seg(str(cwd / 'data' / 'toy_seg'), num_train=8, num_val=4,
                 size=64)
    (cwd / 'hooks_config.py').write_text(
        f"_base_ = '{SEG_CONFIG}'\n"
        "custom_hooks = [dict(type='SNRatioHook', interval=2),\n"
        "                dict(type='SNBatchAverageHook', num_batches=2)]\n")
    result = run([osp.join(ROOT, 'tools', 'train.py'), 'hooks_config.py',
                  '--work-dir', 'wd', '--cfg-options',
                  'train_cfg.max_iters=4', 'train_dataloader.batch_size=2',
                  'default_hooks.logger.interval=1'], cwd)
    return cwd, result.stdout + result.stderr


def test_ratio_hook_logs_layers_and_averages(trained):
    cwd, log = trained
    assert 'SN ratios at iter 2:' in log and 'SN ratios at iter 4:' in log
    assert 'backbone.sn1: mean in=' in log
    assert 'sn_mean_bn:' in log  # the model average in the iteration line
    scalars = glob.glob(str(cwd / 'wd' / '*' / 'vis_data' / 'scalars.json'))
    records = [json.loads(line) for line in open(scalars[0])]
    keys = set().union(*records)
    assert 'sn_ratio/backbone.sn1/mean_bn' in keys
    assert 'sn_ratio/decode_head.bottleneck.sn/var_in' in keys
    assert 'sn_var_ln' in keys


def test_batch_average_hook_runs_before_the_final_checkpoint(trained):
    cwd, log = trained
    # After the last iteration (before the checkpoint and the final
    # validation), and not again for that validation.
    assert log.count('SN batch average: BN statistics of every SN layer '
                     're-estimated from 2 batches') == 1
    assert log.index('SN batch average') < log.index(
        'Saving checkpoint at 4 iterations')


def test_batch_average_tool(trained):
    cwd, _ = trained
    src, out = cwd / 'wd' / 'iter_4.pth', cwd / 'averaged.pth'
    result = run([osp.join(ROOT, 'tools', 'analysis_tools',
                           'batch_average.py'), SEG_CONFIG, src,
                  '--num-batches', '3', '--out', out], cwd)
    assert 'over 3 training batches' in result.stdout
    before = torch.load(src, weights_only=False)
    after = torch.load(out, weights_only=False)
    assert after['meta']['sn_batch_average']['num_batches'] == 3
    changed = [k for k, v in after['state_dict'].items()
               if not torch.equal(v, before['state_dict'][k])]
    assert changed and all(k.endswith(('running_mean', 'running_var'))
                           for k in changed)
    # An existing output is not overwritten.
    again = run([osp.join(ROOT, 'tools', 'analysis_tools',
                          'batch_average.py'), SEG_CONFIG, src, '--out', out],
                cwd, ok=False)
    assert again.returncode != 0 and 'exists' in again.stderr


@pytest.mark.parametrize('kind', ['trained', 'imagenet'])
def test_plot_ratios(trained, tmp_path, kind):
    cwd, _ = trained
    if kind == 'trained':
        ckpt = cwd / 'wd' / 'iter_4.pth'
        first = 'backbone.sn1'
    else:  # a released-layout ImageNet backbone (with its classifier)
        ckpt = tmp_path / 'released.pth'
        torch.save(dict(state_dict=ReleasedResNetSN().state_dict()), ckpt)
        first = 'sn1'
    out = tmp_path / 'ratios.png'
    result = run([osp.join(ROOT, 'tools', 'analysis_tools',
                           'plot_ratios.py'), ckpt, '--out', out], cwd)
    assert out.stat().st_size > 10000
    assert result.stdout.splitlines()[1].startswith(first)
    assert 'model average' in result.stdout


def test_plot_ratios_refuses_checkpoint_without_sn(tmp_path):
    ckpt = tmp_path / 'bn.pth'
    torch.save(dict(state_dict=torch.nn.BatchNorm2d(3).state_dict()), ckpt)
    result = run([osp.join(ROOT, 'tools', 'analysis_tools',
                           'plot_ratios.py'), ckpt], tmp_path, ok=False)
    assert result.returncode != 0 and 'no SN layers' in result.stderr
