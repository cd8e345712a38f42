# PSPNet R50-D8 in the same setting as DeepLabV3 (Table 8 reports it on
# Cityscapes). Its pyramid pooling has a 1x1 bin: with SN there, one spatial
# position leaves IN undefined, so those SN layers mix LN and BN only (see
# SwitchableNorm) -- never a NaN.
_base_ = [
    '../_base_/models/pspnet_r50-d8.py',
    '../_base_/cityscapes-713x713_8xb2-74k.py'
]
model = {{_base_.dataset_model}}
