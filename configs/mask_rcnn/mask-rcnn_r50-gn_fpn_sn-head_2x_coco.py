# Table 6, row GN / SN: the GN backbone with SN in FPN and heads.
_base_ = './mask-rcnn_r50-gn_fpn_gn-head_2x_coco.py'
# _delete_: replace the parent's GN settings (num_groups) rather than merge.
head_norm_cfg = dict(_delete_=True, type='SN', requires_grad=True)
model = dict(
    neck=dict(norm_cfg=head_norm_cfg),
    roi_head=dict(
        bbox_head=dict(norm_cfg=head_norm_cfg),
        mask_head=dict(norm_cfg=head_norm_cfg)))
