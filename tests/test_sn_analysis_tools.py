"""SNRatioHook and SNBatchAverageHook in a real training run, and the
batch_average and plot_ratios tools on its checkpoint."""
import glob
import json
import os.path as osp

import pytest
import torch
from helpers import load_tool
from released_sn_resnet import ReleasedResNetSN
from tool_runner import ROOT, run_python

SEG_CONFIG = osp.join(ROOT, 'configs', 'toy', 'deeplabv3_r18-sn-d8_toy-seg.py')

run = run_python


@pytest.fixture(scope='module')
def trained(toy_seg_workspace):
    cwd = toy_seg_workspace
    (cwd / 'hooks_config.py').write_text(
        f"_base_ = '{SEG_CONFIG}'\n"
        "custom_hooks = [dict(type='SNRatioHook', interval=2),\n"
        "                dict(type='SNBatchAverageHook', num_batches=2)]\n"
        # Switchable Whitening in the auxiliary head: its weights logged too.
        "model = dict(auxiliary_head=dict(norm_cfg=dict(\n"
        "    type='SW', num_pergroup=16, sw_type=5)))\n")
    result = run([
        osp.join(ROOT, 'tools', 'train.py'), 'hooks_config.py', '--work-dir',
        'wd', '--cfg-options', 'train_cfg.max_iters=4',
        'train_dataloader.batch_size=2', 'default_hooks.logger.interval=1'
    ], cwd)
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
    assert 'sn_nonfinite_batches' in keys
    # The SW layer's five importance weights, per layer and averaged.
    assert 'SW importance weights at iter 4:' in log
    assert 'auxiliary_head.convs.0.sw: mean bw=' in log
    for term in ('bw', 'iw', 'bn', 'in', 'ln'):
        assert f'sw_weight/auxiliary_head.convs.0.sw/var_{term}' in keys
        assert f'sw_mean_{term}' in keys


def test_batch_average_hook_runs_before_the_final_checkpoint(trained):
    cwd, log = trained
    # After the last iteration (before the checkpoint and the final
    # validation), and not again for that validation.
    assert log.count('SN batch average: BN statistics of every SN layer '
                     're-estimated from 2 batches') == 1
    assert log.index('SN batch average') < log.index(
        'Saving checkpoint at 4 iterations')
    # Its progress, per rank, as the batches are done.
    assert log.count('SN batch average, rank 0: 1/2 batches (50%)') == 1
    assert log.index('SN batch average, rank 0: 2/2 batches (100%)') < \
        log.index('re-estimated from 2 batches')


def test_batch_average_tool(trained):
    cwd, _ = trained
    src, out = cwd / 'wd' / 'iter_4.pth', cwd / 'averaged.pth'
    result = run([
        osp.join(ROOT, 'tools', 'analysis_tools', 'batch_average.py'),
        cwd / 'hooks_config.py', src, '--num-batches', '3', '--out', out
    ], cwd)
    assert 'over 3 training batches' in result.stdout
    assert 'SN batch average, rank 0: 3/3 batches (100%)' in result.stdout
    before = torch.load(src, weights_only=False)
    after = torch.load(out, weights_only=False)
    assert after['meta']['sn_batch_average']['num_batches'] == 3
    changed = [
        k for k, v in after['state_dict'].items()
        if not torch.equal(v, before['state_dict'][k])
    ]
    assert changed and all(
        k.endswith(('running_mean', 'running_var')) for k in changed)
    # An existing output is not overwritten.
    again = run([
        osp.join(ROOT, 'tools', 'analysis_tools', 'batch_average.py'),
        cwd / 'hooks_config.py', src, '--out', out
    ],
                cwd,
                ok=False)
    assert again.returncode != 0 and 'exists' in again.stderr


def expected_ratios(state, layer):
    return {
        stat: torch.softmax(state[f'{layer}.{stat}_weight'].double().flatten(),
                            0)
        for stat in ('mean', 'var')
    }


@pytest.mark.parametrize('kind', ['trained', 'imagenet'])
def test_plot_ratios(trained, tmp_path, kind):
    cwd, _ = trained
    if kind == 'trained':
        ckpt = cwd / 'wd' / 'iter_4.pth'
        state = torch.load(ckpt, weights_only=False)['state_dict']
    else:  # a released-layout ImageNet backbone (with its classifier)
        ckpt = tmp_path / 'released.pth'
        model = ReleasedResNetSN()
        with torch.no_grad():  # ratios far from 1/3, so that a mix-up shows
            for name, p in model.named_parameters():
                if name.endswith(('mean_weight', 'var_weight')):
                    p.normal_(0, 2)
        state = model.state_dict()
        torch.save(dict(state_dict=state), ckpt)
    layers = [
        k[:-len('.mean_weight')] for k in state if k.endswith('.mean_weight')
    ]
    out = tmp_path / 'ratios.png'
    result = run([
        osp.join(ROOT, 'tools', 'analysis_tools', 'plot_ratios.py'), ckpt,
        '--out', out
    ], cwd)
    assert out.read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'
    # The printed table: one row per layer, in network order, the values of
    # the checkpoint's softmax ratios.
    lines = result.stdout.splitlines()
    rows = lines[1:1 + len(layers)]
    assert [r.split()[0] for r in rows] == layers
    assert lines[1 + len(layers)].startswith('model average')
    for layer, row in zip(layers, rows):
        values = torch.tensor([float(v) for v in row.split()[1:7]],
                              dtype=torch.float64)
        ratios = expected_ratios(state, layer)
        torch.testing.assert_close(
            values,
            torch.cat([ratios['mean'], ratios['var']]),
            rtol=0,
            atol=6e-4)
    # The figure: bar heights are the ratios, term by term, layer by layer.
    tool = load_tool('analysis_tools', 'plot_ratios.py')
    from sn_mm.analysis import sn_ratios
    figure = tool.make_figure(sn_ratios(state), [0.] * len(layers), 'test')
    for ax, stat in zip(figure.axes[:2], ('mean', 'var')):
        for t, bars in enumerate(ax.containers):
            heights = torch.tensor([b.get_height() for b in bars],
                                   dtype=torch.float64)
            expected = torch.stack(
                [expected_ratios(state, layer)[stat][t] for layer in layers])
            torch.testing.assert_close(heights, expected, rtol=1e-6, atol=1e-6)
    if kind == 'trained':  # the SW layer's table and figure
        sw_out = tmp_path / 'ratios_sw.png'
        assert sw_out.read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'
        layer = 'auxiliary_head.convs.0.sw'
        row = next(r for r in lines if r.startswith(layer + ' '))
        values = torch.tensor([float(v) for v in row.split()[1:11]],
                              dtype=torch.float64)
        expected = torch.cat([
            torch.softmax(state[f'{layer}.sw_{stat}_weight'].double(), 0)
            for stat in ('mean', 'var')
        ])
        torch.testing.assert_close(values, expected, rtol=0, atol=6e-4)


def test_plot_ratios_refuses_checkpoint_without_sn(tmp_path):
    ckpt = tmp_path / 'bn.pth'
    torch.save(dict(state_dict=torch.nn.BatchNorm2d(3).state_dict()), ckpt)
    result = run(
        [osp.join(ROOT, 'tools', 'analysis_tools', 'plot_ratios.py'), ckpt],
        tmp_path,
        ok=False)
    assert result.returncode != 0 and 'no SN or SW layers' in result.stderr
