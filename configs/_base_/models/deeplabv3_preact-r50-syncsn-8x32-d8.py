# DeepLabV3 with SyncSN in the backbone and both heads, finetuned
# from the released pre-activation ResNet50v2+SN(8,32) (not a row of the
# paper's tables): the SN row with SN's BN statistics synchronised over all
# GPUs.
_base_ = './deeplabv3_preact-r50-sn-8x32-d8.py'
norm_cfg = dict(type='SyncSN', requires_grad=True)
model = dict(
    backbone=dict(norm_cfg=norm_cfg),
    decode_head=dict(norm_cfg=norm_cfg),
    auxiliary_head=dict(norm_cfg=norm_cfg))
