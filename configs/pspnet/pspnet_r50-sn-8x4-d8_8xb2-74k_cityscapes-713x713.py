# Table 8, Cityscapes, row SN (8,4): as SN (8,2), finetuned from
# ResNet50v1+SN(8,4).
_base_ = [
    '../_base_/models/pspnet_r50-sn-8x4-d8.py',
    '../_base_/cityscapes-713x713_8xb2-74k.py'
]
model = {{_base_.dataset_model}}
