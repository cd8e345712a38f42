"""A torchrun worker for tests/test_multi_node.py: SyncSN layers sharing
BN statistics over each group setting, run on this rank's share of one
global batch; writes the outputs, gradients and running statistics to
OUT.rank{RANK}.pth."""
import os
import sys

import torch
import torch.distributed as dist

from sn_mm import SyncSwitchableNorm
from sn_mm.models.sync_switchable_norm import end_process_group

GROUPS = (None, 'node', 2)


def global_batch(world):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(world * 2, 6, 4, 5, generator=gen, dtype=torch.float64)
    return x * 2 + 1, torch.randn(x.shape, generator=gen, dtype=torch.float64)


def main(path):
    dist.init_process_group('gloo')
    rank, world = dist.get_rank(), dist.get_world_size()
    x, grad = global_batch(world)
    share = slice(2 * rank, 2 * rank + 2)
    results = {}
    for group in GROUPS:
        torch.manual_seed(1)
        layer = SyncSwitchableNorm(6, group=group).double()
        xi = x[share].clone().requires_grad_()
        out = layer(xi)
        out.backward(grad[share])
        results[str(group)] = dict(
            out=out.detach(),
            x_grad=xi.grad,
            mean_weight=layer.mean_weight.grad,
            running_mean=layer.running_mean.clone(),
            running_var=layer.running_var.clone())
    results['node_rank'] = os.environ['GROUP_RANK']
    torch.save(results, f'{path}.rank{rank}.pth')
    assert end_process_group(), 'the process group outlived its teardown'


if __name__ == '__main__':
    main(sys.argv[1])
