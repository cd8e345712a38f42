# Setting 3 (Mask R-CNN + FPN, 2x) with SN in backbone, FPN and heads,
# finetuned from the released pre-activation ResNet101v2+SN(8,32) (ImageNet
# top-1 78.81; not a row of the paper's tables). PreActResNet
# (sn_mm) has the released v2 layout; the FPN takes its stage outputs, the
# last one after sn_out and ReLU.
_base_ = './mask-rcnn_r50-sn_fpn_sn-head_2x_coco.py'
model = dict(
    backbone=dict(
        _delete_=True,
        type='PreActResNet',
        depth=101,
        out_indices=(0, 1, 2, 3),
        frozen_stages=1,
        norm_cfg={{_base_.head_norm_cfg}},
        norm_eval=False,
        init_cfg=dict(
            type='Pretrained',
            checkpoint={{_base_.sn_preact_r101_8x32_checkpoint}})))
