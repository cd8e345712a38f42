# What the detection configs share beyond sn_runtime.py: the paper's
# practice (Sec. 4.2) and the norm settings that Faster and Mask R-CNN rows
# have in common. Leaves take these by name, e.g.
# `optim_wrapper = {{_base_.gn_practice_optim_wrapper}}`.
_base_ = './sn_runtime.py'

# The paper follows GN in detection: no weight decay on the affine weight and
# bias of any norm layer. SNOptimWrapperConstructor applies norm_decay_mult to
# SN too (mmengine's default constructor misses it) and keeps the ratio
# logits free of decay, which would only pull them towards equal ratios.
gn_practice_optim_wrapper = dict(
    constructor='SNOptimWrapperConstructor',
    paramwise_cfg=dict(norm_decay_mult=0., ratio_decay_mult=0.))

# Detectron's GN ImageNet backbone: caffe-style input (BGR, std 1).
gn_data_preprocessor = dict(
    mean=[103.530, 116.280, 123.675], std=[1.0, 1.0, 1.0], bgr_to_rgb=False)
gn_norm_cfg = dict(type='GN', num_groups=32, requires_grad=True)
sn_norm_cfg = dict(type='SN', requires_grad=True)
# The GN and the SN (8,2) ImageNet backbones, finetuned (their norm layers
# learn, they are not frozen). Released SN models are v1 with
# torchvision-style input, so mmdet's 'pytorch' ResNet and RGB mean/std
# apply.
gn_backbone = dict(
    norm_cfg=gn_norm_cfg,
    norm_eval=False,
    init_cfg=dict(type='Pretrained', checkpoint={{_base_.gn_checkpoint}}))
sn_backbone = dict(
    style='pytorch',
    norm_cfg=sn_norm_cfg,
    norm_eval=False,
    init_cfg=dict(type='Pretrained', checkpoint={{_base_.sn_8x2_checkpoint}}))
