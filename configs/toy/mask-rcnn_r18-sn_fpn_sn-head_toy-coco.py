# The demo: Mask R-CNN with SN in backbone, FPN, box and mask heads, trained
# from scratch on the bundled toy COCO data (tools/misc/make_toy_data.py) on
# a CPU. ResNet-18, 128x128 images, 64 sampled RoIs per image and 100
# iterations keep it to about 2 minutes on 2 cores (bbox mAP about 0.44).
_base_ = [
    'mmdet::mask_rcnn/mask-rcnn_r50_fpn_1x_coco.py',
    '../_base_/sn_runtime.py',
]
norm_cfg = dict(type='SN', requires_grad=True)
classes = ('square', 'circle', 'triangle', 'star')
model = dict(
    data_preprocessor=dict(pad_size_divisor=32),
    # zero_init_residual=False: mmdet zeroes each block's last norm weight,
    # which leaves the blocks' ratio logits without gradient for most of a
    # 100-step run.
    backbone=dict(
        depth=18,
        norm_cfg=norm_cfg,
        norm_eval=False,
        frozen_stages=-1,
        style='pytorch',
        zero_init_residual=False,
        init_cfg=None),
    neck=dict(
        in_channels=[64, 128, 256, 512], out_channels=128, norm_cfg=norm_cfg),
    rpn_head=dict(
        in_channels=128,
        feat_channels=128,
        # Toy objects are 17-60 px: anchors of 16-256 px over the levels.
        anchor_generator=dict(scales=[4])),
    roi_head=dict(
        bbox_roi_extractor=dict(out_channels=128),
        bbox_head=dict(
            type='Shared4Conv1FCBBoxHead',
            in_channels=128,
            conv_out_channels=128,
            fc_out_channels=512,
            norm_cfg=norm_cfg,
            num_classes=len(classes)),
        mask_roi_extractor=dict(out_channels=128),
        mask_head=dict(
            in_channels=128,
            conv_out_channels=128,
            norm_cfg=norm_cfg,
            num_classes=len(classes))),
    train_cfg=dict(
        rpn=dict(sampler=dict(num=128)),
        # Toy images hold at most 4 objects: few proposals and RoIs do.
        rpn_proposal=dict(nms_pre=1000, max_per_img=200),
        rcnn=dict(sampler=dict(num=64))),
    test_cfg=dict(rpn=dict(nms_pre=500, max_per_img=100)))

data_root = 'data/toy_coco/'
metainfo = dict(classes=classes)
train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
    dict(type='Resize', scale=(128, 128), keep_ratio=True),
    dict(type='RandomFlip', prob=0.5),
    dict(type='PackDetInputs'),
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='Resize', scale=(128, 128), keep_ratio=True),
    dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
    dict(
        type='PackDetInputs',
        meta_keys=('img_id', 'img_path', 'ori_shape', 'img_shape',
                   'scale_factor')),
]
# Loading a 128 px PNG costs far less than a step: no worker processes,
# so both cores compute.
train_dataloader = dict(
    batch_size=4,
    num_workers=0,
    persistent_workers=False,
    dataset=dict(
        data_root=data_root,
        metainfo=metainfo,
        ann_file='annotations/instances_train.json',
        data_prefix=dict(img='train/'),
        pipeline=train_pipeline))
val_dataloader = dict(
    batch_size=4,
    num_workers=0,
    persistent_workers=False,
    dataset=dict(
        data_root=data_root,
        metainfo=metainfo,
        ann_file='annotations/instances_val.json',
        data_prefix=dict(img='val/'),
        pipeline=test_pipeline))
test_dataloader = val_dataloader
val_evaluator = dict(ann_file=data_root + 'annotations/instances_val.json')
test_evaluator = val_evaluator

max_iters = 100
train_cfg = dict(
    _delete_=True,
    type='IterBasedTrainLoop',
    max_iters=max_iters,
    val_interval=max_iters)
param_scheduler = [
    dict(type='LinearLR', start_factor=0.01, by_epoch=False, begin=0, end=25),
    dict(
        type='MultiStepLR',
        by_epoch=False,
        begin=0,
        end=max_iters,
        milestones=[int(max_iters * 0.75),
                    int(max_iters * 0.9)],
        gamma=0.1),
]
optim_wrapper = dict(
    constructor='SNOptimWrapperConstructor',
    optimizer=dict(type='SGD', lr=0.04, momentum=0.9, weight_decay=1e-4),
    # The ratio logits learn faster than the weights, so that 100 steps
    # move them visibly from the uniform start (the figure make demo draws).
    paramwise_cfg=dict(
        norm_decay_mult=0.0, ratio_decay_mult=0.0, ratio_lr_mult=20.0),
    clip_grad=dict(max_norm=10, norm_type=2))
default_hooks = dict(
    logger=dict(type='LoggerHook', interval=20),
    checkpoint=dict(
        type='CheckpointHook',
        by_epoch=False,
        interval=max_iters,
        max_keep_ckpts=1))
log_processor = dict(by_epoch=False)
env_cfg = dict(dist_cfg=dict(backend='gloo'))
auto_scale_lr = dict(enable=False, base_batch_size=4)
custom_hooks = [
    # Model-average ratios in every log line; per-layer ones go to the
    # visualizer (work_dirs/.../vis_data) and the figure `make demo` draws.
    dict(type='SNRatioHook', interval=20, log_layers=False),
    # The paper's inference: BN statistics re-estimated by batch average
    # before validation and before the final checkpoint.
    dict(type='SNBatchAverageHook', num_batches=10),
]
