# Table 6, row SN / SN: ResNet50v1+SN(8,2) finetuned (SN layers learn, they
# are not frozen), SN in FPN, the 4conv1fc box head and the mask head.
# Released SN models are v1 with torchvision-style input, so mmdet's
# 'pytorch' ResNet and RGB mean/std apply.
_base_ = './mask-rcnn_r50-frozen-bn_fpn_sn-head_2x_coco.py'
model = dict(
    backbone=dict(
        style='pytorch',
        norm_cfg={{_base_.head_norm_cfg}},
        norm_eval=False,
        init_cfg=dict(
            type='Pretrained', checkpoint={{_base_.sn_8x2_checkpoint}})))
