"""Whether two runs of SN agree: one path's outputs, gradients and running
statistics against another's. The fused kernels' self-check on a new device
(:func:`sn_mm.ops.triton_targets.works_on`) and the agreement sweep of the
tests and the GPU check (:mod:`sn_mm.testing.kernel_agreement`) both judge
by it."""
from typing import Dict, Optional

from torch import Tensor


def worst_difference(got: Dict[str, Optional[Tensor]],
                     want: Dict[str, Optional[Tensor]], tol: float,
                     case: str) -> float:
    """The largest difference between ``got`` and ``want`` entry by entry,
    relative to ``1 + max |want|``; raises AssertionError naming ``case``
    and the entry where it exceeds ``tol``, where an entry is None on one
    side only, where a dtype or shape differs, or where integer entries
    (counters) are not equal."""
    worst = 0.
    for key, expected in want.items():
        value = got[key]
        if (value is None) != (expected is None):
            raise AssertionError(f'{case}: {key} is None on one path only')
        if expected is None:
            continue
        if value.dtype != expected.dtype or value.shape != expected.shape:
            raise AssertionError(f'{case}: {key} {value.dtype} '
                                 f'{tuple(value.shape)} != {expected.dtype} '
                                 f'{tuple(expected.shape)}')
        if not expected.is_floating_point():
            if not bool((value == expected).all()):
                raise AssertionError(f'{case}: {key} {value} != {expected}')
            continue
        value, expected = value.detach().double(), expected.detach().double()
        err = float((value - expected).abs().max())
        relative = err / (1 + float(expected.abs().max()))
        worst = max(worst, relative)
        if not relative <= tol:
            raise AssertionError(f'{case}: {key} differs by {err:.2e}')
    return worst
