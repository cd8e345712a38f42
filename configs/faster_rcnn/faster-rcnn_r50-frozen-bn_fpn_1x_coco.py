# Table 5, row BN(frozen) / -- : Faster R-CNN + FPN, ResNet-50 with frozen
# BN, no normalization in the head; 8 GPUs x 2 images, shorter side 800, 1x.
_base_ = [
    'mmdet::faster_rcnn/faster-rcnn_r50_fpn_1x_coco.py',
    '../_base_/det_runtime.py'
]
model = dict(
    backbone=dict(
        init_cfg=dict(type='Pretrained', checkpoint={{_base_.bn_checkpoint}})))
# The paper's practice (_base_/det_runtime.py).
optim_wrapper = {{_base_.gn_practice_optim_wrapper}}
