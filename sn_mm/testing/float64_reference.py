"""A direct float64 implementation of SN from the paper's formulas.

Statistics are computed over each normaliser's own pixel set (Eq. 4), not
through the statistic reuse of Eq. 5 that the layer uses, so the two are
independent. With ``unbiased=True`` the released convention applies: IN's
variance is Bessel-corrected and LN/BN variances are the mean of the IN
second moments minus the squared mean.
"""
import torch


def reference_sn(x,
                 weight,
                 bias,
                 mean_logits,
                 var_logits,
                 running_mean,
                 running_var,
                 training,
                 momentum=0.1,
                 eps=1e-5,
                 using_bn=True,
                 unbiased=True):
    """Returns (output, new_running_mean, new_running_var)."""
    x = x.double()
    n, c = x.shape[:2]
    x3 = x.reshape(n, c, -1)
    spatial = x3.shape[-1]
    has_in = spatial > 1

    mean_in = x3.mean(-1)
    var_in_biased = ((x3 - mean_in[..., None])**2).mean(-1)
    mean_ln = x3.mean((1, 2))[:, None].expand(n, c)
    if unbiased and has_in:
        var_in = var_in_biased * spatial / (spatial - 1)
        var_ln = (var_in + mean_in**2).mean(1, keepdim=True) - mean_ln**2
    else:
        var_in = var_in_biased
        var_ln = ((x3 - mean_ln[..., None])**2).mean((1, 2))[:, None]
    var_ln = var_ln.expand(n, c)

    means, variances, names = [mean_ln], [var_ln], ['ln']
    new_rm, new_rv = running_mean, running_var
    if using_bn:
        if training and n > 0:
            mean_bn = x3.mean((0, 2))
            if unbiased and has_in:
                var_bn = (var_in + mean_in**2).mean(0) - mean_bn**2
            else:
                var_bn = ((x3 - mean_bn[None, :, None])**2).mean((0, 2))
            new_rm = (1 -
                      momentum) * running_mean.double() + momentum * mean_bn
            new_rv = (1 - momentum) * running_var.double() + momentum * var_bn
        else:
            mean_bn, var_bn = running_mean.double(), running_var.double()
        means.append(mean_bn[None].expand(n, c))
        variances.append(var_bn[None].expand(n, c))
        names.append('bn')
    logits_m = mean_logits.double()
    logits_v = var_logits.double()
    if has_in:
        means.insert(0, mean_in)
        variances.insert(0, var_in)
    else:
        logits_m, logits_v = logits_m[1:], logits_v[1:]
    wm = torch.exp(logits_m) / torch.exp(logits_m).sum()
    wv = torch.exp(logits_v) / torch.exp(logits_v).sum()
    mean = sum(w * m for w, m in zip(wm, means))
    var = sum(w * v for w, v in zip(wv, variances))
    y = (x3 - mean[..., None]) / torch.sqrt(var[..., None] + eps)
    y = y * weight.double()[None, :, None] + bias.double()[None, :, None]
    return y.reshape(x.shape), new_rm, new_rv
