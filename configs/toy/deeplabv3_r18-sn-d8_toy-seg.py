# The segmentation demo: DeepLabV3 with SN in the backbone and both heads,
# trained from scratch on the bundled toy ADE20K-style data
# (tools/misc/make_toy_data.py seg) on a CPU. ResNet-18 at output stride 8
# and 96x96 images keep it within minutes on 2 cores.
_base_ = [
    '../_base_/models/deeplabv3_r50-d8.py',
    'mmseg::_base_/default_runtime.py',
]
norm_cfg = dict(type='SN', requires_grad=True)
classes = ('background', 'square', 'circle', 'triangle', 'star')
crop_size = (96, 96)
model = dict(
    data_preprocessor=dict(size=crop_size),
    backbone=dict(depth=18, norm_cfg=norm_cfg, init_cfg=None),
    decode_head=dict(
        in_channels=512,
        channels=128,
        dilations=(1, 2, 4, 6),
        num_classes=len(classes),
        norm_cfg=norm_cfg),
    auxiliary_head=dict(
        in_channels=256,
        channels=64,
        num_classes=len(classes),
        norm_cfg=norm_cfg))

dataset = dict(
    type='BaseSegDataset',
    data_root='data/toy_seg',
    metainfo=dict(
        classes=classes,
        palette=[[120, 120, 120], [220, 40, 40], [40, 200, 40], [40, 60, 220],
                 [230, 200, 30]]),
    img_suffix='.png',
    seg_map_suffix='.png',
    reduce_zero_label=True)
train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations', reduce_zero_label=True),
    dict(type='RandomFlip', prob=0.5),
    dict(type='PackSegInputs')
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations', reduce_zero_label=True),
    dict(type='PackSegInputs')
]
# Loading a 96 px PNG costs far less than a step: no worker processes.
train_dataloader = dict(
    batch_size=4,
    num_workers=0,
    persistent_workers=False,
    sampler=dict(type='InfiniteSampler', shuffle=True),
    dataset=dict(
        **dataset,
        pipeline=train_pipeline,
        data_prefix=dict(
            img_path='images/training', seg_map_path='annotations/training')))
val_dataloader = dict(
    batch_size=4,
    num_workers=0,
    persistent_workers=False,
    sampler=dict(type='DefaultSampler', shuffle=False),
    dataset=dict(
        **dataset,
        pipeline=test_pipeline,
        data_prefix=dict(
            img_path='images/validation',
            seg_map_path='annotations/validation')))
test_dataloader = val_dataloader
val_evaluator = dict(type='IoUMetric', iou_metrics=['mIoU'])
test_evaluator = val_evaluator

max_iters = 300
train_cfg = dict(
    type='IterBasedTrainLoop', max_iters=max_iters, val_interval=max_iters)
val_cfg = dict(type='ValLoop')
test_cfg = dict(type='TestLoop')
param_scheduler = [
    dict(type='LinearLR', start_factor=0.1, by_epoch=False, begin=0, end=30),
    dict(
        type='PolyLR',
        eta_min=1e-4,
        power=0.9,
        begin=30,
        end=max_iters,
        by_epoch=False)
]
optim_wrapper = dict(
    type='OptimWrapper',
    constructor='SNOptimWrapperConstructor',
    optimizer=dict(type='SGD', lr=0.05, momentum=0.9, weight_decay=1e-4),
    paramwise_cfg=dict(norm_decay_mult=0., ratio_decay_mult=0.),
    clip_grad=dict(max_norm=10, norm_type=2))
default_hooks = dict(
    logger=dict(type='LoggerHook', interval=20, log_metric_by_epoch=False),
    checkpoint=dict(
        type='CheckpointHook',
        by_epoch=False,
        interval=max_iters,
        max_keep_ckpts=1))
log_processor = dict(by_epoch=False)
env_cfg = dict(dist_cfg=dict(backend='gloo'))
