# PSPNet R50-D8 in the same setting as DeepLabV3 (Table 8 reports it on
# Cityscapes). Its pyramid pooling has a 1x1 bin: with SN there, one spatial
# position leaves IN undefined, so those SN layers mix LN and BN only (see
# SwitchableNorm) -- never a NaN.
_base_ = './deeplabv3_r50-d8.py'
norm_cfg = dict(type='SyncBN', requires_grad=True)
model = dict(
    decode_head=dict(
        _delete_=True,
        type='PSPHead',
        in_channels=2048,
        in_index=3,
        channels=512,
        pool_scales=(1, 2, 3, 6),
        dropout_ratio=0.1,
        num_classes={{_base_.model.decode_head.num_classes}},
        norm_cfg=norm_cfg,
        align_corners=False,
        loss_decode=dict(
            type='CrossEntropyLoss', use_sigmoid=False, loss_weight=1.0)))
