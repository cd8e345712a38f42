# The (8,2) row with Sparse SN (not a row of the paper's tables): finetunes
# the released ResNet50v1+SSN (8,2), whose layers all carry fixed one-hot
# ratios; both heads learn sparse ratios with SparsestMax, the radius growing
# from 0 to 1 over training (SSNRadiusHook). BN statistics per GPU.
_base_ = [
    '../_base_/models/pspnet_r50-ssn-8x2-d8.py',
    '../_base_/ade20k-450x450_8xb2-100k.py'
]
model = {{_base_.dataset_model}}
