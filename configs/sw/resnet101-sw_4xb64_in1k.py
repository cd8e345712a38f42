# ImageNet ResNet-101 with Switchable Whitening: the ResNet-50 config's
# layout and recipe with a deeper backbone, as the release trains it.
_base_ = './resnet50-sw_4xb64_in1k.py'
model = dict(backbone=dict(depth=101))
