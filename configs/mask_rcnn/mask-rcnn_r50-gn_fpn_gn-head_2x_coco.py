# Table 6, row GN / GN: the GN ImageNet backbone (Detectron's, caffe-style
# input: BGR, std 1) finetuned, GN in FPN and heads.
_base_ = './mask-rcnn_r50-frozen-bn_fpn_gn-head_2x_coco.py'
model = dict(
    data_preprocessor={{_base_.gn_data_preprocessor}},
    backbone={{_base_.gn_backbone}})
