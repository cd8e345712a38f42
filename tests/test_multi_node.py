"""More than one machine: two torchrun launches on this machine, one per
node rank, as on two machines (gloo). SyncSN shares BN statistics over
all ranks, each node's ranks (``group='node'``) or blocks of ranks; a toy
SyncSN config trains through tools/dist_train.sh with NNODES=2."""
import os
import os.path as osp
import subprocess
import sys

import torch
from helpers import free_port
from mmengine.config import Config
from mmengine.registry import MODELS, DefaultScope
from tool_runner import ROOT, run_python_together

from sn_mm import SwitchableNorm, revert_sync_sn

TESTS = osp.join(ROOT, 'tests')
PARAMS = ('x_grad', 'mean_weight')


def launch_two_nodes(args, cwd, nproc, env=None):
    """torchrun twice, node ranks 0 and 1 of a 2-node job on one port."""
    port = str(free_port())
    common = [
        '-m', 'torch.distributed.run', '--nnodes', '2', '--nproc_per_node',
        str(nproc), '--master_addr', '127.0.0.1', '--master_port', port
    ]
    return run_python_together(
        [common + ['--node_rank', str(n)] + args for n in (0, 1)],
        cwd,
        env=dict(OMP_NUM_THREADS='1', PYTHONPATH=TESTS, **(env or {})))


def sn_on(x, grad):
    """SN on a batch: what SyncSN over the ranks holding it must give."""
    torch.manual_seed(1)
    layer = SwitchableNorm(6).double()
    xi = x.clone().requires_grad_()
    out = layer(xi)
    out.backward(grad)
    return dict(
        out=out.detach(),
        x_grad=xi.grad,
        mean_weight=layer.mean_weight.grad,
        running_mean=layer.running_mean,
        running_var=layer.running_var)


def test_sync_groups_on_two_nodes_of_two_processes(tmp_path):
    from sync_groups_worker import global_batch
    launch_two_nodes(
        [osp.join(TESTS, 'sync_groups_worker.py'),
         str(tmp_path / 'out')],
        tmp_path,
        nproc=2)
    ranks = [torch.load(tmp_path / f'out.rank{r}.pth') for r in range(4)]
    assert [r['node_rank'] for r in ranks] == ['0', '0', '1', '1']
    x, grad = global_batch(4)
    # Which ranks share statistics under each setting: all four; each
    # node's two; blocks of two (here the same as the nodes).
    for group, blocks in (('None', [[0, 1, 2,
                                     3]]), ('node', [[0, 1],
                                                     [2, 3]]), ('2', [[0, 1],
                                                                      [2,
                                                                       3]])):
        for block in blocks:
            rows = slice(2 * block[0], 2 * block[-1] + 2)
            want = sn_on(x[rows], grad[rows])
            got = [ranks[r][group] for r in block]
            for key in ('out', 'x_grad'):
                torch.testing.assert_close(
                    torch.cat([g[key] for g in got]), want[key])
            # Logit gradients: the block's sum (DDP then averages them).
            torch.testing.assert_close(
                sum(g['mean_weight'] for g in got), want['mean_weight'])
            for g in got:
                torch.testing.assert_close(g['running_mean'],
                                           want['running_mean'])
                torch.testing.assert_close(g['running_var'],
                                           want['running_var'])
    # The node groups differ from the world's: the check can tell them.
    assert not torch.allclose(ranks[0]['node']['running_mean'],
                              ranks[0]['None']['running_mean'])


SYNC_CONFIG = osp.join(ROOT, 'configs', 'toy',
                       'deeplabv3_r18-syncsn-d8_toy-seg.py')


def test_dist_train_on_two_nodes_equals_sn_on_the_combined_batch(
        toy_seg_workspace):
    """tools/dist_train.sh with NNODES=2, once per node rank: the first
    step's SyncSN statistics in the backbone are SN's over both nodes'
    images."""
    cwd = toy_seg_workspace
    (cwd / 'two_nodes.py').write_text(
        f"_base_ = '{SYNC_CONFIG}'\n"
        "custom_imports = dict(imports=['sn_mm', 'sn_state_dump_hook'])\n"
        "custom_hooks = [dict(type='SNFirstStepHook')]\n")
    port = str(free_port())
    processes = [
        subprocess.Popen([
            'bash',
            osp.join(ROOT, 'tools',
                     'dist_train.sh'), 'two_nodes.py', '1', '--work-dir',
            'two_nodes', '--cfg-options', 'train_cfg.max_iters=2',
            'train_dataloader.batch_size=2', 'default_hooks.logger.interval=1'
        ],
                         cwd=cwd,
                         stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT,
                         text=True,
                         env=dict(
                             os.environ,
                             NNODES='2',
                             NODE_RANK=str(node),
                             PORT=port,
                             PYTHON=sys.executable,
                             OMP_NUM_THREADS='1',
                             PYTHONPATH=TESTS)) for node in (0, 1)
    ]
    logs = [p.communicate(timeout=600)[0] for p in processes]
    assert all(p.returncode == 0 for p in processes), logs[0][-3000:]
    assert 'Iter(train) [2/2]' in logs[0]
    ranks = [
        torch.load(cwd / 'two_nodes' / f'first_step_rank{r}.pth')
        for r in range(2)
    ]
    # SN over the combined batch, from the state both ranks started with.
    cfg = Config.fromfile(str(cwd / 'two_nodes.py'))
    with DefaultScope.overwrite_default_scope('mmseg'):
        backbone = revert_sync_sn(MODELS.build(cfg.model.backbone))
    backbone.load_state_dict(ranks[0]['before'])
    backbone.train()
    backbone(torch.cat([r['input'] for r in ranks]))
    expected = backbone.state_dict()
    assert len(ranks[0]['after']) == 2 * sum(
        isinstance(m, SwitchableNorm) for m in backbone.modules())
    for key, value in ranks[0]['after'].items():
        torch.testing.assert_close(value, expected[key], msg=key)
        torch.testing.assert_close(ranks[1]['after'][key], value, msg=key)
    # The two nodes' images differ: SN on one node's alone would not do.
    assert not torch.equal(ranks[0]['input'], ranks[1]['input'])
