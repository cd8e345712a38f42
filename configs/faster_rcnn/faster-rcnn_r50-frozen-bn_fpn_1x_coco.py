# Table 5, row BN(frozen) / -- : Faster R-CNN + FPN, ResNet-50 with frozen
# BN, no normalization in the head; 8 GPUs x 2 images, shorter side 800, 1x.
_base_ = [
    'mmdet::faster_rcnn/faster-rcnn_r50_fpn_1x_coco.py', '../_base_/sn_runtime.py'
]
model = dict(
    backbone=dict(
        init_cfg=dict(type='Pretrained', checkpoint={{_base_.bn_checkpoint}})))

# The paper follows GN in detection: no weight decay on the affine weight and
# bias of any norm layer. SNOptimWrapperConstructor applies norm_decay_mult to
# SN too (mmengine's default constructor misses it) and keeps the ratio
# logits free of decay, which would only pull them towards equal ratios.
optim_wrapper = dict(
    constructor='SNOptimWrapperConstructor',
    paramwise_cfg=dict(norm_decay_mult=0., ratio_decay_mult=0.))
