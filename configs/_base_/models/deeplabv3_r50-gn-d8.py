# Table 7, row GN: the GN ImageNet backbone (Detectron's: BGR input, std
# 1) finetuned, GN (32 groups) in the backbone and both heads.
_base_ = './deeplabv3_r50-d8.py'
norm_cfg = dict(type='GN', num_groups=32, requires_grad=True)
model = dict(
    data_preprocessor=dict(
        mean=[103.530, 116.280, 123.675],
        std=[1.0, 1.0, 1.0],
        bgr_to_rgb=False),
    backbone=dict(
        norm_cfg=norm_cfg, init_cfg=dict(checkpoint={{_base_.gn_checkpoint}})),
    decode_head=dict(norm_cfg=norm_cfg),
    auxiliary_head=dict(norm_cfg=norm_cfg))
