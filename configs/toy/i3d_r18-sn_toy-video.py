# `make demo-video`: an I3D ResNet-18 (mmaction2's ResNet3d, 3x3x3 kernels in
# every block, 16 base channels) with SN in every norm layer, trained from
# scratch on the toy video set (tools/misc/make_toy_data.py video: 8-frame
# clips of 32x32 px in which one shape moves; its class is the direction of
# motion, so a single frame cannot tell it). SN normalises over (T, H, W).
_base_ = [
    'mmaction::_base_/default_runtime.py',
    '../_base_/sn_runtime.py',
]
custom_imports = dict(
    imports=['sn_mm', 'sn_mm.video'], allow_failed_imports=False)
norm_cfg = dict(type='SN', requires_grad=True)
num_classes = 4
model = dict(
    type='Recognizer3D',
    backbone=dict(
        type='InflatedResNet3d',
        depth=18,
        base_channels=16,
        pretrained=None,
        pretrained2d=False,
        conv1_kernel=(3, 7, 7),
        conv1_stride_t=1,
        pool1_stride_t=1,
        inflate=(1, 1, 1, 1),
        conv_cfg=dict(type='Conv3d'),
        norm_cfg=norm_cfg,
        norm_eval=False,
        zero_init_residual=False),
    cls_head=dict(
        type='I3DHead',
        num_classes=num_classes,
        in_channels=128,
        spatial_type='avg',
        dropout_ratio=0.,
        init_std=0.01,
        average_clips='prob'),
    data_preprocessor=dict(
        type='ActionDataPreprocessor',
        mean=[123.675, 116.28, 103.53],
        std=[58.395, 57.12, 57.375],
        format_shape='NCTHW'))

data_root = 'data/toy_video'
dataset = dict(
    type='RawframeDataset',
    data_prefix=dict(img=f'{data_root}/rawframes'),
    filename_tmpl='img_{:05}.png')
# No flips: a flip turns 'left' into 'right'.
train_pipeline = [
    dict(type='SampleFrames', clip_len=8, frame_interval=1, num_clips=1),
    dict(type='RawFrameDecode'),
    dict(type='FormatShape', input_format='NCTHW'),
    dict(type='PackActionInputs')
]
val_pipeline = [
    dict(
        type='SampleFrames',
        clip_len=8,
        frame_interval=1,
        num_clips=1,
        test_mode=True),
    dict(type='RawFrameDecode'),
    dict(type='FormatShape', input_format='NCTHW'),
    dict(type='PackActionInputs')
]
# No worker processes, so both cores compute.
train_dataloader = dict(
    batch_size=16,
    num_workers=0,
    persistent_workers=False,
    sampler=dict(type='DefaultSampler', shuffle=True),
    dataset=dict(
        ann_file=f'{data_root}/train_list.txt',
        pipeline=train_pipeline,
        **dataset))
val_dataloader = dict(
    batch_size=16,
    num_workers=0,
    persistent_workers=False,
    sampler=dict(type='DefaultSampler', shuffle=False),
    dataset=dict(
        ann_file=f'{data_root}/val_list.txt',
        pipeline=val_pipeline,
        test_mode=True,
        **dataset))
test_dataloader = val_dataloader
val_evaluator = dict(type='AccMetric')
test_evaluator = val_evaluator

max_epochs = 10
train_cfg = dict(
    type='EpochBasedTrainLoop', max_epochs=max_epochs, val_interval=max_epochs)
val_cfg = dict(type='ValLoop')
test_cfg = dict(type='TestLoop')
param_scheduler = [
    dict(type='LinearLR', start_factor=0.1, by_epoch=False, begin=0, end=20),
    dict(type='MultiStepLR', by_epoch=True, milestones=[8], gamma=0.1),
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
