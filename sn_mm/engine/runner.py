"""mmengine's Runner, able to resume under torch >= 2.6."""
import contextlib
import functools

import torch
from mmengine.registry import RUNNERS
from mmengine.runner import Runner


@contextlib.contextmanager
def trusted_torch_load():
    """Make ``torch.load`` default to ``weights_only=False`` inside the block.

    torch >= 2.6 loads with ``weights_only=True``; mmengine 0.10.7 does not
    pass the argument, and its own training checkpoints hold mmengine and
    numpy objects (the message hub's HistoryBuffers) that the safe loader
    refuses -- so ``--resume`` fails. Allow-listing them would mean allowing
    ``builtins.getattr``, which defeats the safe loader, so instead only the
    resume of the run's own checkpoint is trusted; pretrained weights
    (``load_from``, ``init_cfg``) keep the safe default.
    """
    original = torch.load

    @functools.wraps(original)
    def load(*args, **kwargs):
        kwargs.setdefault('weights_only', False)
        return original(*args, **kwargs)

    torch.load = load
    try:
        yield
    finally:
        torch.load = original


@RUNNERS.register_module()
class SNRunner(Runner):
    """mmengine's Runner whose ``resume`` works with torch >= 2.6.

    ``tools/train.py`` uses it unless a config names another ``runner_type``.
    """

    def resume(self, *args, **kwargs):
        with trusted_torch_load():
            return super().resume(*args, **kwargs)
