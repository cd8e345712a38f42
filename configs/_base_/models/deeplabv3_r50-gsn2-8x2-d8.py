# Table 7's SN (8,2) row with group SN: ratio_groups=2 in the backbone and
# both heads, each half of a layer's channels learning its own ratios. The
# backbone starts from the released ResNet50v1+SN(8,2), whose single ratio
# vector per layer starts both groups.
_base_ = './deeplabv3_r50-sn-8x2-d8.py'
norm_cfg = dict(type='SN', requires_grad=True, ratio_groups=2)
model = dict(
    backbone=dict(norm_cfg=norm_cfg),
    decode_head=dict(norm_cfg=norm_cfg),
    auxiliary_head=dict(norm_cfg=norm_cfg))
