#!/usr/bin/env python
"""Before a training run: does this machine have what CONFIG needs?

Lists the dataset files and folders the config's dataloaders read (their
``data_root``, ``ann_file`` and ``data_prefix``, as mmengine's datasets join
them) and the pretrained checkpoints its ``init_cfg`` entries load, marks
each as found or missing, and exits 1 if anything is missing. It also
builds the model's dense heads alone (nothing is loaded) and names the SN
layers with a BN term that such a head runs on every FPN level: SNRunner
keeps each level's BN statistics there; another runner would blend them
(a warning). Example::

    python tools/misc/check_config.py \\
        configs/mask_rcnn/mask-rcnn_r50-sn_fpn_sn-head_2x_coco.py
"""
import argparse
import os.path as osp
import sys
from urllib.parse import urlparse

import torch
from mmengine.config import DictAction
from mmengine.runner.checkpoint import (get_deprecated_model_names,
                                        get_external_models,
                                        get_torchvision_models)

import sn_mm  # noqa: F401  (registers SN, for configs' custom_imports)
from sn_mm.cli import load_config
from sn_mm.engine.runner import CHECKPOINT_DOC, pretrained_checkpoints
from sn_mm.models.shared_heads import head_levels, shared_sn_layers

LOADERS = ('train_dataloader', 'val_dataloader', 'test_dataloader')


def datasets(cfg):
    """Every dataset config under ``cfg`` (wrappers such as RepeatDataset
    and ConcatDataset included)."""
    if isinstance(cfg, dict):
        if 'data_root' in cfg or 'ann_file' in cfg:
            yield cfg
        for value in cfg.values():
            yield from datasets(value)
    elif isinstance(cfg, (list, tuple)):
        for value in cfg:
            yield from datasets(value)


def data_paths(cfg):
    """(what, path) of each file or folder the dataloaders read."""
    seen = set()
    for loader in LOADERS:
        for dataset in datasets(cfg.get(loader) or {}):
            root = dataset.get('data_root') or ''
            prefix = dataset.get('data_prefix') or {}
            prefixes = prefix.values() if isinstance(prefix,
                                                     dict) else [prefix]
            named = [('data_root', root)] if root else []
            named += [('ann_file', dataset.get('ann_file'))]
            named += [('data_prefix', p) for p in prefixes]
            for what, path in named:
                if not path:
                    continue
                if what != 'data_root' and not osp.isabs(path):
                    path = osp.join(root, path)
                if path not in seen:
                    seen.add(path)
                    yield f'{loader}: {what}', path


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('config', help='the config to check')
    parser.add_argument(
        '--cfg-options',
        nargs='+',
        action=DictAction,
        help='as tools/train.py takes them (e.g. a checkpoint path)')
    args = parser.parse_args(argv)
    cfg = load_config(args.config, cfg_options=args.cfg_options)

    missing = 0
    print('data:')
    for what, path in data_paths(cfg):
        found = osp.exists(path)
        missing += not found
        print(f'  {"found  " if found else "MISSING"} {path}  ({what})')
    print('pretrained checkpoints:')
    for key, name in pretrained_checkpoints(cfg.get('model', {})):
        path = hub_file(name) if '://' in name else name
        found = path is not None and osp.exists(path)
        missing += not found
        where = f' = {path}' if path != name else ''
        print(f'  {"found  " if found else "MISSING"} {name}{where}  ({key})')
    check_shared_heads(cfg)
    if missing:
        print(f'{missing} missing. The data go where mmdet and mmseg '
              'expect them (docs/get_started.md#before-a-training-run); '
              f'{CHECKPOINT_DOC} says where each checkpoint comes from '
              '(mmengine downloads the hub cache\'s files where the machine '
              'may).')
        return 1
    print('everything the config reads is here')
    return 0


def check_shared_heads(cfg):
    """Print each dense head of the model that runs SN layers with a BN
    term on every FPN level, and warn where the config's runner would blend
    the levels' BN statistics."""
    from mmengine.registry import MODELS, init_default_scope
    model = cfg.get('model') or {}
    heads = {
        key: value
        for key, value in model.items()
        if key.endswith('head') and isinstance(value, dict) and 'type' in value
    }
    if not heads:
        return
    init_default_scope(cfg.get('default_scope') or 'mmdet')
    runner = cfg.get('runner_type', 'SNRunner')
    print('heads shared across FPN levels:')
    found = False
    for key, head_cfg in heads.items():
        try:
            head = MODELS.build(head_cfg)
        except Exception as error:  # e.g. a head that needs its detector
            print(f'  {key}: not checked (building it alone failed: '
                  f'{type(error).__name__}: {error})')
            continue
        levels = head_levels(head)
        shared = shared_sn_layers(head, levels) if levels > 1 else []
        if not shared:
            continue
        found = True
        what = (f'  {key} ({type(head).__name__}) runs {len(shared)} SN '
                f'layers with a BN term on each of {levels} FPN levels')
        if all(m.num_levels == levels for _, m in shared):
            print(f'{what}: num_levels={levels} keeps each level\'s BN '
                  'statistics')
        elif runner == 'SNRunner':
            print(f'{what}: SNRunner keeps each level\'s BN statistics')
        else:
            print(f'WARNING {what[2:]}: runner_type={runner!r} blends the '
                  'levels\' BN statistics at test time; use SNRunner (drop '
                  'runner_type) or norm_cfg=dict(type=\'SN\', '
                  f'num_levels={levels}) in the head')
    if not found:
        print('  none with SN\'s BN term')


def hub_file(name):
    """Where mmengine finds ``torchvision://`` and ``open-mmlab://`` names:
    torch's hub cache, under the file name of the URL they stand for (None
    for a scheme it does not map to a URL)."""
    scheme, _, model = name.partition('://')
    if scheme == 'torchvision':
        url = get_torchvision_models().get(model)
    elif scheme in ('open-mmlab', 'openmmlab'):
        model = get_deprecated_model_names().get(model, model)
        url = get_external_models().get(model)
    else:
        return None
    if not url or not url.startswith(('http://', 'https://')):
        return None
    return osp.join(torch.hub.get_dir(), 'checkpoints',
                    osp.basename(urlparse(url).path))


if __name__ == '__main__':
    sys.exit(main())
