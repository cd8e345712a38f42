# As deeplabv3_r50-sn-from-bn-d8.py, for PSPNet.
_base_ = './pspnet_r50-sn-8x2-d8.py'
model = dict(
    backbone=dict(
        init_cfg=dict(
            _delete_=True,
            type='SNPretrained',
            checkpoint={{_base_.bn_checkpoint}},
            ratios='uniform')))
