# ADE20K (the paper reports PSPNet on Cityscapes only), row SN (8,32): as SN (8,2), finetuned from
# ResNet50v1+SN(8,32).
_base_ = [
    '../_base_/models/pspnet_r50-sn-8x32-d8.py',
    '../_base_/ade20k-450x450_8xb2-100k.py'
]
model = {{_base_.dataset_model}}
