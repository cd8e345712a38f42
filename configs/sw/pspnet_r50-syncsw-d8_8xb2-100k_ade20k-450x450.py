# PSPNet R50-D8 with SyncSW (the released SW ResNet-50) on ADE20K, in the
# SN configs' setting: 8 GPUs x 2 images, 450x450 crops, 100k iterations.
_base_ = [
    '../_base_/models/pspnet_r50-syncsw-d8.py',
    '../_base_/ade20k-450x450_8xb2-100k.py'
]
model = {{_base_.dataset_model}}
