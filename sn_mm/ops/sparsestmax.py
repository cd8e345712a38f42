"""Sparsemax and SparsestMax, the ratio functions of Sparse Switchable
Normalization (SSN, Shao et al., CVPR 2019).

``sparsemax(z)`` is the Euclidean projection of ``z`` onto the probability
simplex (Martins & Astudillo, 2016). ``sparsestmax(z, r)`` adds SSN's
constraint that the result lie at least ``r`` from the simplex centre
``u = 1/K``: as ``r`` grows from 0 to 1 during training, every ratio vector
is pushed out to a vertex (one-hot), where SSN fixes it.

Both are written as differentiable PyTorch ops without branches on tensor
values: autograd gives their exact (piecewise) Jacobians, nothing waits on
the device, and tracers see one graph.
"""
import math

import torch
from torch import Tensor


def sparsemax(z: Tensor) -> Tensor:
    """Euclidean projection of the vector ``z`` (K,) onto the simplex."""
    if z.dim() != 1:
        raise ValueError(f'sparsemax expects a vector, got shape '
                         f'{tuple(z.shape)}')
    sorted_z = torch.sort(z, descending=True).values
    k = torch.arange(1, z.numel() + 1, dtype=z.dtype, device=z.device)
    excess = sorted_z.cumsum(0) - 1
    # The support is a prefix of the sorted values (the first always in).
    support = (sorted_z - excess / k > 0).sum()
    tau = excess.gather(0, (support - 1).reshape(1)) / support.to(z.dtype)
    return (z - tau).clamp_min(0)


def sparsestmax(z: Tensor, radius) -> Tensor:
    """SparsestMax of the vector ``z`` (K = 2 or 3 values) at ``radius``
    (a float or a 0-d/1-element tensor, 0 to 1).

    The sparsemax ``p`` if it lies at least ``radius`` from the centre
    ``u``; otherwise ``p`` moved radially out to the circle of that radius
    around ``u`` in the simplex's plane; and where that circle point leaves
    the simplex (the recursive case), the circle's intersection with the
    face of the largest entries, on the side of the largest (K = 3: the edge
    of the top two; K = 2: the top vertex). Radius >= the vertex distance
    gives one-hot vectors. As in SSN, an exactly uniform ``p`` (all logits
    equal), from which no direction leads to the circle, stays uniform and
    takes sparsemax's gradient (so does one within rounding of it).
    """
    num = z.numel()
    if z.dim() != 1 or num not in (2, 3):
        raise ValueError(f'sparsestmax expects a vector of 2 or 3 logits, '
                         f'got shape {tuple(z.shape)}')
    r = torch.as_tensor(radius, dtype=z.dtype, device=z.device).reshape(())
    p = sparsemax(z)
    u = 1. / num
    # Within the simplex's plane (sum 0) even where rounding is not.
    offset = p - p.mean()
    dist2 = offset.square().sum()
    # Closer to u than rounding can tell: no direction, stays uniform.
    moved = dist2 > (10 * torch.finfo(z.dtype).eps)**2
    # Masked so that neither branch divides by zero (no NaN gradients).
    dist = torch.where(moved, dist2, torch.ones_like(dist2)).sqrt()
    radial = torch.where(moved, u + r * offset / dist, p)
    # The face of the largest entries (stable order: ties go to the first)
    # and the circle's radius within it (the face centre's offset from u is
    # orthogonal to the face).
    order = torch.sort(z, descending=True, stable=True).indices
    face_centre_dist2 = 1. / (num - 1) - 1. / num
    if num == 3:
        half_chord = (r.square() - face_centre_dist2).clamp_min(0).sqrt()
        top = (0.5 + half_chord / math.sqrt(2)).clamp(max=1)
        face_values = torch.stack([top, 1 - top, torch.zeros_like(top)])
    else:  # K = 2: the face is the top vertex
        face_values = torch.stack([torch.ones_like(r), torch.zeros_like(r)])
    on_face = torch.zeros_like(p).scatter(0, order, face_values)
    inside = torch.where(radial.min() < 0, on_face, radial)
    return torch.where(dist2 >= r.square(), p, inside)


def is_one_hot(ratio: Tensor) -> Tensor:
    """Whether a ratio vector is one-hot (SSN's test, max - min >= 1, less
    a rounding: ``z - (z - 1)`` need not be exactly 1), as a bool tensor (no
    host synchronisation)."""
    return ratio.max() - ratio.min() >= 1 - 1e-9
