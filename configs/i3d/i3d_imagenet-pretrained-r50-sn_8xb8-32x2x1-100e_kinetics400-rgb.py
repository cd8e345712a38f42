# Table 10, SN row, 8 clips per GPU: SN in every norm layer, inflated from
# the released ResNet50v1+SN (8,32) ImageNet model (sn2mm.py; where it comes
# from: docs/configs_and_checkpoints.md): each SN layer takes its 2D layer's
# ratio logits, affine parameters and running statistics. The ratio logits
# get no weight decay (it would only pull them towards equal ratios); BN's
# statistics are re-estimated by batch average before each validation and
# the final checkpoint (the paper's inference).
_base_ = './i3d_imagenet-pretrained-r50-bn_8xb8-32x2x1-100e_kinetics400-rgb.py'
model = dict(
    backbone=dict(
        type='InflatedResNet3d',
        pretrained={{_base_.sn_8x32_checkpoint}},
        ratios='source',
        norm_cfg=dict(type='SN', requires_grad=True)))
optim_wrapper = dict(
    constructor='SNOptimWrapperConstructor',
    paramwise_cfg=dict(ratio_decay_mult=0.))
custom_hooks = [
    dict(
        type='SNBatchAverageHook',
        num_batches=50,
        before_val=True,
        after_train=True)
]
