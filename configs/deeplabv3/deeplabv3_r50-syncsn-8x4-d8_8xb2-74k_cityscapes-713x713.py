# Table 7, Cityscapes, row SyncSN (8,4): as SyncSN (8,2), finetuned from
# ResNet50v1+SN(8,4).
_base_ = [
    '../_base_/models/deeplabv3_r50-syncsn-8x4-d8.py',
    '../_base_/cityscapes-713x713_8xb2-74k.py'
]
model = {{_base_.dataset_model}}
