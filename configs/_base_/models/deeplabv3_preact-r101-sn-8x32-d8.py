# DeepLabV3 with SN in the backbone and both heads, finetuned
# from the released pre-activation ResNet101v2+SN(8,32) (not a row of the
# paper's tables): the ResNet50v2 row with the deeper backbone.
_base_ = './deeplabv3_preact-r50-sn-8x32-d8.py'
model = dict(
    backbone=dict(
        depth=101,
        init_cfg=dict(checkpoint={{_base_.sn_preact_r101_8x32_checkpoint}})))
