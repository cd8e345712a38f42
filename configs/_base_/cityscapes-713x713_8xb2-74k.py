# Cityscapes in the paper's setting (Sec. 4.3): 8 GPUs x 2 images, random
# 713x713 crops, 400 epochs (2975 images / 16 per batch = 74.4k iterations)
# of 'poly' LR (power 0.9). Multi-scale testing (--tta) at 1.0, 1.25, 1.5,
# 1.75 of full resolution, as in the paper.
_base_ = [
    'mmseg::_base_/datasets/cityscapes.py', 'mmseg::_base_/default_runtime.py',
    'mmseg::_base_/schedules/schedule_80k.py'
]
crop_size = (713, 713)
# What a model needs of this setting; leaves merge it with
# `model = {{_base_.dataset_model}}`.
dataset_model = dict(
    data_preprocessor=dict(size=crop_size),
    test_cfg=dict(mode='slide', crop_size=crop_size, stride=(476, 476)))
train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations'),
    dict(
        type='RandomResize',
        scale=(2048, 1024),
        ratio_range=(0.5, 2.0),
        keep_ratio=True),
    dict(type='RandomCrop', crop_size=crop_size, cat_max_ratio=0.75),
    dict(type='RandomFlip', prob=0.5),
    dict(type='PhotoMetricDistortion'),
    dict(type='PackSegInputs')
]
tta_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(
        type='TestTimeAug',
        transforms=[
            [
                dict(type='Resize', scale_factor=r, keep_ratio=True)
                for r in (1.0, 1.25, 1.5, 1.75)
            ],
            [
                dict(type='RandomFlip', prob=0., direction='horizontal'),
                dict(type='RandomFlip', prob=1., direction='horizontal')
            ], [dict(type='LoadAnnotations')], [dict(type='PackSegInputs')]
        ])
]
train_dataloader = dict(batch_size=2, dataset=dict(pipeline=train_pipeline))

max_iters = 74400
train_cfg = dict(max_iters=max_iters, val_interval=7440)
# mmseg's schedule (SGD, weight decay 5e-4, poly LR with power 0.9), with
# SN's ratio logits free of decay: it would only pull them towards equal
# ratios.
optim_wrapper = dict(
    constructor='SNOptimWrapperConstructor',
    paramwise_cfg=dict(ratio_decay_mult=0.))
param_scheduler = [
    dict(
        type='PolyLR',
        eta_min=1e-4,
        power=0.9,
        begin=0,
        end=max_iters,
        by_epoch=False)
]
default_hooks = dict(checkpoint=dict(interval=7440))
auto_scale_lr = dict(enable=False, base_batch_size=16)
