# Table 5, row GN / GN: the GN ImageNet backbone (Detectron's, caffe-style
# input: BGR, std 1) finetuned, GN in FPN and the box head.
_base_ = './faster-rcnn_r50-frozen-bn_fpn_gn-head_1x_coco.py'
model = dict(
    data_preprocessor={{_base_.gn_data_preprocessor}},
    backbone={{_base_.gn_backbone}})
