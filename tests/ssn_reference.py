"""Independent references for Sparse SN: sparsemax by bisection on its
threshold, SparsestMax by enumerating the candidate minimisers of its
definition, and the released SSN layer's layout and forward.

SparsestMax(z, r) is the point of the simplex at least r from its centre
u = 1/K nearest to z. The feasible set's minimiser is the simplex
projection (sparsemax) where that is feasible, else on the boundary: a
circle arc (nearest point: z's radial projection onto the circle, or an
arc end where the circle meets an edge), an edge segment outside the
circle (nearest point: z's projection onto the edge, or a segment end), or
a vertex. All are enumerated exactly and the nearest feasible one wins.
"""
import itertools
import math

import torch
from released_sn_resnet import ReleasedSwitchNorm2d


def sparsemax_by_bisection(z, iters=200):
    """The tau with sum(max(z - tau, 0)) = 1, found by bisection."""
    z = z.double()
    lo, hi = float(z.min()) - 1, float(z.max())
    for _ in range(iters):
        mid = (lo + hi) / 2
        if float((z - mid).clamp_min(0).sum()) > 1:
            lo = mid
        else:
            hi = mid
    return (z - (lo + hi) / 2).clamp_min(0)


def _feasible(p, u, r, tol=1e-12):
    return bool((p >= -tol).all()) and float((p - u).norm()) >= r - 1e-9


def sparsestmax_by_candidates(z, r):
    """SparsestMax of z (K = 2 or 3) at radius r, by its definition. A
    radius beyond the vertices' distance leaves only the nearest vertex."""
    z = z.double()
    k = z.numel()
    u = torch.full((k, ), 1. / k, dtype=torch.float64)
    r = min(float(r), math.sqrt(1 - 1. / k) - 1e-12)
    candidates = [sparsemax_by_bisection(z)]
    candidates += list(torch.eye(k, dtype=torch.float64))
    plane = z - (z.sum() - 1) / k
    if float((plane - u).norm()) > 0:
        candidates.append(u + r * (plane - u) / (plane - u).norm())
    for i, j in itertools.combinations(range(k), 2):
        # The edge e_i..e_j: points a e_i + (1 - a) e_j.
        ei, ej = torch.eye(k, dtype=torch.float64)[[i, j]]
        d = ei - ej
        a_proj = float((z - ej) @ d / (d @ d))
        a_values = [min(max(a_proj, 0.), 1.)]
        # where the circle meets the edge: |ej + a d - u| = r
        q = ej - u
        a2, b2, c2 = float(d @ d), 2 * float(q @ d), float(q @ q) - r * r
        disc = b2 * b2 - 4 * a2 * c2
        if disc >= 0:
            a_values += [(-b2 + s * math.sqrt(disc)) / (2 * a2)
                         for s in (-1, 1)]
        candidates += [ej + a * d for a in a_values if 0 <= a <= 1]
    best = min((p for p in candidates if _feasible(p, u, r)),
               key=lambda p: float((p - z).square().sum()))
    return best


class ReleasedSSN2d(ReleasedSwitchNorm2d):
    """The released SSN2d layout: SN's, plus the buffers ``mean_fixed`` and
    ``var_fixed`` (int64, (1,)) and ``radius`` ((1,)). A fixed layer's
    ``mean_weight``/``var_weight`` hold the one-hot ratio vector itself;
    otherwise the ratios are SparsestMax of the logits at the radius."""

    def __init__(self, c, using_bn=True, momentum=0.9, eps=1e-5):
        super().__init__(c, using_bn, momentum, eps)
        self.register_buffer('mean_fixed', torch.zeros(1, dtype=torch.long))
        self.register_buffer('var_fixed', torch.zeros(1, dtype=torch.long))
        self.register_buffer('radius', torch.zeros(1))

    def ratios(self):
        out = []
        for fixed, w in ((self.mean_fixed, self.mean_weight),
                         (self.var_fixed, self.var_weight)):
            if bool(fixed):
                out.append(w.detach())
            else:
                out.append(
                    sparsestmax_by_candidates(w.detach(),
                                              float(self.radius)).to(w.dtype))
        return tuple(out)


def make_fixed(model, seed=0, unfixed=()):
    """Every SSN layer fixed to random one-hot ratio vectors, as in a
    trained model; the layers named in ``unfixed`` keep random logits and
    get a radius instead."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, m in model.named_modules():
            if not isinstance(m, ReleasedSSN2d):
                continue
            if name in unfixed:
                m.mean_weight.copy_(torch.randn(3, generator=gen))
                m.var_weight.copy_(torch.randn(3, generator=gen))
                m.radius.fill_(0.55)
                m.mean_fixed.zero_()
                m.var_fixed.zero_()
                continue
            for fixed, w in ((m.mean_fixed, m.mean_weight), (m.var_fixed,
                                                             m.var_weight)):
                w.zero_()
                w[int(torch.randint(3, (1, ), generator=gen))] = 1
                fixed.fill_(1)
    return model
