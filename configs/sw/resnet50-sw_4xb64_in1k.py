# ImageNet ResNet-50 with Switchable Whitening in the release's layout (SW at
# the stem and at the second norm of blocks 1, 3, ... of stages 1-3, BN
# elsewhere) and with the release's recipe (experiments/resnet50_sw/run.sh):
# 256 images a step, SGD with LR 0.1, momentum 0.9 and weight decay 1e-4 on
# every parameter (SW's importance weights included), LR /10 at epochs 30,
# 60 and 90 of 100, no warm-up; random-resized 224 crops and flips. 4 GPUs
# of 64 images, each whitening its own 64 as the release's DataParallel
# does: the setting of the release's script and of the ImageNet figures its
# README and the paper give.
_base_ = [
    'mmpretrain::resnet/resnet50_8xb32_in1k.py', '../_base_/sn_runtime.py',
    '../_base_/sw_runtime.py'
]
model = dict(
    backbone=dict(
        type='SWResNet',
        sw_cfg={{_base_.sw_cfg}},
        stage_with_sw=(True, True, True, False),
        # The release starts every norm weight at 1.
        zero_init_residual=False))
train_dataloader = dict(batch_size=64)
optim_wrapper = dict(
    constructor='SNOptimWrapperConstructor',
    optimizer=dict(type='SGD', lr=0.1, momentum=0.9, weight_decay=1e-4))
custom_hooks = [dict(type='SNRatioHook', interval=500, log_layers=False)]
auto_scale_lr = dict(base_batch_size=256)
