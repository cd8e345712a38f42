# The paper's Table 6 SN / SN setting with Sparse SN (not a row of the
# paper's tables): finetunes the released ResNet50v1+SSN (8,2), whose layers
# all carry fixed one-hot ratios; FPN and the heads learn sparse ratios with
# SparsestMax, the radius growing from 0 to 1 over training (SSNRadiusHook),
# so every layer ends with one normaliser for the mean and one for the
# variance.
_base_ = './mask-rcnn_r50-sn_fpn_sn-head_2x_coco.py'
ssn_norm_cfg = dict(type='SN', ratio_fn='sparsestmax', requires_grad=True)
model = dict(
    backbone=dict(
        norm_cfg=ssn_norm_cfg,
        init_cfg=dict(checkpoint={{_base_.ssn_8x2_checkpoint}})),
    neck=dict(norm_cfg=ssn_norm_cfg),
    roi_head=dict(
        bbox_head=dict(norm_cfg=ssn_norm_cfg),
        mask_head=dict(norm_cfg=ssn_norm_cfg)))
custom_hooks = [dict(type='SSNRadiusHook')]
