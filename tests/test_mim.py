"""OpenMMLab's `mim` on an installed sn_mm: `mim search sn_mm` lists every
config of model-index.yml and `mim train sn_mm CONFIG` trains one by name.

sn_mm is installed for real (pip under its default build isolation, from a
copy of the repository, into a folder put first on PYTHONPATH), as a user's
`pip install` would; the C++ kernels are left off (SN_MM_NO_EXT=1): this
tests the packaging, not the kernels (tools/misc/wheel_check.py does).
"""
import os
import os.path as osp
import shutil
import subprocess
import sys

import pytest
import yaml

ROOT = osp.dirname(osp.dirname(osp.abspath(__file__)))
MIM = osp.join(osp.dirname(sys.executable), 'mim')
PACKAGED = ('setup.py', 'setup.cfg', 'pyproject.toml', 'MANIFEST.in',
            'requirements', 'sn_mm', 'configs', 'tools', 'model-index.yml')


def model_names():
    with open(osp.join(ROOT, 'model-index.yml')) as f:
        index = yaml.safe_load(f)
    names = []
    for metafile in index['Import']:
        with open(osp.join(ROOT, metafile)) as f:
            names += [m['Name'] for m in yaml.safe_load(f)['Models']]
    return names


@pytest.fixture(scope='module')
def installed(tmp_path_factory):
    """A regular (not editable) install of sn_mm; returns its environment."""
    assert osp.exists(MIM), 'openmim is not installed (make venv does it)'
    work = tmp_path_factory.mktemp('mim')
    src = work / 'src'
    src.mkdir()
    ignore = shutil.ignore_patterns('__pycache__', '*.so', '.mim',
                                    '*.egg-info')
    for name in PACKAGED:
        path = osp.join(ROOT, name)
        if osp.isdir(path):
            shutil.copytree(path, src / name, ignore=ignore)
        else:
            shutil.copy(path, src / name)
    site = work / 'site'
    env = dict(os.environ, SN_MM_NO_EXT='1', PYTHONPATH=str(site))
    subprocess.run([
        sys.executable, '-m', 'pip', 'install', '-q', '--no-deps', '--target',
        str(site),
        str(src)
    ],
                   check=True,
                   env=env,
                   cwd=work)
    assert (site / 'sn_mm' / '.mim' / 'model-index.yml').is_file()
    return work, site, env


def run_mim(args, env, cwd):
    proc = subprocess.run(
        [MIM] + args,
        env=env,
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True)
    assert proc.returncode == 0, proc.stdout[-3000:]
    return proc.stdout


def test_mim_search_lists_every_config(installed):
    work, _, env = installed
    out = run_mim(['search', 'sn_mm'], env, work)
    missing = [n for n in model_names() if f'config id: {n}\n' not in out]
    assert not missing, f'mim search does not list {missing}'


def test_mim_train_runs_a_config_by_name(installed):
    work, site, env = installed
    subprocess.run([
        sys.executable,
        osp.join(ROOT, 'tools/misc/make_toy_data.py'), 'cls', '--out',
        'data/toy_cls', '--num-train', '16', '--num-val', '8', '--size', '32'
    ],
                   check=True,
                   cwd=work)
    out = run_mim([
        'train', 'sn_mm', 'resnet18-sn_toy-cls.py', '--work-dir', 'w',
        '--cfg-options', 'train_cfg.max_epochs=1', 'train_cfg.val_interval=1',
        'train_dataloader.batch_size=8'
    ], env, work)
    installed_config = osp.join(site, 'sn_mm', '.mim', 'configs', 'toy',
                                'resnet18-sn_toy-cls.py')
    assert f'will use {installed_config} instead' in out
    assert 'Training finished successfully' in out
    assert (work / 'w' / 'epoch_1.pth').is_file()
