# Setting 3 (Mask R-CNN + FPN, 2x) with SN in backbone, FPN and heads,
# finetuned from the released ResNet101v1+SN(8,32) (ImageNet top-1 78.54;
# not a row of the paper's tables).
_base_ = './mask-rcnn_r50-sn_fpn_sn-head_2x_coco.py'
model = dict(
    backbone=dict(
        depth=101,
        init_cfg=dict(checkpoint={{_base_.sn_r101_8x32_checkpoint}})))
