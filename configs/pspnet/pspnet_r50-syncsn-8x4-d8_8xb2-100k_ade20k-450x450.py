# ADE20K (the paper reports PSPNet on Cityscapes only), row SyncSN (8,4): as SyncSN (8,2), finetuned from
# ResNet50v1+SN(8,4).
_base_ = [
    '../_base_/models/pspnet_r50-syncsn-8x4-d8.py',
    '../_base_/ade20k-450x450_8xb2-100k.py'
]
model = {{_base_.dataset_model}}
