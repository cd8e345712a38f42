# PSPNet R101-D8 with SyncSW (the released SW ResNet-101) on Cityscapes, in the
# SN configs' setting: 8 GPUs x 2 images, 713x713 crops, 74k iterations.
_base_ = [
    '../_base_/models/pspnet_r101-syncsw-d8.py',
    '../_base_/cityscapes-713x713_8xb2-74k.py'
]
model = {{_base_.dataset_model}}
