# Table 4 (setting 1), row BN(frozen) / BN(frozen): Faster R-CNN with a
# ResNet-50 C4 backbone (conv1-4) and conv5 as the RoI head, which keeps its
# own norm layers. The paper's PyTorch protocol: 4 GPUs x 3 images, shorter
# side 600, 80k iterations at LR 0.01 then 40k at 0.001. 'pytorch'-style
# (v1) ResNet with torchvision-style RGB input, like the released SN models.
_base_ = [
    'mmdet::faster_rcnn/faster-rcnn_r50-caffe_c4-1x_coco.py',
    '../_base_/det_runtime.py'
]
backbone_checkpoint = {{_base_.bn_checkpoint}}
model = dict(
    data_preprocessor=dict(
        mean=[123.675, 116.28, 103.53],
        std=[58.395, 57.12, 57.375],
        bgr_to_rgb=True),
    backbone=dict(
        style='pytorch',
        init_cfg=dict(type='Pretrained', checkpoint=backbone_checkpoint)),
    roi_head=dict(
        shared_head=dict(
            style='pytorch',
            init_cfg=dict(type='Pretrained', checkpoint=backbone_checkpoint))))

# The paper's practice (_base_/det_runtime.py) at the LR of 4 GPUs x 3
# images.
optim_wrapper = dict(
    optimizer=dict(lr=0.01),
    constructor='SNOptimWrapperConstructor',
    paramwise_cfg=dict(norm_decay_mult=0., ratio_decay_mult=0.))

train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='LoadAnnotations', with_bbox=True),
    dict(type='Resize', scale=(1000, 600), keep_ratio=True),
    dict(type='RandomFlip', prob=0.5),
    dict(type='PackDetInputs')
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='Resize', scale=(1000, 600), keep_ratio=True),
    dict(type='LoadAnnotations', with_bbox=True),
    dict(
        type='PackDetInputs',
        meta_keys=('img_id', 'img_path', 'ori_shape', 'img_shape',
                   'scale_factor'))
]
train_dataloader = dict(batch_size=3, dataset=dict(pipeline=train_pipeline))
val_dataloader = dict(dataset=dict(pipeline=test_pipeline))
test_dataloader = val_dataloader

max_iters = 120000
train_cfg = dict(
    _delete_=True,
    type='IterBasedTrainLoop',
    max_iters=max_iters,
    val_interval=10000)
param_scheduler = [
    dict(
        type='LinearLR', start_factor=0.001, by_epoch=False, begin=0, end=500),
    dict(
        type='MultiStepLR',
        by_epoch=False,
        begin=0,
        end=max_iters,
        milestones=[80000],
        gamma=0.1)
]
default_hooks = dict(
    checkpoint=dict(type='CheckpointHook', by_epoch=False, interval=10000))
log_processor = dict(by_epoch=False)
auto_scale_lr = dict(enable=False, base_batch_size=12)
