# ADE20K in the paper's setting (Sec. 4.3): 8 GPUs x 2 images, 450x450
# crops, 100k iterations of 'poly' LR (power 0.9). Multi-scale testing
# (--tta) at shorter sides 300, 400, 500, 600, as in the paper.
_base_ = [
    'mmseg::_base_/datasets/ade20k.py', 'mmseg::_base_/default_runtime.py',
    'mmseg::_base_/schedules/schedule_80k.py'
]
crop_size = (450, 450)
# What a model needs of this setting; leaves merge it with
# `model = {{_base_.dataset_model}}`.
dataset_model = dict(
    data_preprocessor=dict(size=crop_size),
    decode_head=dict(num_classes=150),
    auxiliary_head=dict(num_classes=150))
train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations', reduce_zero_label=True),
    dict(
        type='RandomResize',
        scale=(1800, 450),
        ratio_range=(0.5, 2.0),
        keep_ratio=True),
    dict(type='RandomCrop', crop_size=crop_size, cat_max_ratio=0.75),
    dict(type='RandomFlip', prob=0.5),
    dict(type='PhotoMetricDistortion'),
    dict(type='PackSegInputs')
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='Resize', scale=(1800, 450), keep_ratio=True),
    dict(type='LoadAnnotations', reduce_zero_label=True),
    dict(type='PackSegInputs')
]
# (4s, s): the shorter side becomes s for any image up to 4:1.
tta_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(
        type='TestTimeAug',
        transforms=[
            [
                dict(type='Resize', scale=(4 * s, s), keep_ratio=True)
                for s in (300, 400, 500, 600)
            ],
            [
                dict(type='RandomFlip', prob=0., direction='horizontal'),
                dict(type='RandomFlip', prob=1., direction='horizontal')
            ], [dict(type='LoadAnnotations', reduce_zero_label=True)],
            [dict(type='PackSegInputs')]
        ])
]
train_dataloader = dict(batch_size=2, dataset=dict(pipeline=train_pipeline))
val_dataloader = dict(dataset=dict(pipeline=test_pipeline))
test_dataloader = val_dataloader

max_iters = 100000
train_cfg = dict(max_iters=max_iters, val_interval=10000)
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
default_hooks = dict(checkpoint=dict(interval=10000))
auto_scale_lr = dict(enable=False, base_batch_size=16)
