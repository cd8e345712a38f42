# Setting 3 (Mask R-CNN + FPN, 2x) with SN in backbone, FPN and heads,
# finetuned from the released pre-activation ResNet101v2+SN(8,32) (ImageNet
# top-1 78.81; not a row of the paper's tables): the ResNet50v2 config with
# the deeper backbone.
_base_ = './mask-rcnn_preact-r50-sn-8x32_fpn_sn-head_2x_coco.py'
model = dict(
    backbone=dict(
        depth=101,
        init_cfg=dict(checkpoint={{_base_.sn_preact_r101_8x32_checkpoint}})))
