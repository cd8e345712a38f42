# Table 4, row BN / BN: the BN ImageNet backbone with its BN layers
# finetuned on 3 images per GPU (not synchronised).
_base_ = './faster-rcnn_r50-frozen-bn-c4_120k_coco.py'
norm_cfg = dict(type='BN', requires_grad=True)
model = dict(
    backbone=dict(norm_cfg=norm_cfg, norm_eval=False),
    roi_head=dict(shared_head=dict(norm_cfg=norm_cfg, norm_eval=False)))
