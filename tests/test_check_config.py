"""tools/misc/check_config.py: what a config reads, found or missing, in a
real process, before and after the files are there."""
import importlib.util

import torch
from tool_runner import ROOT, run_python, run_python_together, tool

from sn_mm.cli import load_config

TOY = f'{ROOT}/configs/toy/mask-rcnn_r18-sn_fpn_sn-head_toy-coco.py'
FROM_BN = (f'{ROOT}/configs/mask_rcnn/'
           'mask-rcnn_r50-sn-from-bn_fpn_sn-head_2x_coco.py')


def check(config, cwd, env=None, *options):
    return run_python([tool('misc', 'check_config.py'), config, *options],
                      cwd,
                      ok=False,
                      env=env)


def test_missing_data_then_found(tmp_path):
    result = check(TOY, tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    assert 'MISSING data/toy_coco/annotations/instances_train.json' in (
        result.stdout)
    assert 'MISSING data/toy_coco/val/' in result.stdout
    run_python([
        tool('misc', 'make_toy_data.py'), 'coco', '--out', 'data/toy_coco',
        '--num-train', '2', '--num-val', '2', '--size', '32'
    ], tmp_path)
    result = check(TOY, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert 'MISSING' not in result.stdout


def test_checkpoints_by_file_and_by_hub_name(tmp_path):
    """A local checkpoint file, and torchvision://resnet50 in torch's hub
    cache under the file name mmengine downloads it as."""
    env = {'TORCH_HOME': str(tmp_path / 'torch_home')}
    result = check(FROM_BN, tmp_path, env)
    assert result.returncode == 1
    assert ('MISSING torchvision://resnet50 = '
            f'{tmp_path}/torch_home/hub/checkpoints/resnet50-0676ba61.pth'
            in result.stdout), result.stdout
    cache = tmp_path / 'torch_home' / 'hub' / 'checkpoints'
    cache.mkdir(parents=True)
    torch.save({}, cache / 'resnet50-0676ba61.pth')
    found, mine = run_python_together([[
        tool('misc', 'check_config.py'), FROM_BN, *options
    ] for options in (
        [], ['--cfg-options', 'model.backbone.init_cfg.checkpoint=mine.pth'])],
                                      tmp_path,
                                      ok=False,
                                      env=env)
    assert 'found   torchvision://resnet50' in found.stdout
    assert 'MISSING mine.pth  (model.backbone.init_cfg.checkpoint)' in (
        mine.stdout), mine.stdout


RETINANET = f'{ROOT}/configs/toy/retinanet_r18-sn_fpn_sn-head_toy-coco.py'


def shared_heads_report(config, capsys, **changes):
    """What check_config.py prints of ``config``'s shared heads (in this
    process: the function the tool runs), after ``changes`` to the
    config."""
    spec = importlib.util.spec_from_file_location(
        'check_config', tool('misc', 'check_config.py'))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    cfg = load_config(config)
    cfg.merge_from_dict(changes)
    capsys.readouterr()
    module.check_shared_heads(cfg)
    return capsys.readouterr().out


def test_shared_heads_named_and_warned(capsys):
    """RetinaNet's head runs its SN layers on all 5 FPN levels: the config
    keeps each level's statistics, SNRunner would, another runner would
    blend them (a warning); Mask R-CNN's heads run once per RoI batch."""
    one_set = {'model.bbox_head.norm_cfg.num_levels': 1}
    own = shared_heads_report(RETINANET, capsys)
    runner = shared_heads_report(RETINANET, capsys, **one_set)
    other = shared_heads_report(
        RETINANET, capsys, runner_type='Runner', **one_set)
    what = ('bbox_head (RetinaHead) runs 4 SN layers with a BN term on each '
            'of 5 FPN levels')
    assert f'  {what}: num_levels=5 keeps each level\'s BN' in own, own
    assert f'  {what}: SNRunner keeps each level\'s' in runner, runner
    assert f'WARNING {what}: runner_type=\'Runner\' blends' in other, other
    assert 'WARNING' not in own + runner
    assert shared_heads_report(TOY, capsys) == (
        'heads shared across FPN levels:\n  none with SN\'s BN term\n')
