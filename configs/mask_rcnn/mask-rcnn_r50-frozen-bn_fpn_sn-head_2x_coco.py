# Table 6, row BN(frozen) / SN: SN in FPN, the 4conv1fc box head and the
# mask head.
_base_ = './mask-rcnn_r50-frozen-bn_fpn_gn-head_2x_coco.py'
# _delete_: replace the parent's GN settings (num_groups) rather than merge.
head_norm_cfg = dict(_delete_=True, type='SN', requires_grad=True)
model = dict(
    neck=dict(norm_cfg=head_norm_cfg),
    roi_head=dict(
        bbox_head=dict(norm_cfg=head_norm_cfg),
        mask_head=dict(norm_cfg=head_norm_cfg)))
