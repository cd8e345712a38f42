# Row SyncSN (8,4): as SyncSN (8,2), finetuned from
# ResNet50v1+SN(8,4).
_base_ = './pspnet_r50-syncsn-8x2-d8.py'
model = dict(
    backbone=dict(init_cfg=dict(checkpoint={{_base_.sn_8x4_checkpoint}})))
