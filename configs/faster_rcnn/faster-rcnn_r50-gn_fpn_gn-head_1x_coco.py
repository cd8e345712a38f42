# Table 5, row GN / GN: the GN ImageNet backbone (Detectron's, caffe-style
# input: BGR, std 1) finetuned, GN in FPN and the box head.
_base_ = './faster-rcnn_r50-frozen-bn_fpn_gn-head_1x_coco.py'
model = dict(
    data_preprocessor=dict(
        mean=[103.530, 116.280, 123.675], std=[1.0, 1.0, 1.0],
        bgr_to_rgb=False),
    backbone=dict(
        norm_cfg={{_base_.head_norm_cfg}},
        norm_eval=False,
        init_cfg=dict(type='Pretrained', checkpoint={{_base_.gn_checkpoint}})))
