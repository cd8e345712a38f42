# Table 5, row SN / SN: ResNet50v1+SN(8,2) finetuned, SN in FPN and the
# 4conv1fc box head.
_base_ = './faster-rcnn_r50-frozen-bn_fpn_sn-head_1x_coco.py'
model = dict(backbone={{_base_.sn_backbone}})
