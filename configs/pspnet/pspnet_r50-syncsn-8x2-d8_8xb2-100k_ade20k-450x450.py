# ADE20K (the paper reports PSPNet on Cityscapes only), row SyncSN (8,2): as SN (8,2), with SN's BN statistics
# synchronised over all GPUs (16 images).
_base_ = './pspnet_r50-sn-8x2-d8_8xb2-100k_ade20k-450x450.py'
norm_cfg = dict(type='SyncSN', requires_grad=True)
model = dict(
    backbone=dict(norm_cfg=norm_cfg),
    decode_head=dict(norm_cfg=norm_cfg),
    auxiliary_head=dict(norm_cfg=norm_cfg))
