# Table 6's SN / SN row, its backbone started from torchvision's BN
# ResNet-50 instead of the released SN (8,2) one, for a start without the
# released files: SNPretrained gives each SN layer its BN layer's affine and
# running statistics; the ratio logits start equal. No published result.
_base_ = './mask-rcnn_r50-sn_fpn_sn-head_2x_coco.py'
model = dict(
    backbone=dict(
        init_cfg=dict(
            _delete_=True,
            type='SNPretrained',
            checkpoint={{_base_.bn_checkpoint}},
            ratios='uniform')))
