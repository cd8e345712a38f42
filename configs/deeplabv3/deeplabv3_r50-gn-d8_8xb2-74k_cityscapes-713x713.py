# Table 7, Cityscapes, row GN: the GN ImageNet backbone (Detectron's: BGR input, std
# 1) finetuned, GN (32 groups) in the backbone and both heads.
_base_ = [
    '../_base_/models/deeplabv3_r50-gn-d8.py',
    '../_base_/cityscapes-713x713_8xb2-74k.py'
]
model = {{_base_.dataset_model}}
