# Table 6, row BN(frozen) / GN: GN in FPN, the 4conv1fc box head and the
# mask head.
_base_ = './mask-rcnn_r50-frozen-bn_fpn_2x_coco.py'
head_norm_cfg = dict(type='GN', num_groups=32, requires_grad=True)
model = dict(
    neck=dict(norm_cfg=head_norm_cfg),
    roi_head=dict(
        bbox_head=dict(
            type='Shared4Conv1FCBBoxHead',
            conv_out_channels=256,
            norm_cfg=head_norm_cfg),
        mask_head=dict(norm_cfg=head_norm_cfg)))
