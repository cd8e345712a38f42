# PSPNet with SN in the backbone, the pyramid pooling module and both heads,
# on the bundled toy segmentation data: the toy DeepLabV3's data, schedule
# and auxiliary head with PSPNet's decode head (its 1x1 pooled branch is
# SN on a single position: LN and BN). The segmentors of the deployment
# checks (docs/deployment.md) are this one and the DeepLabV3.
_base_ = ['./deeplabv3_r18-sn-d8_toy-seg.py']
norm_cfg = dict(type='SN', requires_grad=True)
model = dict(
    decode_head=dict(
        _delete_=True,
        type='PSPHead',
        in_channels=512,
        in_index=3,
        channels=128,
        pool_scales=(1, 2, 3, 6),
        dropout_ratio=0.1,
        num_classes=5,
        norm_cfg=norm_cfg,
        align_corners=False,
        loss_decode=dict(
            type='CrossEntropyLoss', use_sigmoid=False, loss_weight=1.0)))
