# SN in the backbone and both heads, the backbone started from
# torchvision's BN ResNet-50 (SNPretrained: each SN layer takes its BN
# layer's affine and running statistics, equal ratios) instead of a released
# SN one.
_base_ = './deeplabv3_r50-sn-8x2-d8.py'
model = dict(
    backbone=dict(
        init_cfg=dict(
            _delete_=True,
            type='SNPretrained',
            checkpoint={{_base_.bn_checkpoint}},
            ratios='uniform')))
