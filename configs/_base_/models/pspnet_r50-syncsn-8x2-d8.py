# Row SyncSN (8,2): as SN (8,2), with SN's BN statistics
# synchronised over all GPUs (16 images).
_base_ = './pspnet_r50-sn-8x2-d8.py'
norm_cfg = dict(type='SyncSN', requires_grad=True)
model = dict(
    backbone=dict(norm_cfg=norm_cfg),
    decode_head=dict(norm_cfg=norm_cfg),
    auxiliary_head=dict(norm_cfg=norm_cfg))
