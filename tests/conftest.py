import functools
import os

import mmengine.config.utils
import pytest
import torch

# Without a GPU, Triton kernels run in Triton's interpreter on CPU tensors.
# Triton reads this when a kernel is defined, so it is set before any test
# imports sn_mm's Triton kernels.
if not torch.cuda.is_available():
    os.environ.setdefault('TRITON_INTERPRET', '1')


def _read_metafiles_once():
    """mmengine resolves each 'mmseg::' or 'mmdet::' base of a config by
    reading every metafile of the package (53 YAML files for mmseg, about
    0.3 s) and keeps nothing; the suite parses about 150 configs with
    several such bases each. The files do not change while it runs, so each is
    read once; mmengine's lookup runs as it is."""
    load = mmengine.config.utils.load
    cached = functools.lru_cache(maxsize=None)(load)

    def read(path, *args, **kwargs):
        if not args and not kwargs and str(path).endswith(('.yml', '.yaml')):
            return cached(str(path))
        return load(path, *args, **kwargs)

    mmengine.config.utils.load = read


_read_metafiles_once()


def pytest_configure(config):
    """Under pytest-xdist each worker's torch, and the tools its tests
    start, gets its share of the cores: two workers of two OpenMP threads
    on two cores wait in each other's barriers (four of the heaviest files
    took 191 s that way, 135 s with one thread a worker). Tests of the
    kernels' splitting across threads set their thread counts themselves.
    """
    workerinput = getattr(config, 'workerinput', None)
    if workerinput is None:
        return
    share = max(1, (os.cpu_count() or 1) // int(workerinput['workercount']))
    os.environ.setdefault('OMP_NUM_THREADS', str(share))
    torch.set_num_threads(int(os.environ['OMP_NUM_THREADS']))


# The longest test files, longest first (each over 60 s on the 2-core VM,
# from `make test`'s --durations). pytest-xdist hands out whole files in
# the order they are collected, and with two workers the suite ends when
# its last file does: started first, these leave the short files to fill
# in at the end (the suite in 918 s in alphabetical order, 894 s so).
LONGEST_FIRST = ('test_triton_fused.py', 'test_runner_features.py',
                 'test_benchmark_norm.py', 'test_tools_toy_coco.py',
                 'test_numerics.py', 'test_gpu_check.py',
                 'test_seg_syncsn_distributed.py', 'test_seg_configs.py',
                 'test_sn2mm.py', 'test_export.py', 'test_sparse_sn.py')


def pytest_collection_modifyitems(session, config, items):
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    # (A stable sort: each file's tests stay together and in order.)
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))


def pytest_report_header(config):
    from sn_mm.ops import cpu_isa, cpu_isas
    if cpu_isa() is None:
        return "SN's C++ kernels: not built"
    return (f"SN's C++ kernels: {cpu_isa()} (this CPU runs "
            f"{', '.join(cpu_isas())}; each test of tests/test_native_kernels"
            ".py runs under every one)")


@pytest.fixture(scope='session')
def toy_seg_data(tmp_path_factory):
    """A small toy segmentation set, made once per test session."""
    from sn_mm.testing import make_toy_seg
    root = tmp_path_factory.mktemp('toy_seg_data') / 'toy_seg'
    make_toy_seg(str(root), num_train=8, num_val=4, size=64)
    return root


@pytest.fixture(scope='module')
def toy_seg_workspace(tmp_path_factory, toy_seg_data):
    """A fresh folder per test module whose ``data/toy_seg`` is the toy set,
    where the toy configs' relative data roots point."""
    cwd = tmp_path_factory.mktemp('seg_workspace')
    (cwd / 'data').mkdir()
    (cwd / 'data' / 'toy_seg').symlink_to(toy_seg_data)
    return cwd
