# Table 7, row SN (8,32): as SN (8,2), finetuned from
# ResNet50v1+SN(8,32).
_base_ = './deeplabv3_r50-sn-8x2-d8.py'
model = dict(
    backbone=dict(init_cfg=dict(checkpoint={{_base_.sn_8x32_checkpoint}})))
