# Table 7, Cityscapes, row SyncBN: DeepLabV3 R50-D8, BN synchronised over
# 8 GPUs x 2 images, random 713x713 crops, 400 epochs (2975 images / 16 per
# batch = 74.4k iterations) of 'poly' LR (power 0.9), auxiliary FCN head with
# loss weight 0.4. Multi-scale testing (--tta) at 1.0, 1.25, 1.5, 1.75 of
# full resolution, as in the paper.
_base_ = [
    '../_base_/models/deeplabv3_r50-d8.py',
    '../_base_/cityscapes-713x713_8xb2-74k.py'
]
model = {{_base_.dataset_model}}
