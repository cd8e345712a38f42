# The segmentation demo with Sparse SN: every layer learns sparse ratios
# (SparsestMax), the radius growing from 0 to 1 over training
# (SSNRadiusHook), so that by the end each layer has fixed one normaliser for
# its mean and one for its variance (tools/analysis_tools/plot_ratios.py
# --hard shows them).
_base_ = './deeplabv3_r18-sn-d8_toy-seg.py'
norm_cfg = dict(type='SN', ratio_fn='sparsestmax', requires_grad=True)
model = dict(
    backbone=dict(norm_cfg=norm_cfg),
    decode_head=dict(norm_cfg=norm_cfg),
    auxiliary_head=dict(norm_cfg=norm_cfg))
custom_hooks = [dict(type='SSNRadiusHook')]
