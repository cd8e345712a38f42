# Table 7, Cityscapes, row SN (8,2): ResNet50v1+SN(8,2) finetuned, SN in the backbone
# and both heads; BN statistics per GPU (2 images).
_base_ = [
    '../_base_/models/deeplabv3_r50-sn-8x2-d8.py',
    '../_base_/cityscapes-713x713_8xb2-74k.py'
]
model = {{_base_.dataset_model}}
