"""The training commands of README.md and docs/get_started.md start from
files a user can obtain: none names a checkpoint that the checkpoint table
of docs/configs_and_checkpoints.md marks unpublished, read with
tools/misc/check_config.py's logic (the config as tools/train.py reads it,
its options applied, every ``init_cfg`` checkpoint)."""
import glob
import os.path as osp
import re
import shlex

import pytest
from helpers import load_tool
from tool_runner import ROOT

from sn_mm.cli import load_config
from sn_mm.engine.runner import pretrained_checkpoints

DOCS = ('README.md', 'docs/get_started.md')
TABLE = 'docs/configs_and_checkpoints.md'
# How each launcher takes its config: the index of the config among the
# words after the launcher, and whether the words after the config are
# tools/train.py's options.
LAUNCHERS = {
    'tools/train.py': (0, True),
    'tools/dist_train.sh': (0, True),  # CONFIG GPUS [train.py options]
    'tools/slurm_train.sh': (2, True),  # PARTITION JOB CONFIG WORK_DIR ...
    'train': (1, False),  # mim train sn_mm CONFIG_NAME [mim options]
}


def read(doc):
    return open(osp.join(ROOT, doc)).read()


def shell_commands(text):
    """Every command of a markdown text's bash blocks, continuation lines
    joined and comments dropped."""
    for block in re.findall(r'```bash\n(.*?)```', text, re.S):
        for line in block.replace('\\\n', ' ').splitlines():
            line = line.strip()
            if line and not line.startswith('#'):
                yield shlex.split(line, comments=True)


def training_commands(text):
    """(command, config path, train.py options) of every training command
    in a markdown text."""
    for words in shell_commands(text):
        for i, word in enumerate(words):
            launcher = next((k for k in LAUNCHERS if word.endswith(k)), None)
            if launcher is None or (launcher == 'train'
                                    and words[i - 1:i] != ['mim']):
                continue
            at, takes_options = LAUNCHERS[launcher]
            config = words[i + 1 + at]
            if launcher == 'train':
                config = find_config(config)
            rest = words[i + 2 + at:]
            if launcher == 'tools/dist_train.sh':
                rest = rest[1:]  # GPUS
            elif launcher == 'tools/slurm_train.sh':
                rest = rest[1:]  # WORK_DIR
            yield ' '.join(words), config, rest if takes_options else []
            break


def find_config(name):
    found = glob.glob(osp.join(ROOT, 'configs', '**', name), recursive=True)
    assert len(found) == 1, name
    return found[0]


def unpublished_checkpoints():
    """The checkpoint files the table marks as not published."""
    rows = [
        line for line in read(TABLE).splitlines()
        if line.startswith('| `') and '**not published**' in line
    ]
    return {re.match(r'\| `([^`]+)`', row).group(1) for row in rows}


def starts_from(config, options):
    """Every checkpoint the command's config loads, as check_config.py
    lists them."""
    args = load_tool('train.py').parse_args([config, *options])
    cfg = load_config(osp.join(ROOT, config), cfg_options=args.cfg_options)
    return [path for _, path in pretrained_checkpoints(cfg.get('model', {}))]


def test_the_table_names_the_unpublished_start():
    assert 'resnet50_sn_8x2_mm.pth' in unpublished_checkpoints()


@pytest.mark.parametrize('doc', DOCS)
def test_training_commands_start_from_published_files(doc):
    unpublished = unpublished_checkpoints()
    commands = list(training_commands(read(doc)))
    assert len(commands) >= 3, commands
    checked = 0
    for command, config, options in commands:
        if config.isupper():  # a placeholder, CONFIG
            continue
        assert osp.exists(osp.join(ROOT, config)), command
        for path in starts_from(config, options):
            assert osp.basename(path) not in unpublished, (
                f'{command!r} starts from {path}, which {TABLE} marks as '
                'not published')
        checked += 1
    assert checked >= 2


def test_the_check_can_fail():
    """The paper's (8,2) config as it is starts from the unpublished file."""
    config = 'configs/mask_rcnn/mask-rcnn_r50-sn_fpn_sn-head_2x_coco.py'
    paths = starts_from(config, [])
    assert any(osp.basename(p) in unpublished_checkpoints() for p in paths)
    commands = list(
        training_commands(f'```bash\nbash tools/dist_train.sh {config} '
                          '8 --cfg-options model.backbone.init_cfg.'
                          'checkpoint=checkpoints/x.pth\n```\n'))
    assert [c[2] for c in commands] == [[
        '--cfg-options', 'model.backbone.init_cfg.checkpoint='
        'checkpoints/x.pth'
    ]]
    assert starts_from(config, commands[0][2]) == ['checkpoints/x.pth']
