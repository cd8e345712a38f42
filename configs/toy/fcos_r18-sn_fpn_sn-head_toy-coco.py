# FCOS with SN in backbone, FPN and head (FCOS's own head norm is GN) on the
# bundled toy COCO data, with the Mask R-CNN demo's data, schedule and hooks
# (the RetinaNet toy config's, which this one inherits). The head runs one
# stack of convs on all 5 FPN levels: each level keeps its own BN
# statistics (num_levels=5; SNRunner would set it).
_base_ = ['./retinanet_r18-sn_fpn_sn-head_toy-coco.py']
model = dict(
    neck=dict(add_extra_convs='on_output', relu_before_extra_convs=True),
    bbox_head=dict(
        _delete_=True,
        type='FCOSHead',
        num_classes=4,
        in_channels=128,
        stacked_convs=2,
        feat_channels=128,
        strides=[8, 16, 32, 64, 128],
        # Toy objects are 17-60 px: every level's range scaled down.
        regress_ranges=((-1, 32), (32, 64), (64, 128), (128, 256), (256, 1e8)),
        # FCOSHead's own losses (focal, IoU, centerness); its train_cfg
        # is the RetinaNet's, which FCOS's targets do not read.
        norm_cfg=dict(type='SN', num_levels=5, requires_grad=True)))
