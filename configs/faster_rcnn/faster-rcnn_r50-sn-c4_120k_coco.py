# Table 4, row SN / SN: ResNet50v1+SN(8,2) finetuned, SN in the conv5 head
# (loaded from the same checkpoint's layer4).
_base_ = './faster-rcnn_r50-frozen-bn-c4_120k_coco.py'
norm_cfg = dict(type='SN', requires_grad=True)
backbone_checkpoint = {{_base_.sn_8x2_checkpoint}}
model = dict(
    backbone=dict(
        norm_cfg=norm_cfg,
        norm_eval=False,
        init_cfg=dict(type='Pretrained', checkpoint=backbone_checkpoint)),
    roi_head=dict(
        shared_head=dict(
            norm_cfg=norm_cfg,
            norm_eval=False,
            init_cfg=dict(type='Pretrained', checkpoint=backbone_checkpoint))))
