# Table 7, ADE20K, row SyncBN: DeepLabV3 R50-D8, BN synchronised over
# 8 GPUs x 2 images, 450x450 crops, 100k iterations of 'poly' LR (power 0.9),
# auxiliary FCN head with loss weight 0.4. Multi-scale testing (--tta) at
# shorter sides 300, 400, 500, 600, as in the paper.
_base_ = [
    '../_base_/models/deeplabv3_r50-d8.py',
    '../_base_/ade20k-450x450_8xb2-100k.py'
]
model = {{_base_.dataset_model}}
