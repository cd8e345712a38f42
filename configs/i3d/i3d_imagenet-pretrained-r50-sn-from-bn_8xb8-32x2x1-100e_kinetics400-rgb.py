# Table 10's SN row started from torchvision's BN ResNet-50 instead of the
# released SN model (no published result): each SN layer takes its BN
# layer's affine parameters and running statistics, its ratio logits start
# equal (the paper's initialisation), as SNPretrained starts 2D networks.
_base_ = './i3d_imagenet-pretrained-r50-sn_8xb8-32x2x1-100e_kinetics400-rgb.py'
model = dict(
    backbone=dict(pretrained={{_base_.bn_checkpoint}}, ratios='uniform'))
