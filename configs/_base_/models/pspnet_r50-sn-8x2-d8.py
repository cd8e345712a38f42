# Row SN (8,2): ResNet50v1+SN(8,2) finetuned, SN in the backbone
# and both heads; BN statistics per GPU (2 images).
_base_ = './pspnet_r50-d8.py'
norm_cfg = dict(type='SN', requires_grad=True)
model = dict(
    backbone=dict(
        norm_cfg=norm_cfg,
        init_cfg=dict(checkpoint={{_base_.sn_8x2_checkpoint}})),
    decode_head=dict(norm_cfg=norm_cfg),
    auxiliary_head=dict(norm_cfg=norm_cfg))
