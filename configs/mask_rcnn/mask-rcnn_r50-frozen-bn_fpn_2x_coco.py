# Table 6, row BN(frozen) / -- : Mask R-CNN + FPN, ResNet-50 with frozen BN,
# no normalization in the heads; 8 GPUs x 2 images, shorter side 800, 2x.
_base_ = [
    'mmdet::mask_rcnn/mask-rcnn_r50_fpn_2x_coco.py', '../_base_/det_runtime.py'
]
model = dict(
    backbone=dict(
        init_cfg=dict(type='Pretrained', checkpoint={{_base_.bn_checkpoint}})))
# The paper's practice (_base_/det_runtime.py).
optim_wrapper = {{_base_.gn_practice_optim_wrapper}}
