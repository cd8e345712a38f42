# Table 2's SN (8,32) row: ResNet-50 with SN in every norm layer, trained on
# ImageNet with mmpretrain's recipe for ResNet-50 (random-resized 224 crops,
# flips; SGD momentum 0.9; 100 epochs, LR /10 at 30, 60 and 90), which is the
# paper's. The batch setting (#GPUs, images per GPU) is in the name: 8xb32 is
# (8,32). Each GPU normalises its own images, as in the paper; the LR is
# 0.1 per 256 images (linear scaling), set in each row's config.
_base_ = [
    'mmpretrain::resnet/resnet50_8xb32_in1k.py',
    '../_base_/sn_runtime.py',
]
norm_cfg = dict(type='SN', requires_grad=True)
# zero_init_residual (mmpretrain's default): the last norm weight of each
# block starts at 0, as in the authors' ImageNet configs (last_gamma: True);
# the paper's text starts every weight at 1 (set False for that).
model = dict(backbone=dict(norm_cfg=norm_cfg, zero_init_residual=True))
train_dataloader = dict(batch_size=32)
# Weight decay 1e-4 on every parameter, the norm weights and biases
# included, as the paper says; it is silent on the ratio logits, which
# therefore decay like the rest. SNOptimWrapperConstructor applies the same
# rules to SN's parameters as mmengine's constructor does to BN's.
optim_wrapper = dict(
    constructor='SNOptimWrapperConstructor',
    optimizer=dict(type='SGD', lr=0.1, momentum=0.9, weight_decay=1e-4))
custom_hooks = [
    dict(type='SNRatioHook', interval=500, log_layers=False),
    # The paper's inference: the BN statistics of every SN layer averaged
    # over about 50k training images (its Sec. 3 finds that enough) before
    # each validation and before the final checkpoint. num_batches is per
    # GPU: 50000 / (8 x 32).
    dict(type='SNBatchAverageHook', num_batches=196),
]
# --auto-scale-lr rescales the LR linearly for another number of GPUs; each
# row names its own total batch, for which its LR is set.
auto_scale_lr = dict(base_batch_size=256)
