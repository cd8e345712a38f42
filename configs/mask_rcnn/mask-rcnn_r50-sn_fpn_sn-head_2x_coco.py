# Table 6, row SN / SN: ResNet50v1+SN(8,2) finetuned (SN layers learn, they
# are not frozen), SN in FPN, the 4conv1fc box head and the mask head.
_base_ = './mask-rcnn_r50-frozen-bn_fpn_sn-head_2x_coco.py'
model = dict(backbone={{_base_.sn_backbone}})
