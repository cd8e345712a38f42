# As the R50 SW model, on the released SW ResNet-101.
_base_ = './pspnet_r50-syncsw-d8.py'
model = dict(
    backbone=dict(
        depth=101, init_cfg=dict(checkpoint={{_base_.sw_r101_checkpoint}})))
