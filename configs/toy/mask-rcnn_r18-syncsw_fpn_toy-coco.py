# Mask R-CNN on a ResNet-18 with SyncSW where the authors' SW ResNets have
# SW (SWResNet: the stem and every other block of stages 1-3), BN elsewhere
# and the first stage frozen, as configs/sw/mask-rcnn_r50-syncsw_fpn_2x_coco.py
# lays it out, on the bundled toy COCO data with the Mask R-CNN demo's data,
# schedule and hooks (its config, which this one inherits). Neck and heads
# without norm layers, as mmdet's. The SW detector of the deployment and
# multi-process checks; on one process SyncSW runs as SW.
_base_ = ['./mask-rcnn_r18-sn_fpn_sn-head_toy-coco.py']
model = dict(
    backbone=dict(
        _delete_=True,
        type='SWResNet',
        depth=18,
        sw_cfg=dict(
            type='SyncSW', sw_type=2, num_pergroup=16, T=5, momentum=0.1),
        norm_cfg=dict(type='BN', requires_grad=True),
        norm_eval=False,
        frozen_stages=1,
        style='pytorch',
        zero_init_residual=False),
    neck=dict(norm_cfg=None),
    roi_head=dict(
        bbox_head=dict(norm_cfg=None), mask_head=dict(norm_cfg=None)))
custom_hooks = [dict(type='SNRatioHook', interval=20, log_layers=False)]
