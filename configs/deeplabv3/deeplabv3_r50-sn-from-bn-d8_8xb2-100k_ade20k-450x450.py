# The SN (8,2) row on ADE20K, the backbone started from torchvision's BN
# ResNet-50 instead of the released SN one. No published result.
_base_ = [
    '../_base_/models/deeplabv3_r50-sn-from-bn-d8.py',
    '../_base_/ade20k-450x450_8xb2-100k.py'
]
model = {{_base_.dataset_model}}
