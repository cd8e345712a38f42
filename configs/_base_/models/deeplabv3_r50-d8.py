# mmseg's DeepLabV3 R50-D8 (output stride 8: dilations (1, 1, 2, 4), strides
# (1, 2, 1, 1)) on mmseg's plain-stem `ResNet` instead of `ResNetV1c`, so the
# released ResNet50v1+SN checkpoints (7x7 stem) load strictly. This row:
# SyncBN from torchvision's ImageNet model.
_base_ = ['mmseg::_base_/models/deeplabv3_r50-d8.py', '../sn_runtime.py']
norm_cfg = dict(type='SyncBN', requires_grad=True)
backbone_checkpoint = {{_base_.bn_checkpoint}}
model = dict(
    pretrained=None,
    backbone=dict(
        type='ResNet',
        contract_dilation=False,
        norm_cfg=norm_cfg,
        init_cfg=dict(type='Pretrained', checkpoint=backbone_checkpoint)),
    decode_head=dict(norm_cfg=norm_cfg),
    auxiliary_head=dict(norm_cfg=norm_cfg))
