"""mmengine hooks for SN: batch-average statistics and ratio logging."""
from typing import Optional

from mmengine.hooks import Hook
from mmengine.model import is_model_wrapper
from mmengine.registry import HOOKS
from mmengine.runner import IterBasedTrainLoop

from ..analysis import SW_TERMS, average_ratios, sn_ratios, sw_weights
from ..models import SwitchableNorm, SwitchableWhitening, fuse_conv_sn
from ..ops.ratios import TERMS
from .batch_average import BatchAverageProgress, sn_batch_average


def _unwrap(model):
    return model.module if is_model_wrapper(model) else model


@HOOKS.register_module()
class SNBatchAverageHook(Hook):
    """Re-estimate SN's BN statistics by batch average (the paper's
    inference) instead of using the moving average.

    The network is frozen and fed ``num_batches`` training batches in
    training-statistics mode; each SN layer's running mean and variance
    become the averages over them (all ranks together). No parameter or other
    buffer changes.

    Args:
        num_batches (int): Batches per rank. Default: 100.
        before_val (bool): Before every validation. Default: True.
        after_train (bool): After the last training iteration or epoch,
            before the final checkpoint is written. Default: True.
        dataloader (dict, optional): Where the batches come from. Default:
            the config's ``train_dataloader`` (a separate loader, so training
            iteration is not disturbed).
        progress_interval (int, optional): Log the batches done on each rank
            every this many batches. Default: every 5% of ``num_batches``.
    """

    priority = 'NORMAL'  # before CheckpointHook (VERY_LOW) saves the model

    def __init__(self,
                 num_batches: int = 100,
                 before_val: bool = True,
                 after_train: bool = True,
                 dataloader: Optional[dict] = None,
                 progress_interval: Optional[int] = None) -> None:
        if num_batches < 1:
            raise ValueError(f'num_batches must be >= 1, got {num_batches}')
        if progress_interval is not None and progress_interval < 1:
            raise ValueError(f'progress_interval must be >= 1, got '
                             f'{progress_interval}')
        self.progress_interval = progress_interval
        self.num_batches = num_batches
        # Not self.before_val/after_train: those are Hook methods.
        self.at_val = before_val
        self.at_end = after_train
        self.dataloader_cfg = dataloader
        self._loader = None
        self._done_at = None  # training iterations when last averaged

    def _average(self, runner, done_iters: int) -> None:
        """Average unless already done at this point of training (the last
        iteration's hooks, the final validation and the epoch's end all
        follow each other)."""
        if self._done_at == done_iters:
            return
        if self._loader is None:
            cfg = self.dataloader_cfg or runner.cfg.train_dataloader
            self._loader = runner.build_dataloader(cfg, seed=runner.seed)
        model = runner.model
        progress = BatchAverageProgress(self.num_batches,
                                        self.progress_interval,
                                        runner.logger.info)
        seen = sn_batch_average(
            _unwrap(model),
            self._loader,
            model.test_step,
            self.num_batches,
            progress=progress)
        self._done_at = done_iters
        runner.logger.info(f'SN batch average: BN statistics of every SN '
                           f'layer re-estimated from {seen} batches')

    def after_train_iter(self,
                         runner,
                         batch_idx,
                         data_batch=None,
                         outputs=None) -> None:
        # Iteration-based loops save the final checkpoint here.
        if (self.at_end and isinstance(runner.train_loop, IterBasedTrainLoop)
                and self.is_last_train_iter(runner)):
            self._average(runner, runner.iter + 1)

    def after_train_epoch(self, runner) -> None:
        if self.at_end and self.is_last_train_epoch(runner):
            self._average(runner, runner.iter)

    def before_val_epoch(self, runner) -> None:
        if self.at_val:
            self._average(runner, runner.iter)


@HOOKS.register_module()
class SNRatioHook(Hook):
    """Log SN's importance ratios every ``interval`` training iterations.

    The model averages go to the message hub as ``train/sn_{mean,var}_
    {in,ln,bn}``, so they appear in the text log and, through LoggerHook, in
    every visualizer backend (local scalars.json, TensorBoard, ...). Each
    layer's ratios go to the visualizer backends as ``sn_ratio/<layer>/
    {mean,var}_{in,ln,bn}`` and, with ``log_layers``, to the text log.

    Switchable Whitening layers (SW, SyncSW) log their importance weights
    the same way: ``train/sw_{mean,var}_{bw,iw,bn,in,ln}`` (``var``: the
    covariance's) and ``sw_weight/<layer>/...``.

    It also logs ``train/sn_nonfinite_batches``, the training batches whose
    batch statistics were not finite (summed over the SN and SW layers'
    counts; such a batch leaves the running statistics as they were), with a
    warning naming the layers whenever the count has grown.
    """

    def __init__(self, interval: int = 500, log_layers: bool = True) -> None:
        if interval < 1:
            raise ValueError(f'interval must be >= 1, got {interval}')
        self.interval = interval
        self.log_layers = log_layers
        self._nonfinite = 0

    def _log_nonfinite(self, runner, model) -> None:
        counts = {
            name: int(m.nonfinite_batches)
            for name, m in model.named_modules()
            if isinstance(m, (SwitchableNorm, SwitchableWhitening))
            and m.nonfinite_batches is not None
        }
        total = sum(counts.values())
        runner.message_hub.update_scalar('train/sn_nonfinite_batches', total)
        if total > self._nonfinite:
            runner.logger.warning(
                'SN: batches with non-finite BN statistics (running '
                'statistics not updated for them): ' +
                ', '.join(f'{name}: {n}' for name, n in counts.items() if n))
        self._nonfinite = total

    def after_train_iter(self,
                         runner,
                         batch_idx,
                         data_batch=None,
                         outputs=None) -> None:
        if not (self.every_n_train_iters(runner, self.interval)
                or self.is_last_train_iter(runner)):
            return
        model = _unwrap(runner.model)
        found = False
        for kind, ratios, terms, tag in (('SN ratios', sn_ratios(model), TERMS,
                                          'sn'), ('SW importance weights',
                                                  sw_weights(model), SW_TERMS,
                                                  'sw')):
            if ratios:
                found = True
                self._log(runner, kind, ratios, terms, tag)
        if found:
            self._log_nonfinite(runner, model)

    def _log(self, runner, kind, ratios, terms, tag) -> None:
        for stat, values in average_ratios(ratios, terms).items():
            for term, value in values.items():
                runner.message_hub.update_scalar(f'train/{tag}_{stat}_{term}',
                                                 value)
        prefix = 'sn_ratio' if tag == 'sn' else 'sw_weight'
        runner.visualizer.add_scalars(
            {
                f'{prefix}/{layer}/{stat}_{term}': value
                for layer, r in ratios.items()
                for stat, values in r.items()
                for term, value in values.items()
            },
            step=runner.iter + 1)
        if self.log_layers:
            lines = [
                f'{layer}: ' +
                '  '.join(f'{stat} ' + ' '.join(f'{t}={v:.3f}'
                                                for t, v in values.items())
                          for stat, values in r.items())
                for layer, r in ratios.items()
            ]
            runner.logger.info(f'{kind} at iter {runner.iter + 1}:\n' +
                               '\n'.join(lines))


@HOOKS.register_module()
class SNFuseHook(Hook):
    """Before testing (after the checkpoint is loaded), fold SN layers with
    hard fixed ratios away (:func:`sn_mm.fuse_conv_sn`): BN/BN layers into
    the preceding conv, others to the one statistic they select.
    ``tools/test.py --fuse-conv-sn`` adds it."""

    def before_test(self, runner) -> None:
        model = _unwrap(runner.model)
        before = sum(1 for _ in model.modules())
        fuse_conv_sn(model)
        runner.logger.info(
            f'fuse_conv_sn: {before - sum(1 for _ in model.modules())} '
            'modules fewer')


@HOOKS.register_module()
class SSNRadiusHook(Hook):
    """Grow SparsestMax's radius in every Sparse SN layer
    (``norm_cfg=dict(type='SN', ratio_fn='sparsestmax')``) linearly over
    training, as the SSN authors do: before each training iteration it is
    ``start + (end - start) * iter / max_iters``. It follows the runner's
    iteration count, so a resumed run continues where it stopped; the radius
    is also in each layer's state dict. Ratio vectors that reach a vertex
    (one-hot) are fixed by the layers themselves.

    Args:
        start (float): Radius at the first iteration. Default: 0.
        end (float): Radius after the last. Default: 1.
    """

    priority = 'NORMAL'

    def __init__(self, start: float = 0., end: float = 1.) -> None:
        if not 0 <= start <= end <= 1:
            raise ValueError(f'need 0 <= start <= end <= 1, got start='
                             f'{start}, end={end}')
        self.start, self.end = start, end

    def _layers(self, runner):
        return [
            m for m in _unwrap(runner.model).modules()
            if isinstance(m, SwitchableNorm) and m.radius is not None
        ]

    def before_train(self, runner) -> None:
        self._found = self._layers(runner)
        if not self._found:
            raise RuntimeError(
                'SSNRadiusHook: the model has no SN layer with '
                "ratio_fn='sparsestmax' (use norm_cfg=dict(type='SN', "
                "ratio_fn='sparsestmax'))")

    def radius_at(self, iteration: int, max_iters: int) -> float:
        frac = min(max(iteration / max(max_iters, 1), 0.), 1.)
        return self.start + (self.end - self.start) * frac

    def before_train_iter(self, runner, batch_idx, data_batch=None) -> None:
        radius = self.radius_at(runner.iter, runner.max_iters)
        layers = getattr(self, '_found', None) or self._layers(runner)
        for layer in layers:
            layer.set_radius(radius)
