"""SyncSN end to end: a real 2-process CPU training run through torchrun,
and SyncSN turned into SN by tools/test.py on one process."""
import os.path as osp

import pytest
import torch
from helpers import free_port
from tool_runner import ROOT, run_python, tool

TESTS = osp.join(ROOT, 'tests')
SYNC_CONFIG = osp.join(ROOT, 'configs', 'toy',
                       'deeplabv3_r18-syncsn-d8_toy-seg.py')
SN_CONFIG = osp.join(ROOT, 'configs', 'toy', 'deeplabv3_r18-sn-d8_toy-seg.py')
SHORT = [
    'train_cfg.max_iters=3', 'train_dataloader.batch_size=2',
    'default_hooks.logger.interval=1'
]


def run(args, cwd):
    # PYTHONPATH: the processes import the test's dump hook.
    result = run_python(
        args, cwd, env=dict(PYTHONPATH=TESTS, OMP_NUM_THREADS='1'))
    return result.stdout + result.stderr


@pytest.fixture(scope='module')
def workspace(toy_seg_workspace):
    cwd = toy_seg_workspace
    # What a user adds to a config; the hook writes each rank's SN state.
    (cwd / 'dump_config.py').write_text(
        f"_base_ = '{SYNC_CONFIG}'\n"
        "custom_imports = dict(imports=['sn_mm', 'sn_state_dump_hook'])\n"
        "custom_hooks = [dict(type='SNStateDumpHook')]\n")
    # An SN config with mmengine's switch for synchronised BN.
    (cwd / 'sync_bn_config.py').write_text(
        f"_base_ = '{SN_CONFIG}'\n"
        "custom_imports = dict(imports=['sn_mm', 'sn_state_dump_hook'])\n"
        "custom_hooks = [dict(type='SNStateDumpHook')]\n"
        "sync_bn = 'torch'\n")
    return cwd


@pytest.mark.parametrize('config', ['dump_config.py', 'sync_bn_config.py'])
def test_two_process_syncsn_training_agrees_on_every_rank(workspace, config):
    cwd = workspace
    log = run([
        '-m', 'torch.distributed.run', '--nproc_per_node', '2',
        '--master_port',
        str(free_port()),
        tool('train.py'), config, '--launcher', 'pytorch', '--work-dir',
        f'wd_{config}', '--cfg-options', *SHORT
    ],
              cwd=cwd)
    assert 'Iter(train) [3/3]' in log
    if config == 'sync_bn_config.py':
        assert "sync_bn='torch': turned " in log
    ranks = [
        torch.load(cwd / f'wd_{config}' / f'sn_state_rank{r}.pth')
        for r in range(2)
    ]
    assert set(ranks[0]['types'].values()) == {'SyncSwitchableNorm'}
    state0, state1 = ranks[0]['state'], ranks[1]['state']
    assert state0.keys() == state1.keys()
    assert any(k.endswith('running_var') for k in state0)
    for key in state0:
        # Parameters agree through DDP; running statistics (which DDP does
        # not broadcast here) only because SyncSN shares the BN term.
        assert torch.equal(state0[key], state1[key]), key
    # Training moved them: the check above is not between untouched copies.
    assert not torch.all(state0['backbone.sn1.running_var'] == 1)


def test_test_tool_turns_syncsn_into_sn_on_one_process(workspace):
    cwd = workspace
    run([
        tool('train.py'), 'dump_config.py', '--work-dir', 'single',
        '--cfg-options', *SHORT
    ],
        cwd=cwd)
    trained = torch.load(cwd / 'single' / 'sn_state_rank0.pth')
    # Not distributed: the runner ran SN layers, training too, as mmengine
    # does with SyncBN.
    assert set(trained['types'].values()) == {'SwitchableNorm'}
    log = run([
        tool('test.py'), 'dump_config.py', 'single/iter_3.pth', '--work-dir',
        'single_test'
    ],
              cwd=cwd)
    assert 'mIoU' in log
    tested = torch.load(cwd / 'single_test' / 'sn_state_test_rank0.pth')
    # Every SyncSN layer of the config ran as SN, with the trained state.
    assert set(tested['types']) == set(trained['types'])
    assert set(tested['types'].values()) == {'SwitchableNorm'}
    for key, value in trained['state'].items():
        assert torch.equal(tested['state'][key], value), key
