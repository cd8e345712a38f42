"""Command-line glue that tools/train.py, tools/test.py and the analysis
tools share: reading a config as mmdet's tools do, building the runner,
common flags. It sits above the engine (it builds :class:`SNRunner`)."""
import os
import os.path as osp
from typing import Optional

from mmengine.config import Config, DictAction
from mmengine.registry import RUNNERS
from mmengine.runner import Runner

from .dependencies import check_scope
from .engine import SNRunner
from .models.sync_switchable_norm import end_process_group


def load_config(config: str,
                work_dir: Optional[str] = None,
                cfg_options: Optional[dict] = None,
                launcher: str = 'none') -> Config:
    """Read a config the way mmdet's and mmseg's tools do: CLI options win,
    and the work dir defaults to ``work_dirs/<config name>``."""
    cfg = Config.fromfile(config)
    cfg.launcher = launcher
    if cfg_options:
        cfg.merge_from_dict(cfg_options)
    if work_dir is not None:
        cfg.work_dir = work_dir
    elif cfg.get('work_dir') is None:
        cfg.work_dir = osp.join('work_dirs',
                                osp.splitext(osp.basename(config))[0])
    # The package sn_mm's parts run in: a version outside sn_mm's range
    # stops here, naming the fix, not deep inside a model's build.
    check_scope(cfg.get('default_scope'))
    # Configs that forget it still get SN registered in every process.
    imports = cfg.get('custom_imports', {}).get('imports', [])
    if 'sn_mm' not in imports:
        cfg.custom_imports = dict(
            imports=list(imports) + ['sn_mm'], allow_failed_imports=False)
    return cfg


def build_runner(cfg: Config) -> Runner:
    """The config's ``runner_type`` if it names one, else :class:`SNRunner`
    (mmengine's Runner that can resume under torch >= 2.6)."""
    if 'runner_type' in cfg:
        return RUNNERS.build(cfg)
    return SNRunner.from_cfg(cfg)


def end_distributed() -> None:
    """End the process group of a launcher run once it has succeeded
    (:func:`sn_mm.models.sync_switchable_norm.end_process_group`). Not after
    a failure: other ranks may still be inside a collective."""
    end_process_group()


def parse_tool_args(parser, argv=None):
    """Add the flags train.py and test.py share (mmdet's), parse, and make
    LOCAL_RANK visible to mmengine as torch.distributed.launch would."""
    _add_common_args(parser)
    args = parser.parse_args(argv)
    os.environ.setdefault('LOCAL_RANK', str(args.local_rank))
    return args


def _add_common_args(parser) -> None:
    parser.add_argument(
        '--work-dir',
        help='where logs and checkpoints go '
        '(default: work_dirs/<config name>)')
    parser.add_argument(
        '--cfg-options',
        nargs='+',
        action=DictAction,
        help='override config entries, key=value (e.g. '
        'train_dataloader.batch_size=4 or model.backbone.init_cfg=None)')
    parser.add_argument(
        '--launcher',
        choices=['none', 'pytorch', 'slurm', 'mpi'],
        default='none',
        help='job launcher')
    # torch.distributed.launch passes --local-rank; torchrun sets LOCAL_RANK.
    parser.add_argument('--local_rank', '--local-rank', type=int, default=0)
