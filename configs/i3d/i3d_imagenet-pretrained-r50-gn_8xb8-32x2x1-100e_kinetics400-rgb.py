# Table 10, GN row, 8 clips per GPU: GN(32) in every norm layer, inflated
# from Detectron's ImageNet GN ResNet-50 (mmdet's GN starting point), whose
# caffe-style input (BGR, std 1) the data preprocessor gives. mmaction2's own
# inflation handles BN only; InflatedResNet3d (sn_mm.video) inflates any
# norm layer.
_base_ = './i3d_imagenet-pretrained-r50-bn_8xb8-32x2x1-100e_kinetics400-rgb.py'
model = dict(
    backbone=dict(
        type='InflatedResNet3d',
        pretrained={{_base_.gn_checkpoint}},
        norm_cfg=dict(type='GN', num_groups=32, requires_grad=True)),
    data_preprocessor=dict(
        mean=[103.530, 116.280, 123.675], std=[1.0, 1.0, 1.0], to_rgb=True))
