# DeepLabV3 R101-D8 with SN in the backbone and both heads,
# finetuned from the released ResNet101v1+SN(8,32) (not a row of the
# paper's tables): the R50 SN (8,32) row with a deeper backbone.
_base_ = './deeplabv3_r50-sn-8x32-d8.py'
model = dict(
    backbone=dict(
        depth=101,
        init_cfg=dict(checkpoint={{_base_.sn_r101_8x32_checkpoint}})))
