# `make demo-pretrain`, step 1: pretrain a ResNet-18 with SN in every norm
# layer (mmpretrain's ImageClassifier) on the toy classification set
# (tools/misc/make_toy_data.py cls: 64 px images of the four toy shapes).
# About a minute on 2 CPU cores. Step 2,
# mask-rcnn_r18-sn-pretrained_fpn_sn-head_toy-coco.py, starts the toy Mask
# R-CNN's backbone from the checkpoint this writes.
_base_ = [
    'mmpretrain::_base_/default_runtime.py',
    '../_base_/sn_runtime.py',
]
norm_cfg = dict(type='SN', requires_grad=True)
num_classes = 4
# The detector's input normalisation (mmdet's ImageNet mean/std, RGB), so
# the backbone sees in finetuning what it saw here.
data_preprocessor = dict(
    num_classes=num_classes,
    mean=[123.675, 116.28, 103.53],
    std=[58.395, 57.12, 57.375],
    to_rgb=True)
model = dict(
    type='ImageClassifier',
    # The toy Mask R-CNN's backbone (mmdet's ResNet-18 has the same keys):
    # zero_init_residual=False for the same reason as there.
    backbone=dict(
        type='ResNet',
        depth=18,
        out_indices=(3, ),
        style='pytorch',
        norm_cfg=norm_cfg,
        zero_init_residual=False),
    neck=dict(type='GlobalAveragePooling'),
    head=dict(
        type='LinearClsHead',
        num_classes=num_classes,
        in_channels=512,
        loss=dict(type='CrossEntropyLoss'),
        topk=(1, )))

data_root = 'data/toy_cls'
train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='RandomFlip', prob=0.5, direction='horizontal'),
    dict(type='PackInputs'),
]
test_pipeline = [dict(type='LoadImageFromFile'), dict(type='PackInputs')]
# Class folders (CustomDataset); no worker processes, so both cores compute.
train_dataloader = dict(
    batch_size=32,
    num_workers=0,
    persistent_workers=False,
    dataset=dict(
        type='CustomDataset',
        data_root=data_root,
        data_prefix='train',
        pipeline=train_pipeline),
    sampler=dict(type='DefaultSampler', shuffle=True))
val_dataloader = dict(
    batch_size=32,
    num_workers=0,
    persistent_workers=False,
    dataset=dict(
        type='CustomDataset',
        data_root=data_root,
        data_prefix='val',
        pipeline=test_pipeline),
    sampler=dict(type='DefaultSampler', shuffle=False))
val_evaluator = dict(type='Accuracy', topk=(1, ))
test_dataloader = val_dataloader
test_evaluator = val_evaluator

max_epochs = 8
train_cfg = dict(by_epoch=True, max_epochs=max_epochs, val_interval=max_epochs)
val_cfg = dict()
test_cfg = dict()
param_scheduler = [
    dict(type='LinearLR', start_factor=0.1, by_epoch=False, begin=0, end=10),
    dict(type='MultiStepLR', by_epoch=True, milestones=[6], gamma=0.1),
]
optim_wrapper = dict(
    constructor='SNOptimWrapperConstructor',
    optimizer=dict(type='SGD', lr=0.05, momentum=0.9, weight_decay=1e-4),
    # The ratio logits learn faster, so that a short run moves them.
    paramwise_cfg=dict(ratio_lr_mult=10.0))
default_hooks = dict(
    logger=dict(type='LoggerHook', interval=10),
    checkpoint=dict(
        type='CheckpointHook', interval=max_epochs, max_keep_ckpts=1))
custom_hooks = [
    dict(type='SNRatioHook', interval=10, log_layers=False),
    dict(type='SNBatchAverageHook', num_batches=10),
]
env_cfg = dict(dist_cfg=dict(backend='gloo'))
randomness = dict(seed=0)
