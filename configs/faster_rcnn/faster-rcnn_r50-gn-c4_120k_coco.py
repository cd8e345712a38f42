# Table 4, row GN / GN: the GN ImageNet backbone (Detectron's: stride on the
# 3x3 conv, BGR input with std 1) finetuned, GN in the conv5 head.
_base_ = './faster-rcnn_r50-frozen-bn-c4_120k_coco.py'
norm_cfg = dict(type='GN', num_groups=32, requires_grad=True)
backbone_checkpoint = {{_base_.gn_checkpoint}}
model = dict(
    data_preprocessor=dict(
        mean=[103.530, 116.280, 123.675],
        std=[1.0, 1.0, 1.0],
        bgr_to_rgb=False),
    backbone=dict(
        norm_cfg=norm_cfg,
        norm_eval=False,
        init_cfg=dict(type='Pretrained', checkpoint=backbone_checkpoint)),
    roi_head=dict(
        shared_head=dict(
            norm_cfg=norm_cfg,
            norm_eval=False,
            init_cfg=dict(type='Pretrained', checkpoint=backbone_checkpoint))))
