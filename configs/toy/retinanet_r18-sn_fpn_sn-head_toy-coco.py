# RetinaNet with SN in backbone, FPN and head, on the bundled toy COCO data
# with the Mask R-CNN demo's data, schedule and hooks (its config, which
# this one inherits): the one-stage detector of the deployment checks
# (docs/deployment.md).
_base_ = ['./mask-rcnn_r18-sn_fpn_sn-head_toy-coco.py']
norm_cfg = dict(type='SN', requires_grad=True)
model = dict(
    _delete_=True,
    type='RetinaNet',
    data_preprocessor=dict(
        type='DetDataPreprocessor',
        mean=[123.675, 116.28, 103.53],
        std=[58.395, 57.12, 57.375],
        bgr_to_rgb=True,
        pad_size_divisor=32),
    backbone=dict(
        type='ResNet',
        depth=18,
        num_stages=4,
        out_indices=(0, 1, 2, 3),
        frozen_stages=-1,
        norm_cfg=norm_cfg,
        norm_eval=False,
        style='pytorch',
        zero_init_residual=False),
    neck=dict(
        type='FPN',
        in_channels=[64, 128, 256, 512],
        out_channels=128,
        start_level=1,
        add_extra_convs='on_input',
        num_outs=5,
        norm_cfg=norm_cfg),
    bbox_head=dict(
        type='RetinaHead',
        num_classes=4,
        in_channels=128,
        stacked_convs=2,
        feat_channels=128,
        # One stack of convs runs on all 5 FPN levels: each level keeps its
        # own BN statistics (SNRunner would set it; stated here, so that
        # every runner and mmdeploy build the same head), as its own batch
        # statistics normalise it in training.
        norm_cfg=dict(type='SN', num_levels=5, requires_grad=True),
        # Toy objects are 17-60 px: anchors from 16 px at stride 8 up.
        anchor_generator=dict(
            type='AnchorGenerator',
            octave_base_scale=2,
            scales_per_octave=3,
            ratios=[0.5, 1.0, 2.0],
            strides=[8, 16, 32, 64, 128]),
        bbox_coder=dict(
            type='DeltaXYWHBBoxCoder',
            target_means=[.0, .0, .0, .0],
            target_stds=[1.0, 1.0, 1.0, 1.0]),
        loss_cls=dict(
            type='FocalLoss',
            use_sigmoid=True,
            gamma=2.0,
            alpha=0.25,
            loss_weight=1.0),
        loss_bbox=dict(type='L1Loss', loss_weight=1.0)),
    train_cfg=dict(
        assigner=dict(
            type='MaxIoUAssigner',
            pos_iou_thr=0.5,
            neg_iou_thr=0.4,
            min_pos_iou=0,
            ignore_iof_thr=-1),
        sampler=dict(type='PseudoSampler'),
        allowed_border=-1,
        pos_weight=-1,
        debug=False),
    test_cfg=dict(
        nms_pre=1000,
        min_bbox_size=0,
        score_thr=0.05,
        nms=dict(type='nms', iou_threshold=0.5),
        max_per_img=100))
val_evaluator = dict(metric='bbox')
test_evaluator = val_evaluator
