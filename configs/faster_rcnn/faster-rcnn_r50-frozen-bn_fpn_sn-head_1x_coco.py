# Table 5, row BN(frozen) / SN: SN in FPN and the 4conv1fc box head.
_base_ = './faster-rcnn_r50-frozen-bn_fpn_gn-head_1x_coco.py'
# _delete_: replace the parent's GN settings (num_groups) rather than merge.
head_norm_cfg = dict(_delete_=True, type='SN', requires_grad=True)
model = dict(
    neck=dict(norm_cfg=head_norm_cfg),
    roi_head=dict(bbox_head=dict(norm_cfg=head_norm_cfg)))
